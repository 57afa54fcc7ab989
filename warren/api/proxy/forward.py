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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import websockets
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...aio import race
from ...errors import TooManyRequestsError, WarrenError
from ...orchestrator.states import SandboxState
from .ingress import Refusal, TokenLookup, refusal
from .routing import Target, envd_token_target, target_of
from .upstream import (
    RESET_ON_CLOSE,
    SandboxPool,
    UpstreamConnectError,
    UpstreamConnection,
    UpstreamError,
    exchange,
)

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
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
Resolver = Callable[[str], "tuple[str, SandboxState] | None"]
Waker = Callable[[str], Awaitable[str | None]]
Ended = Callable[[str], bool]
"""Whether this node recently held a sandbox under this id that is gone now (killed, timed out, died)."""
_WAKE_DEADLINE_S = 60.0
"""How long proxied requests wait for a paused sandbox to auto-resume (gVisor restores take ~0.3-2 s)."""


async def send_json(send: Send, status: int, message: str, sandbox_id: str | None = None) -> None:
    fields: dict[str, object] = {"code": status, "message": message}
    if sandbox_id is not None:
        fields["sandboxId"] = sandbox_id
    await _send_body(send, status, fields)


async def _send_body(send: Send, status: int, payload: dict[str, object], *, websocket: bool = False) -> None:
    """A JSON answer; for a WebSocket handshake, as an HTTP response (ASGI's ``websocket.http.response``)."""
    body = json.dumps(payload).encode()
    kind = "websocket.http.response" if websocket else "http.response"
    await send(
        {
            "type": f"{kind}.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": f"{kind}.body", "body": body})


_NOT_ORIGIN_FORM = "the request target must be a path starting with '/'"


def origin_path(scope: Scope) -> bytes | None:
    """The request's raw path if it is origin-form (starts with ``/``), else None (``*``, ``@host``, ``http://``)."""
    raw: bytes = scope.get("raw_path") or scope.get("path", "").encode("latin-1")
    return raw if raw.startswith(b"/") else None


def _without_dot_segments(path: bytes) -> bytes:
    """``path`` with ``.`` and ``..`` segments resolved (RFC 3986 5.2.4), as the proxy always sent it."""
    segments = path.split(b"/")
    if b"." not in segments and b".." not in segments:
        return path
    out: list[bytes] = []
    for segment in segments:
        if segment == b".":
            continue
        if segment == b"..":
            if out and out != [b""]:
                out.pop()
        else:
            out.append(segment)
    return b"/".join(out) or b"/"


def _not_running(sandbox_id: str, why: str | None) -> str:
    """The 502 message of a sandbox that does not run: E2B's client proxy says "The sandbox was not
    found", and the SDK maps a 502 whose message has "was not found" to ``SandboxNotRunningException``
    (``is_running()`` is False for any 502); ``why`` tells paused from killed."""
    return f"The sandbox {sandbox_id} was not found" + (f": {why}" if why else "")


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
        traffic_token: TokenLookup | None = None,
        ended: Ended | None = None,
        max_keepalive: int = 512,
        token_holder: Callable[[str], str | None] | None = None,
    ) -> None:
        self._app = app
        self._token_holder = token_holder
        self._resolve = resolve
        self._wake = wake
        self._traffic_token = traffic_token
        self._ended = ended
        self._domain = domain
        self._max_keepalive = max_keepalive
        self._pools: dict[str, SandboxPool] = {}
        self._streams: dict[str, set[asyncio.Timeout]] = {}

    def _pool(self, sandbox_id: str) -> SandboxPool:
        """One connection pool per sandbox, so a pause or kill can drop exactly its connections."""
        pool = self._pools.get(sandbox_id)
        if pool is None:
            pool = self._pools[sandbox_id] = SandboxPool(self._max_keepalive)
        return pool

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

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
        pool = self._pools.pop(sandbox_id, None)
        if pool is not None:
            pool.close()

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
            target = target_of(scope["headers"], self._domain, scope.get("path", ""))
            if target is None and self._token_holder is not None:
                target = envd_token_target(scope["headers"], scope.get("path", ""), self._token_holder)
            if target is not None:
                if scope["type"] == "http":
                    await self._http(target, scope, receive, send)
                else:
                    await self._websocket(target, scope, receive, send)
                return
        await self._app(scope, receive, send)

    def _refused(self, target: Target, scope: Scope) -> Refusal | None:
        """Private traffic without the sandbox's token (checked before anything could resume it)."""
        required = self._traffic_token(target.sandbox_id) if self._traffic_token is not None else None
        if required is None:
            return None
        route = self._resolve(target.sandbox_id)
        paused = route is not None and route[1] is not SandboxState.RUNNING
        return refusal(target, scope["headers"], required, paused=paused)

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
        if (refused := self._refused(target, scope)) is not None:
            await _send_body(send, refused.status, refused.body())
            return
        try:
            address = await self._upstream(target)
        except _Paused:
            paused = _not_running(target.sandbox_id, "it is paused (connect resumes it)")
            await send_json(send, 502, paused, target.sandbox_id)
            return
        except TooManyRequestsError as exc:
            await send_json(send, 429, str(exc))
            return
        if address is None:
            ended = self._ended is not None and self._ended(target.sandbox_id)
            gone = _not_running(target.sandbox_id, "it was killed or reached its timeout" if ended else None)
            await send_json(send, 502, gone, target.sandbox_id)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        has_body = any(
            (k.lower() == b"content-length" and v != b"0") or k.lower() == b"transfer-encoding"
            for k, v in scope["headers"]
        )
        path = origin_path(scope)
        if path is None:
            await send_json(send, 400, _NOT_ORIGIN_FORM)
            return
        query = scope.get("query_string", b"")
        # The target is origin-form (starts with "/"): it names a path on the sandbox's port only.
        request_target = _without_dot_segments(path) + (b"?" + query if query else b"")
        host, port = address, target.port
        pool = self._pool(target.sandbox_id)
        method: str = scope["method"]
        body = request_body_of(receive) if has_body else None
        try:
            conn = await send_request(pool, host, port, method, request_target, headers, body)
        except UpstreamConnectError:
            await send_json(
                send, 502, f"The sandbox {target.sandbox_id} is running but port {target.port} is not open"
            )
            return
        except UpstreamError as exc:
            await send_json(send, 502, _not_running(target.sandbox_id, str(exc)), target.sandbox_id)
            return
        try:
            try:
                async with self._tracked(target.sandbox_id) as cut:
                    await relay_response(conn, method, send, receive)
            except TimeoutError:
                if not cut.expired():
                    raise
                log.info("proxy stream to %s aborted: the sandbox went away", target.sandbox_id)
                raise SandboxGone(target.sandbox_id) from None
        finally:
            if method == "HEAD":
                pool.discard(conn)  # its Content-Length announced a body that never comes
            else:
                pool.release(conn, host, port)

    async def _websocket(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        if (refused := self._refused(target, scope)) is not None:
            await receive()  # websocket.connect
            if "websocket.http.response" in (scope.get("extensions") or {}):
                await _send_body(send, refused.status, refused.body(), websocket=True)
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": refused.message[:120]})
            return
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
        raw_path = origin_path(scope)
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
        upstream.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        try:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            async with self._tracked(target.sandbox_id) as cut:
                try:
                    await pump_websocket(upstream, receive, send)
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


async def send_request(
    pool: SandboxPool,
    host: str,
    port: int,
    method: str,
    request_target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: AsyncIterator[bytes] | None,
) -> UpstreamConnection:
    """Send the request and wait for the response head, on a pooled connection when there is one.

    A pooled connection the sandbox closed while it sat idle fails before any answer: a request
    without a body is then sent again once, on a new connection.
    """
    host_header = f"{host}:{port}".encode()
    conn, reused = await pool.acquire(host, port)
    try:
        await exchange(conn, method, request_target, host_header, headers, body)
        return conn
    except UpstreamError:
        pool.discard(conn)
        if not reused or body is not None or conn.answered:
            raise
    conn, _ = await pool.acquire(host, port)
    try:
        await exchange(conn, method, request_target, host_header, headers, None)
    except UpstreamError:
        pool.discard(conn)
        raise
    return conn


async def relay_response(conn: UpstreamConnection, method: str, send: Send, receive: Receive) -> None:
    """The response head and body to the client (HEAD, 1xx, 204 and 304 responses have no body).

    A client that disconnects ends the upstream connection too, even while the sandbox sends nothing
    (a long computation behind a streamed answer: the code interpreter's ``/execute`` interrupts its
    kernel when its connection closes)."""
    ending = asyncio.Event()  # set before the last write: the server then reports a disconnect too
    watcher = asyncio.create_task(_abort_on_disconnect(receive, conn, ending), name="proxy-disconnect-watch")
    try:
        await _pump_response(conn, method, send, ending)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _abort_on_disconnect(receive: Receive, conn: UpstreamConnection, ending: asyncio.Event) -> None:
    """Wait for the client's ``http.disconnect`` (the request body is sent by now) and abort ``conn``,
    unless the response is ending (uvicorn reports a completed response as a disconnect as well)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not ending.is_set():
                conn.abort()
            return


async def _pump_response(conn: UpstreamConnection, method: str, send: Send, ending: asyncio.Event) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": conn.status,
            "headers": [(k, v) for k, v in conn.headers if k.lower() not in HOP_BY_HOP],
        }
    )
    try:
        ended = False
        if method != "HEAD":
            async for chunk, last in conn.body():
                # The last piece ends the response in the same write (uvicorn adds the final chunk).
                if last:
                    ending.set()
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                ended = last
        if not ended:
            ending.set()
            await send({"type": "http.response.body", "body": b""})
    except (UpstreamError, OSError) as exc:
        log.debug("proxy stream ended early: %s", exc)


async def pump_websocket(upstream: Any, receive: Receive, send: Send) -> None:
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

    await race(client_to_upstream(), upstream_to_client(), names=("ws-client-to-upstream", "ws-upstream-to-client"))


async def request_body_of(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
