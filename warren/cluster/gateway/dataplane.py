"""The gateway's data plane: sandbox traffic (``E2b-Sandbox-Id`` header or ``<port>-<id>.<domain>``)
streamed to the proxy of the node bound to the sandbox, which does the rest (auto-resume, tokens).

The request goes on with explicit ``E2b-Sandbox-Id``/``-Port`` headers, so the node routes it whatever
form it came in. Connections to each node are pooled; HTTP (chunked, SSE) and WebSockets stream.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from urllib.parse import urlsplit

import websockets
from starlette.types import ASGIApp, Receive, Scope, Send

from ...api.proxy import target_of
from ...api.proxy.forward import (
    HOP_BY_HOP,
    origin_path,
    pump_websocket,
    relay_response,
    request_body_of,
    send_json,
    send_request,
)
from ...api.proxy.routing import Target
from ...api.proxy.upstream import RESET_ON_CLOSE, SandboxPool, UpstreamConnectError, UpstreamError
from ...errors import GoneError, NotFoundError, UnavailableError
from .directory import Directory

log = logging.getLogger(__name__)

_ROUTING = (b"e2b-sandbox-id", b"e2b-sandbox-port")


class GatewayProxy:
    """ASGI app: forwards sandbox traffic to its node, hands everything else to ``app``."""

    def __init__(self, app: ASGIApp, directory: Directory, domain: str | None, *, max_keepalive: int = 512) -> None:
        self._app = app
        self._directory = directory
        self._domain = domain
        self._max_keepalive = max_keepalive
        self._pools: dict[str, SandboxPool] = {}

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            target = target_of(scope["headers"], self._domain, scope.get("path", ""))
            if target is not None:
                if scope["type"] == "http":
                    await self._http(target, scope, receive, send)
                else:
                    await self._websocket(target, scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def _node(self, target: Target) -> tuple[str, int] | tuple[int, str]:
        """(host, port) of the node's listener, or (status, message) when there is none to go to."""
        try:
            view = await self._directory.live(target.sandbox_id)
        except NotFoundError:
            return 502, f"The sandbox {target.sandbox_id} was not found"
        except GoneError as exc:
            return 410, str(exc)
        except UnavailableError as exc:
            return 503, str(exc)
        url = urlsplit(view.info.url)
        return url.hostname or "127.0.0.1", url.port or 80

    @staticmethod
    def _headers(scope: Scope, target: Target) -> list[tuple[bytes, bytes]]:
        kept = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP and k.lower() not in _ROUTING]
        return [*kept, (_ROUTING[0], target.sandbox_id.encode()), (_ROUTING[1], str(target.port).encode())]

    async def _http(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        node = await self._node(target)
        if isinstance(node[0], int):
            await send_json(send, node[0], str(node[1]))
            return
        host, port = str(node[0]), int(node[1])
        path = origin_path(scope)
        if path is None:
            await send_json(send, 400, "the request target must be a path starting with '/'")
            return
        query = scope.get("query_string", b"")
        has_body = any(
            (k.lower() == b"content-length" and v != b"0") or k.lower() == b"transfer-encoding"
            for k, v in scope["headers"]
        )
        pool = self._pools.get(f"{host}:{port}")
        if pool is None:
            pool = self._pools[f"{host}:{port}"] = SandboxPool(self._max_keepalive)
        method: str = scope["method"]
        try:
            conn = await send_request(
                pool, host, port, method, path + (b"?" + query if query else b""), self._headers(scope, target),
                request_body_of(receive) if has_body else None,
            )  # fmt: skip
        except UpstreamConnectError:
            await send_json(send, 502, f"the node of sandbox {target.sandbox_id} is not reachable")
            return
        except UpstreamError as exc:
            await send_json(send, 502, f"the node of sandbox {target.sandbox_id} failed: {exc}")
            return
        try:
            await relay_response(conn, method, send, receive)
        finally:
            if method == "HEAD":
                pool.discard(conn)
            else:
                pool.release(conn, host, port)

    async def _websocket(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        node = await self._node(target)
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if isinstance(node[0], int):
            await send({"type": "websocket.close", "code": 1011, "reason": str(node[1])[:120]})
            return
        raw_path = origin_path(scope)
        if raw_path is None:
            await send({"type": "websocket.close", "code": 1008, "reason": "the request target must be a path"})
            return
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"ws://{node[0]}:{node[1]}{raw_path.decode('latin-1')}" + (f"?{query}" if query else "")
        protocols = [websockets.Subprotocol(p) for p in scope.get("subprotocols", [])]
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._headers(scope, target)
                   if k.lower() not in (b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions",
                                        b"sec-websocket-protocol")]  # fmt: skip
        try:
            upstream = await websockets.connect(
                url, subprotocols=protocols or None, additional_headers=headers, open_timeout=10
            )
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            await send({"type": "websocket.close", "code": 1011, "reason": f"upstream: {exc}"[:120]})
            return
        upstream.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        try:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            await pump_websocket(upstream, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await upstream.close()
