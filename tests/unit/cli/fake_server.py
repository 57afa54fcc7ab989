"""A tiny scripted HTTP server on loopback: the CLI talks to it exactly as to a warren node.

Routes map ``(method, path)`` to a ``Reply`` (or a function of the ``Request`` returning one);
every request is recorded. ``connect_json_stream`` builds Connect-protocol stream bodies, so the
unmodified E2B SDK can run a command against it too.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """JSON-encoded unless it is bytes."""
    headers: dict[str, str] = field(default_factory=dict)


Route = Reply | Callable[[Request], Reply]


class FakeServer:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Route] = {}
        self.requests: list[Request] = []
        self.url = ""

    def route(self, method: str, path: str, reply: Route) -> None:
        self.routes[(method, path)] = reply

    def requests_to(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if (r.method, r.path) == (method, path)]

    def handle(self, request: Request) -> Reply:
        self.requests.append(request)
        route = self.routes.get((request.method, request.path))
        if route is None:
            return Reply(404, {"code": 404, "message": f"no route {request.method} {request.path}"})
        return route(request) if callable(route) else route


def _handler_class(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            request = Request(
                method=self.command,
                path=parts.path,
                query=parse_qs(parts.query),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=self._read_body(),
            )
            reply = server.handle(request)
            if isinstance(reply.body, bytes):
                payload = reply.body
                content_type = reply.headers.get("Content-Type", "application/octet-stream")
            elif reply.body is None:
                payload, content_type = b"", "application/json"
            else:
                payload, content_type = json.dumps(reply.body).encode(), "application/json"
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                if key.lower() != "content-type":
                    self.send_header(key, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        do_GET = do_POST = do_DELETE = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving() -> Iterator[FakeServer]:
    fake = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(fake))
    httpd.daemon_threads = True
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-warren", daemon=True
    )
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def connect_json_stream(*messages: dict[str, Any]) -> bytes:
    """A Connect server-stream body: one JSON envelope per message, then the end-of-stream envelope."""
    out = b""
    for message in messages:
        data = json.dumps(message).encode()
        out += struct.pack(">BI", 0, len(data)) + data
    return out + struct.pack(">BI", 2, 2) + b"{}"


def process_events(stdout: bytes, exit_code: int) -> bytes:
    """The envd ``process.Process/Start`` stream of a command that prints ``stdout`` and exits."""
    end: dict[str, Any] = {"exited": True, "status": f"exit status {exit_code}"}
    if exit_code:
        end["exitCode"] = exit_code
    return connect_json_stream(
        {"event": {"start": {"pid": 42}}},
        {"event": {"data": {"stdout": base64.b64encode(stdout).decode()}}},
        {"event": {"end": end}},
    )
