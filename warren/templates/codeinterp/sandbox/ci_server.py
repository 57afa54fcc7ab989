"""The code-interpreter server on port 49999: the protocol of the ``e2b-code-interpreter`` SDK.

Runs inside the sandbox (the template's start command) with the template's venv; never imported by warren.

    GET    /health                   200 once the default python context's kernel is up
    POST   /execute                  {code, context_id?, language?, env_vars?} -> NDJSON, one record a line
    POST   /contexts                 {language?, cwd?} -> {id, language, cwd}
    GET    /contexts                 [{id, language, cwd}, ...]
    DELETE /contexts/{id}            204
    POST   /contexts/{id}/restart    204

Env vars of an execution are the sandbox's (``GET /envs`` of the guest agent on 49983, with the caller's
access token) overlaid by the call's ``env_vars``; they hold for that execution only.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ci_kernels import ContextError, Contexts

PORT = int(os.environ.get("WARREN_CI_PORT", "49999"))
AGENT_ENVS_URL = "http://127.0.0.1:49983/envs"
MAX_BODY = 64 << 20

log = logging.getLogger("code-interpreter")
CONTEXTS = Contexts(default_cwd=os.environ.get("WARREN_CI_CWD", os.path.expanduser("~")))
READY = threading.Event()


_ENVS: dict[str, dict[str, str]] = {}
"""The sandbox's env vars by access token: they are fixed at create, so one ask per token suffices (a
sandbox restored from the template's memory snapshot asks after its create, never before)."""


def sandbox_envs(token: str | None) -> dict[str, str]:
    """The sandbox's env vars from the guest agent (empty when it cannot say)."""
    cached = _ENVS.get(token or "")
    if cached is not None:
        return cached
    request = urllib.request.Request(AGENT_ENVS_URL, headers={"X-Access-Token": token} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            data = json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return {}
    if not isinstance(data, dict):
        return {}
    envs = {str(k): str(v) for k, v in data.items()}
    _ENVS[token or ""] = envs
    return envs


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small NDJSON chunks must not wait for a delayed ACK (40 ms)
    server_version = "warren-code-interpreter/1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ plumbing

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ContextError(413, "request body too large")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ContextError(400, f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise ContextError(400, "the body must be a JSON object")
        return body

    def _send(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, status: int, message: str) -> None:
        self._send(status, {"error": message, "message": message})

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        try:
            if method == "GET" and path == "/health":
                self._send(200 if READY.is_set() else 503, "OK" if READY.is_set() else "starting")
            elif method == "POST" and path == "/execute":
                self._execute(self._body())
            elif method == "POST" and path == "/contexts":
                body = self._body()
                language, cwd = body.get("language"), body.get("cwd")
                if (language is not None and not isinstance(language, str)) or (cwd is not None and not isinstance(
                    cwd, str
                )):
                    raise ContextError(400, "language and cwd must be strings")
                self._send(200, CONTEXTS.create(language, cwd).describe())
            elif method == "GET" and path == "/contexts":
                self._send(200, CONTEXTS.list())
            elif method == "DELETE" and len(parts) == 2 and parts[0] == "contexts":
                CONTEXTS.remove(parts[1])
                self._send(204)
            elif method == "POST" and len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
                CONTEXTS.get(parts[1]).restart()
                self._send(204)
            else:
                self._fail(404, f"no route for {method} {path}")
        except ContextError as exc:
            self._fail(exc.status, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            log.exception("%s %s failed", method, path)
            self._fail(500, f"{type(exc).__name__}: {exc}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ------------------------------------------------------------------ /execute

    def _execute(self, body: dict[str, Any]) -> None:
        code, context_id, language = body.get("code"), body.get("context_id"), body.get("language")
        env_vars = body.get("env_vars") or {}
        if not isinstance(code, str):
            raise ContextError(400, "code must be a string")
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise ContextError(400, "env_vars must be an object of strings")
        if context_id and language:
            raise ContextError(400, "give context_id or language, not both")
        if context_id:
            context = CONTEXTS.get(str(context_id))
        else:
            context = CONTEXTS.default_for(str(language or "python"))
        envs = {**sandbox_envs(self.headers.get("X-Access-Token")), **{str(k): v for k, v in env_vars.items()}}
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        alive = [True]

        def emit(record: dict[str, Any]) -> bool:
            if not alive[0]:
                return False
            line = json.dumps(record).encode() + b"\n"
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            except OSError:
                alive[0] = False
            return alive[0]

        def gone() -> bool:
            """The client closed the connection (nothing more to read, EOF)."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        context.execute(code, envs, emit, gone)
        if alive[0]:
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True
        else:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = Server(("0.0.0.0", PORT), Handler)
    CONTEXTS.start_default()  # the kernel is up before /health answers 200 (the ready command)
    READY.set()
    log.info("code interpreter listening on %d", PORT)
    server.serve_forever()


if __name__ == "__main__":
    main()
