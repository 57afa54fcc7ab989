"""``create_app(services)``: the control-plane router wrapped by auth, error mapping and the proxy."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import WarrenError
from .auth import key_matches
from .errors import error_response, unhandled_error_handler, warren_error_handler
from .proxy import SandboxProxy
from .routes import builtin, images, logs, moves, node, runtimes, sandboxes, snapshots, templates
from .services import Services


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail)


class _ApiKeyAuth:
    """Every control-plane route but the public ones needs ``X-API-Key``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self._app = app
        self._key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in node.PUBLIC_PATHS:
            given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"x-api-key"), None)
            if not key_matches(self._key, given):
                message = "missing API key" if given is None else "invalid API key"
                await error_response(401, f"{message}: send X-API-Key")(scope, receive, send)
                return
        await self._app(scope, receive, send)


class _OriginFormOnly:
    """Only origin-form request targets (``/path?query``) reach the proxy and the router: the
    asterisk form (``OPTIONS *``), absolute and authority forms and anything else are a 400 JSON error."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            raw: bytes = scope.get("raw_path") or scope.get("path", "").encode("latin-1")
            if not raw.startswith(b"/"):
                message = "the request target must be a path starting with '/'"
                if scope["type"] == "http":
                    await error_response(400, message)(scope, receive, send)
                else:
                    await send({"type": "websocket.close", "code": 1008, "reason": message})
                return
        await self._app(scope, receive, send)


ROUTE_MODULES = (sandboxes, logs, snapshots, runtimes, templates, images, builtin, moves, node)
"""Every module of the node's routes, in the order they are matched (the OpenAPI contract test reads it)."""


def create_app(services: Services, *, max_keepalive: int = 512) -> tuple[ASGIApp, SandboxProxy]:
    """The ASGI app of a node and its proxy (whose HTTP client the caller closes)."""
    router = Starlette(
        routes=[route for module in ROUTE_MODULES for route in module.ROUTES],
        exception_handlers={
            WarrenError: warren_error_handler,
            HTTPException: _http_exception,
            Exception: unhandled_error_handler,
        },
    )
    router.state.services = services
    proxy = SandboxProxy(
        _ApiKeyAuth(router, services.api_key),
        services.manager.route,
        services.settings.domain,
        wake=services.manager.wake,
        traffic_token=services.manager.traffic_token,
        ended=services.manager.ended,
        max_keepalive=max_keepalive,
        token_holder=services.manager.holder_of_token,
    )
    return _OriginFormOnly(proxy), proxy
