"""Stream a request to a port inside a sandbox and the response back: HTTP (chunked, SSE) and WebSockets.

The proxy is an ASGI wrapper around the control-plane app: requests with a sandbox target never
reach the router.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import websockets
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...aio import race
from ...errors import TooManyRequestsError, WarrenError
from ...orchestrator.states import SandboxState
from .routing import Target, target_of

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: connections to a sandbox end with a reset, leaving nothing in TIME_WAIT inside it."""
Resolver = Callable[[str], "tuple[str, SandboxState] | None"]
Waker = Callable[[str], Awaitable[str | None]]
_WAKE_DEADLINE_S = 60.0
"""How long proxied requests wait for a paused sandbox to auto-resume (gVisor restores take ~0.3-2 s)."""


async def _send_json(send: Send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


_NOT_ORIGIN_FORM = "the request target must be a path starting with '/'"


def _origin_path(scope: Scope) -> bytes | None:
    """The request's raw path if it is origin-form (starts with ``/``), else None (``*``, ``@host``, ``http://``)."""
    raw: bytes = scope.get("raw_path") or scope.get("path", "").encode("latin-1")
    return raw if raw.startswith(b"/") else None


class _Paused(Exception):
    """The target sandbox is paused and does not auto-resume."""


class SandboxGone(Exception):
    """Raised inside a proxied response whose sandbox went away: the server drops the connection."""


class SandboxProxy:
    """ASGI app: forwards sandbox traffic, hands everything else to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        resolve: Resolver,
        domain: str | None,
        *,
        wake: Waker | None = None,
        max_keepalive: int = 512,
    ) -> None:
        self._app = app
        self._resolve = resolve
        self._wake = wake
        self._domain = domain
        self._max_keepalive = max_keepalive
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._streams: dict[str, set[asyncio.Timeout]] = {}

    def _client(self, sandbox_id: str) -> httpx.AsyncClient:
        """One connection pool per sandbox, so a pause or kill can drop exactly its connections."""
        client = self._clients.get(sandbox_id)
        if client is None:
            transport = httpx.AsyncHTTPTransport(
                http1=True,
                http2=False,
                socket_options=[
                    (socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE),
                    # httpcore writes headers and body separately: without this, Nagle holds the
                    # body until the agent's delayed ACK (40 ms on every request).
                    (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
                ],
                limits=httpx.Limits(
                    max_connections=None, max_keepalive_connections=self._max_keepalive, keepalive_expiry=30
                ),
            )
            timeout = httpx.Timeout(connect=5.0, read=None, write=None, pool=None)
            client = httpx.AsyncClient(transport=transport, trust_env=False, timeout=timeout)
            self._clients[sandbox_id] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()

    async def abort(self, sandbox_id: str) -> None:
        """End every open stream to ``sandbox_id`` and reset its pooled connections (it died, was
        killed, or is being paused: a gVisor checkpoint fails while a connection is open, B3).

        Each stream runs under its own ``asyncio.timeout(None)``; expiring it makes the stream's
        handler drop the client connection, so no client waits on a sandbox that is gone.
        """
        loop = asyncio.get_running_loop()
        streams = self._streams.get(sandbox_id, set())
        for stream_deadline in list(streams):
            if stream_deadline.when() is None:
                stream_deadline.reschedule(loop.time())
        for _ in range(200):  # the handlers close their upstream responses within a loop turn or two
            if not self._streams.get(sandbox_id):
                break
            await asyncio.sleep(0.005)
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.aclose()

    @contextlib.asynccontextmanager
    async def _tracked(self, sandbox_id: str) -> AsyncIterator[asyncio.Timeout]:
        """Register one open stream to ``sandbox_id`` for ``abort``: its deadline, expired by an
        abort, makes the block raise ``TimeoutError`` (``expired()`` tells it from other timeouts)."""
        streams = self._streams.setdefault(sandbox_id, set())
        cut = asyncio.timeout(None)
        streams.add(cut)
        try:
            async with cut:
                yield cut
        finally:
            streams.discard(cut)
            if not streams and self._streams.get(sandbox_id) is streams:
                del self._streams[sandbox_id]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            target = target_of(scope["headers"], self._domain)
            if target is not None:
                if scope["type"] == "http":
                    await self._http(target, scope, receive, send)
                else:
                    await self._websocket(target, scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def _upstream(self, target: Target) -> str | None:
        """The sandbox's address, resuming it first if it is paused and auto-resumes.

        Raises ``_Paused`` for a paused sandbox that does not auto-resume; None when unknown.
        """
        route = self._resolve(target.sandbox_id)
        if route is None or not 0 < target.port < 65536:
            return None
        address, state = route
        if state is SandboxState.RUNNING:
            return address
        if state in (SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.RESUMING) and self._wake is not None:
            try:
                async with asyncio.timeout(_WAKE_DEADLINE_S):
                    woken = await self._wake(target.sandbox_id)
            except TooManyRequestsError:
                raise  # the node's sandbox cap: the caller gets E2B's 429, the sandbox stays paused
            except (WarrenError, TimeoutError) as exc:
                log.warning("auto-resume of %s failed: %s", target.sandbox_id, exc)
                return None
            if woken is None:
                raise _Paused(target.sandbox_id)
            return woken
        return None

    async def _http(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            address = await self._upstream(target)
        except _Paused:
            await _send_json(send, 410, f"The sandbox {target.sandbox_id} is paused; resume it with connect")
            return
        except TooManyRequestsError as exc:
            await _send_json(send, 429, str(exc))
            return
        if address is None:
            await _send_json(send, 502, f"The sandbox {target.sandbox_id} was not found")
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        has_body = any(
            (k.lower() == b"content-length" and v != b"0") or k.lower() == b"transfer-encoding"
            for k, v in scope["headers"]
        )
        path = _origin_path(scope)
        if path is None:
            await _send_json(send, 400, _NOT_ORIGIN_FORM)
            return
        query = scope.get("query_string", b"")
        # From parts, never by pasting the target after the authority: a target such as
        # "@127.0.0.1:22/x" would otherwise become the userinfo of a URL naming a host port.
        url = httpx.URL(scheme="http", host=address, port=target.port, raw_path=path + (b"?" + query if query else b""))
        client = self._client(target.sandbox_id)
        request = client.build_request(
            scope["method"], url, headers=headers, content=_body(receive) if has_body else None
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError:
            await _send_json(
                send, 502, f"The sandbox {target.sandbox_id} is running but port {target.port} is not open"
            )
            return
        except httpx.HTTPError as exc:
            await _send_json(send, 502, f"The sandbox {target.sandbox_id} was not found: {exc}")
            return
        try:
            async with self._tracked(target.sandbox_id) as cut:
                await self._pump(response, send)
        except TimeoutError:
            if not cut.expired():
                raise
            log.info("proxy stream to %s aborted: the sandbox went away", target.sandbox_id)
            raise SandboxGone(target.sandbox_id) from None
        finally:
            await response.aclose()

    async def _pump(self, response: httpx.Response, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except (httpx.HTTPError, OSError) as exc:
            log.debug("proxy stream ended early: %s", exc)

    async def _websocket(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            address = await self._upstream(target)
        except (_Paused, TooManyRequestsError):
            address = None
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if address is None:
            await send({"type": "websocket.close", "code": 1011, "reason": "sandbox was not found"})
            return
        raw_path = _origin_path(scope)
        if raw_path is None:
            await send({"type": "websocket.close", "code": 1008, "reason": _NOT_ORIGIN_FORM[:120]})
            return
        query = scope.get("query_string", b"").decode("latin-1")
        # The path starts with "/", so it cannot extend the authority (host:port) before it.
        url = f"ws://{address}:{target.port}{raw_path.decode('latin-1')}" + (f"?{query}" if query else "")
        protocols = [websockets.Subprotocol(p) for p in scope.get("subprotocols", [])]
        try:
            upstream = await websockets.connect(url, subprotocols=protocols or None, open_timeout=5)
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            await send({"type": "websocket.close", "code": 1011, "reason": f"upstream: {exc}"[:120]})
            return
        upstream.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        try:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            async with self._tracked(target.sandbox_id) as cut:
                try:
                    await _pump_websocket(upstream, receive, send)
                except BaseException:
                    upstream.transport.abort()  # a reset, before abort() moves on to pause or kill
                    raise
        except TimeoutError:
            if not cut.expired():
                raise
            log.info("proxied WebSocket to %s closed: the sandbox went away", target.sandbox_id)
            with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
                await send({"type": "websocket.close", "code": 1001, "reason": "the sandbox went away"})
        finally:
            await upstream.close()


async def _pump_websocket(upstream: Any, receive: Receive, send: Send) -> None:
    async def client_to_upstream() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close()
                return
            data = message.get("bytes") if message.get("bytes") is not None else message.get("text")
            await upstream.send(data)

    async def upstream_to_client() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for data in upstream:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        await send({"type": "websocket.close", "code": upstream.close_code or 1000})

    await race(
        client_to_upstream(), upstream_to_client(), names=("ws-client-to-upstream", "ws-upstream-to-client")
    )


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
