"""Shared helpers for the runtime index tests: records, a loopback HTTP asset server, loop polling."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from warren.runtime.records import Asset, RuntimeRecord


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record(tag: str = "a", *, sandbox_class: str = "gvisor", options: dict[str, str] | None = None) -> RuntimeRecord:
    data = f"runsc-{tag}".encode()
    return RuntimeRecord(
        sandbox_class=sandbox_class,  # type: ignore[arg-type]
        assets={"runsc": Asset(url=f"https://example.invalid/{tag}/runsc", sha256=sha(data))},
        options=options or {},
    )


async def until(predicate: Callable[[], bool], *, turns: int = 10_000) -> None:
    """Yield to the loop until ``predicate`` holds (no wall-clock sleeping)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def leftovers(root: Path) -> list[str]:
    """Every file under ``root`` (temp files included), relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class AssetServer:
    """A real HTTP server on 127.0.0.1 serving fixed bodies, counting GETs, optionally held at a gate."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.send_length = True
        self.gets: Counter[str] = Counter()
        self.gate = threading.Event()
        self.gate.set()
        self.got_request = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.gets[self.path] += 1
                server.got_request.set()
                server.gate.wait(10)
                body = server.bodies.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                if server.send_length:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @contextmanager
    def running(self) -> Iterator[AssetServer]:
        self._thread.start()
        try:
            yield self
        finally:
            self.gate.set()
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(5)
