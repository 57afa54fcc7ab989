"""A small HTTP/1.1 server on asyncio streams.

What the envd traffic needs and no more: request bodies with Content-Length or chunked
transfer-encoding (streamed to the handler, never buffered whole), fixed-length and chunked streaming
responses, keep-alive with an idle timeout, ``Connection: close``, ``Expect: 100-continue``, and
target paths with a doubled leading slash (``//process.Process/Start``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, unquote

log = logging.getLogger("warren.guest")

MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers; envd's clients send well under 2 KiB."""
IDLE_TIMEOUT_S = 90.0
"""A keep-alive connection with no request for this long is closed (the host pools for less)."""
DRAIN_LIMIT = 1 << 20
"""An unread request body up to this size is skipped to keep the connection; larger ones close it."""
READ_SIZE = 64 * 1024
LINGER_S = 2.0
"""How long a connection closed with an unread request body keeps discarding it."""

_REASONS = {
    100: "Continue",
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    408: "Request Timeout",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    507: "Insufficient Storage",
}


class BadRequest(Exception):
    """The peer sent something that is not HTTP/1.1 we can parse; the connection is closed."""


class Connection:
    """One accepted TCP connection: a byte buffer over the stream reader, and the writer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False
        self._out = bytearray()
        self._flush_scheduled = False

    def send_soon(self, data: bytes) -> None:
        """Queue ``data``: what is queued in one loop turn leaves in one write (one TCP segment).

        A command's last output, its end event and the end of the stream are produced together;
        sent together they cost the agent, the node and the client one wake-up instead of three.
        """
        self._out += data
        if len(self._out) >= READ_SIZE:
            self.flush()  # a burst of output: write now, so that drain() sees it and pushes back
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write what ``send_soon`` queued, now."""
        if self._out:
            data = bytes(self._out)
            self._out.clear()
            if not self.writer.is_closing():
                self.writer.write(data)

    async def _fill(self) -> bool:
        if self.eof:
            return False
        data = await self.reader.read(READ_SIZE)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def read_until(self, sep: bytes, limit: int) -> bytes | None:
        """Bytes up to and including ``sep``; None on EOF before any byte; BadRequest past ``limit``."""
        start = 0
        while True:
            idx = self.buf.find(sep, start)
            if idx >= 0:
                end = idx + len(sep)
                out = bytes(self.buf[:end])
                del self.buf[:end]
                return out
            if len(self.buf) > limit:
                raise BadRequest("header section too large")
            start = max(0, len(self.buf) - len(sep) + 1)
            if not await self._fill():
                if self.buf:
                    raise ConnectionError("connection closed mid-request")
                return None

    async def read_some(self, n: int) -> bytes:
        """Up to ``n`` (> 0) bytes, at least one; ConnectionError on EOF."""
        if not self.buf and not await self._fill():
            raise ConnectionError("connection closed mid-body")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not await self._fill():
                raise ConnectionError("connection closed mid-body")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def wait_peer_closed(self) -> None:
        """Return when the peer closes the connection. Only call once the request body is read.

        Bytes that arrive meanwhile (a pipelined request) are kept for the next request.
        """
        while not self.eof:
            if len(self.buf) > DRAIN_LIMIT:
                await asyncio.Event().wait()
            await self._fill()


class Body:
    """A request body, read in chunks as the handler asks for them."""

    def __init__(self, conn: Connection, *, length: int | None, chunked: bool, expect_continue: bool) -> None:
        self._conn = conn
        self._left = length or 0
        self._chunked = chunked
        self._chunk_left = 0
        self._chunk_crlf = False
        self._continue = expect_continue
        self.complete = not chunked and not self._left
        self.received = 0

    async def _send_continue(self) -> None:
        self._continue = False
        self._conn.flush()
        self._conn.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await self._conn.writer.drain()

    async def read(self, n: int = READ_SIZE) -> bytes:
        """The next piece of the body (at most ``n`` bytes); b"" once it is complete."""
        if self.complete:
            return b""
        if self._continue:
            await self._send_continue()
        if not self._chunked:
            data = await self._conn.read_some(min(n, self._left))
            self._left -= len(data)
            if not self._left:
                self.complete = True
            self.received += len(data)
            return data
        while not self._chunk_left:
            if self._chunk_crlf:
                if await self._conn.read_exact(2) != b"\r\n":
                    raise BadRequest("bad chunk terminator")
                self._chunk_crlf = False
            line = await self._conn.read_until(b"\r\n", 4096)
            if line is None:
                raise ConnectionError("connection closed mid-body")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise BadRequest("bad chunk size") from exc
            if size < 0:
                raise BadRequest("bad chunk size")
            if size == 0:
                while True:
                    trailer = await self._conn.read_until(b"\r\n", MAX_HEAD_BYTES)
                    if trailer is None or trailer == b"\r\n":
                        break
                self.complete = True
                return b""
            self._chunk_left = size
        data = await self._conn.read_some(min(n, self._chunk_left))
        self._chunk_left -= len(data)
        if not self._chunk_left:
            self._chunk_crlf = True
        self.received += len(data)
        return data

    async def read_all(self, limit: int) -> bytes:
        """The whole body; ``BodyTooLarge`` past ``limit`` bytes."""
        parts = bytearray()
        while True:
            data = await self.read()
            if not data:
                return bytes(parts)
            parts += data
            if len(parts) > limit:
                raise BodyTooLarge(limit)

    async def drain(self, limit: int) -> bool:
        """Skip the rest of the body; False if more than ``limit`` bytes remain (close instead)."""
        if self._continue:
            return False  # the client still waits for "100 Continue": it has sent no body
        skipped = 0
        while not self.complete:
            if skipped > limit:
                return False
            skipped += len(await self.read())
        return True


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")


class Request:
    """A parsed request head plus its streamed body."""

    def __init__(
        self,
        conn: Connection,
        method: str,
        target: str,
        version: str,
        headers: dict[str, str],
        body: Body,
    ) -> None:
        self.conn = conn
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.body = body
        raw_path, _, raw_query = target.partition("?")
        if raw_path.startswith(("http://", "https://")):
            slash = raw_path.find("/", raw_path.find("//") + 2)
            raw_path = raw_path[slash:] if slash >= 0 else "/"
        self.path = "/" + unquote(raw_path).lstrip("/")
        self.query: dict[str, str] = {}
        for key, value in parse_qsl(raw_query, keep_blank_values=True):
            self.query.setdefault(key, value)

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


class Response:
    """Writes one response: either ``send`` (fixed length) or ``start`` + ``write``* + ``end``."""

    def __init__(self, conn: Connection, request: Request | None, keep_alive: bool) -> None:
        self._conn = conn
        self._head_only = request is not None and request.method == "HEAD"
        self._http11 = request is None or request.version == "HTTP/1.1"
        self.keep_alive = keep_alive
        self.started = False
        self.finished = False
        self._chunked = False
        self._pending_head = b""
        self.status = 0

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        self.status = status
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        lines.append("Connection: keep-alive" if self.keep_alive else "Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(
        self,
        status: int,
        body: bytes = b"",
        *,
        content_type: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """Send a complete response in one write."""
        assert not self.started, "response already started"
        hdrs = list(headers or [])
        if content_type:
            hdrs.append(("Content-Type", content_type))
        if status not in (204, 304) and status >= 200:
            hdrs.append(("Content-Length", str(len(body))))
        else:
            body = b""
        self.started = True
        payload = self._head(status, hdrs)
        if not self._head_only:
            payload += body
        self._conn.flush()
        self._conn.writer.write(payload)
        self.finished = True
        await self._conn.writer.drain()

    async def send_json(self, status: int, obj: object, headers: list[tuple[str, str]] | None = None) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        await self.send(status, body, content_type="application/json", headers=headers)

    async def send_error(self, status: int, message: str) -> None:
        """envd's plain-HTTP error body: ``{"message", "code"}``."""
        await self.send_json(status, {"message": message, "code": status})

    async def start(
        self, status: int, headers: list[tuple[str, str]] | None = None, *, length: int | None = None
    ) -> None:
        """Send the head of a streamed response: ``length`` bytes will follow, else chunked."""
        assert not self.started, "response already started"
        hdrs = list(headers or [])
        if length is not None:
            hdrs.append(("Content-Length", str(length)))
        elif self._http11:
            hdrs.append(("Transfer-Encoding", "chunked"))
            self._chunked = True
        else:
            self.keep_alive = False
        self.started = True
        # The head goes out with the first piece of body, in one segment.
        self._pending_head = self._head(status, hdrs)

    async def write(self, data: bytes) -> None:
        if not data or self._head_only:
            return
        if self._chunked:
            data = b"%x\r\n" % len(data) + data + b"\r\n"
        self._conn.send_soon(self._pending_head + data)
        self._pending_head = b""
        await self._conn.writer.drain()

    async def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        tail = b"0\r\n\r\n" if self._chunked and not self._head_only else b""
        self._conn.send_soon(self._pending_head + tail)
        self._conn.flush()
        self._pending_head = b""
        await self._conn.writer.drain()


Handler = Callable[[Request, Response], Awaitable[None]]


def _parse_head(raw: bytes) -> tuple[str, str, str, dict[str, str]]:
    text = raw.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:80]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest("bad header line")
        key = name.lower()
        value = value.strip()
        if key in headers:
            headers[key] = f"{headers[key]}, {value}"
        else:
            headers[key] = value
    return method, target, version, headers


def _wants_keep_alive(version: str, headers: dict[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens


class HttpServer:
    """Serves connections with ``handler``; tracks them so ``close_all`` can end them at shutdown."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._writers: set[asyncio.StreamWriter] = set()

    def close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        conn = Connection(reader, writer)
        try:
            await self._serve(conn)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except BadRequest as exc:
            try:
                await Response(conn, None, False).send_error(400, str(exc))
            except ConnectionError:
                pass
        except Exception:
            log.exception("connection failed")
        finally:
            conn.flush()
            self._writers.discard(writer)
            writer.close()

    async def _serve(self, conn: Connection) -> None:
        while True:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                raw = await conn.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
            if raw is None:
                return
            method, target, version, headers = _parse_head(raw.lstrip(b"\r\n"))
            chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            length = 0
            if not chunked:
                try:
                    length = int(headers.get("content-length", "0") or "0")
                except ValueError as exc:
                    raise BadRequest("bad Content-Length") from exc
                if length < 0:
                    raise BadRequest("bad Content-Length")
            expect_continue = version == "HTTP/1.1" and headers.get("expect", "").lower() == "100-continue"
            body = Body(conn, length=length, chunked=chunked, expect_continue=expect_continue)
            request = Request(conn, method, target, version, headers, body)
            response = Response(conn, request, _wants_keep_alive(version, headers))
            try:
                await self._handler(request, response)
            except (ConnectionError, BadRequest):
                raise
            except Exception:
                log.exception("handler failed for %s %s", method, request.path)
                if response.started:
                    return
                response.keep_alive = False
                await response.send_error(500, "internal error")
                return
            if not response.finished:
                if not response.started:
                    await response.send_error(500, "handler sent no response")
                return
            if not body.complete and (not response.keep_alive or not await body.drain(DRAIN_LIMIT)):
                await self._linger(conn)
                return
            if not response.keep_alive or conn.eof:
                return

    @staticmethod
    async def _linger(conn: Connection) -> None:
        """Close after a response sent before the request body was read: half-close, then discard
        what the client still sends for a moment, so our response is not lost to a TCP reset."""
        try:
            conn.flush()
            if conn.writer.can_write_eof():
                conn.writer.write_eof()
            async with asyncio.timeout(LINGER_S):
                while await conn.reader.read(READ_SIZE):
                    pass
        except (OSError, TimeoutError):
            pass
