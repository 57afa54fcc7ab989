"""The proxy's HTTP/1.1 hop to a port inside a sandbox: asyncio protocols, httptools, kept-alive
connections pooled per sandbox.

The hop is on every ``commands.run`` and file call, so it is kept to what it needs: one write for
the request head (and one per body piece), the response head parsed in C, body pieces handed on as
they arrive. A connection goes back to its sandbox's pool only after a complete exchange; anything
else ends it with a reset (SO_LINGER 0), so nothing lingers in TIME_WAIT inside the sandbox.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import cast

import httptools

RESET_ON_CLOSE = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: connections to a sandbox end with a reset, leaving nothing in TIME_WAIT inside it."""
CONNECT_TIMEOUT_S = 5.0
KEEPALIVE_EXPIRY_S = 30.0
"""An idle pooled connection older than this is closed, not reused (the agent keeps them 90 s)."""
_PAUSE_READING_AT = 1 << 20
"""Response bytes queued for the client before the hop stops reading from the sandbox."""


class UpstreamError(Exception):
    """The exchange with the sandbox failed (it closed, reset, or sent what is not HTTP)."""


class UpstreamConnectError(UpstreamError):
    """Nothing accepted the connection: the port is not open in the sandbox."""


_EOF = b""


class UpstreamConnection(asyncio.Protocol):
    """One TCP connection to a sandbox port; parses one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._writable = asyncio.Event()
        self._writable.set()
        self._reset_exchange()

    def _reset_exchange(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._arrived = asyncio.Event()
        self._error: UpstreamError | None = None
        self._complete = False
        self._framed = False
        self._informational = False
        self._reading_paused = False
        self.answered = False
        """Some of a response arrived: the request reached the sandbox, it is not sent again."""
        self.keep_alive = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad response from the sandbox: {exc}"))
            self.abort()

    def eof_received(self) -> bool:
        self.closed = True
        if self.head.done() and not self._complete and not self._framed:
            self._complete = True  # a body delimited by the end of the connection
            self._arrived.set()
        else:
            self._fail(UpstreamError("the sandbox closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        self._fail(UpstreamError(f"the connection to the sandbox was lost: {exc or 'closed'}"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._informational = True  # "100 Continue" and the like: the final response follows
            self.headers = []
            return
        self.status = status
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
                self._framed = True
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._queued += len(body)
        if self._queued > _PAUSE_READING_AT and self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._arrived.set()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._arrived.set()

    # the exchange

    def _fail(self, error: UpstreamError) -> None:
        if self._complete:
            return
        if self._error is None:
            self._error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: the sender may be gone already
        self._arrived.set()

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamError("the connection to the sandbox is closed")
        self.transport.write(data)

    async def drain(self) -> None:
        await self._writable.wait()
        if self.closed:
            raise UpstreamError("the connection to the sandbox is closed")

    async def body(self) -> AsyncIterator[tuple[bytes, bool]]:
        """The response body as it arrives, in pieces that say whether they are the last one;
        UpstreamError if the exchange breaks off. What arrived together is handed on together."""
        while True:
            if self._chunks:
                piece = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks.clear()
                self._queued = 0
                if self._reading_paused and self.transport is not None and not self.closed:
                    self._reading_paused = False
                    self.transport.resume_reading()
                yield piece, self._complete
                continue
            if self._complete:
                return
            if self._error is not None:
                raise self._error
            self._arrived.clear()
            await self._arrived.wait()

    @property
    def reusable(self) -> bool:
        return self._complete and self.keep_alive and not self.closed and not self._chunks

    def recycle(self) -> None:
        self._reset_exchange()
        self.idle_since = time.monotonic()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class SandboxPool:
    """The connections to one sandbox: idle ones by address, and every one that is open."""

    def __init__(self, max_keepalive: int) -> None:
        self._max_keepalive = max_keepalive
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self._open: set[UpstreamConnection] = set()

    async def acquire(self, host: str, port: int) -> tuple[UpstreamConnection, bool]:
        """A connection to ``host:port``, and whether it is a pooled one (it may have gone stale)."""
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_EXPIRY_S:
                return conn, True
            self.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, conn = await loop.create_connection(UpstreamConnection, host, port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectError(str(exc) or type(exc).__name__) from None
        self._open.add(conn)
        return conn, False

    def release(self, conn: UpstreamConnection, host: str, port: int) -> None:
        """Pool ``conn`` after an exchange if it can carry another; otherwise end it."""
        idle = self._idle.setdefault((host, port), [])
        if conn.reusable and len(idle) < self._max_keepalive:
            conn.recycle()
            idle.append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: UpstreamConnection) -> None:
        conn.abort()
        self._open.discard(conn)

    def close(self) -> None:
        """Reset every connection, idle or in use (their exchanges fail with UpstreamError)."""
        for conn in list(self._open):
            conn.abort()
        self._open.clear()
        self._idle.clear()


async def exchange(
    conn: UpstreamConnection,
    method: str,
    target: bytes,
    host_header: bytes,
    headers: list[tuple[bytes, bytes]],
    body: AsyncIterator[bytes] | None,
) -> None:
    """Send one request on ``conn`` and wait for the response head (then read ``conn.body()``).

    Without a Content-Length among ``headers``, a body is sent chunked.
    """
    sized = any(k.lower() == b"content-length" for k, _ in headers)
    chunked = body is not None and not sized
    head = [method.encode("latin-1"), b" ", target, b" HTTP/1.1\r\nhost: ", host_header, b"\r\n"]
    for key, value in headers:
        head += [key, b": ", value, b"\r\n"]
    if chunked:
        head.append(b"transfer-encoding: chunked\r\n")
    head.append(b"\r\n")
    conn.write(b"".join(head))
    if body is not None:
        async for piece in body:
            conn.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            await conn.drain()
        if chunked:
            conn.write(b"0\r\n\r\n")
    await conn.head
