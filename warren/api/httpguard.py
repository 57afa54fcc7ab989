"""The HTTP server's own limits on uvicorn's protocol: a request-head timeout and a concurrency cap.

uvicorn (httptools or h11) arms no timer while it waits for a request head: its keep-alive timeout
runs only after a response, and any byte that arrives cancels it. A client that sends part of a
request line and never finishes (slow loris) holds a descriptor for as long as it likes, and
``h11_max_incomplete_event_size`` only bounds the size of a head, not its duration. Its
``limit_concurrency`` answers 503 with a text body. The protocol built here:

* closes a connection that has not completed a request head ``header_timeout_s`` after it was
  accepted, or after the first byte of its next request on a kept-alive connection (an idle
  kept-alive connection stays governed by uvicorn's ``timeout_keep_alive``); a request whose head is
  complete (a long upload, a streaming command, a websocket) is never cut by it;
* answers 503 ``{code, message}`` with ``Connection: close`` while more than ``max_concurrency``
  connections are open or requests are running (the accounting of ``limit_concurrency``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

try:
    import httptools  # noqa: F401  (uvicorn's choice when it is installed)
except ImportError:  # pragma: no cover
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base
else:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base  # type: ignore[assignment]


class _ConcurrencyGate:
    """503 ``{code, message}`` while the server holds more than ``limit`` connections or running requests."""

    def __init__(self, app: ASGIApp, server_state: Any, limit: int) -> None:
        self._app = app
        self._state = server_state
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The connection and the task serving this request are in the counts already.
        if scope["type"] == "http" and (
            len(self._state.connections) > self._limit or len(self._state.tasks) > self._limit
        ):
            body = json.dumps(
                {
                    "code": 503,
                    "message": f"the node is serving too many connections (limit {self._limit}, "
                    "WARREN_HTTP_MAX_CONCURRENCY); retry later",
                }
            ).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"retry-after", b"1"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self._app(scope, receive, send)


class GuardedHttpProtocol(_Base):
    """uvicorn's HTTP/1.1 protocol with a request-head deadline and a JSON 503 concurrency cap."""

    header_timeout_s: float = 10.0
    max_concurrency: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_cycle: object | None = None
        if self.max_concurrency:
            self.app = _ConcurrencyGate(self.app, self.server_state, self.max_concurrency)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._between_requests():
            self._arm_head_timer()  # the first byte of a new request on a kept-alive connection
        super().data_received(data)
        upgraded = self.transport.get_protocol() is not self  # a websocket took the connection over
        if self._head_timer is not None and (self.cycle is not self._head_cycle or upgraded):
            self._disarm_head_timer()  # a request head is complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_cycle = self.cycle
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.cycle is self._head_cycle and self.transport.get_protocol() is self and not self.transport.is_closing():
            self.transport.close()


def guarded_http_protocol(header_timeout_s: float, max_concurrency: int | None) -> type[GuardedHttpProtocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)``."""
    return type(
        "WarrenHttpProtocol",
        (GuardedHttpProtocol,),
        {"header_timeout_s": header_timeout_s, "max_concurrency": max_concurrency or None},
    )


__all__ = ["GuardedHttpProtocol", "guarded_http_protocol"]
