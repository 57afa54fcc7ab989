"""``warren gateway``: a stateless process in front of the cluster's nodes. All it knows is in Redis,
so any number of them serve side by side, and one restarted loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ...api.auth import key_matches
from ...api.errors import error_response, unhandled_error_handler, warren_error_handler
from ...api.httpguard import guarded_http_protocol
from ...api.proxy import target_of
from ...api.tls import TlsFiles, tls_files
from ...errors import UnavailableError, WarrenError
from ..placement import LeastLoaded, Strategy
from ..records import NodeView
from ..store import DEFAULT_PREFIX, ClusterStore
from .dataplane import GatewayProxy
from .directory import Directory
from .metrics import GatewayMetrics, RequestMetrics
from .routes import ROUTES, Gateway
from .upstream import NodeClient

log = logging.getLogger("warren.gateway")

PUBLIC_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
"""Paths the API-key middleware lets through (``/metrics`` checks the key itself unless it is public)."""


@dataclass(frozen=True)
class GatewaySettings:
    redis_url: str
    api_key: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    domain: str | None = None
    """Domain mode: HTTPS for ``api.<domain>`` (the API) and ``<port>-<id>.<domain>`` (sandboxes, routed to
    their nodes, which stay in header mode); sandbox answers carry ``domain: <domain>``. ``:port`` included
    when not on 443, as on a node. None: plain HTTP, header mode (``E2B_SANDBOX_URL``)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """The operator's certificate for ``<domain>`` and ``*.<domain>`` and its key: what gateways behind one
    load balancer must share. None with a domain: the gateway makes a CA and a leaf in ``<state_dir>/tls``."""
    state_dir: Path = Path("/var/lib/warren-gateway")
    """Where a gateway in domain mode without ``--tls-cert`` keeps its CA (``tls/``); nothing else is kept."""
    redis_prefix: str = DEFAULT_PREFIX
    http_header_timeout_s: float = 10.0
    http_max_concurrency: int = 4096
    max_upload_bytes: int = 4 << 30
    """The largest template-build upload the gateway relays (the nodes enforce their own limit too)."""
    metrics_public: bool = True
    """``GET /metrics`` without the API key (``WARREN_METRICS_PUBLIC``), as on the nodes."""


class _ApiKeyAuth:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self._app = app
        self._key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"x-api-key"), None)
            if not key_matches(self._key, given):
                message = "missing API key" if given is None else "invalid API key"
                await error_response(401, f"{message}: send X-API-Key")(scope, receive, send)
                return
        await self._app(scope, receive, send)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail)


def _route_class(domain: str | None) -> Callable[[Scope], str]:
    """A request's class in the request metrics: its route's name, else sandbox traffic or ``other``."""

    def classify(scope: Scope) -> str:
        route = scope.get("route")
        if route is not None:
            return str(getattr(route, "name", None) or "other")
        return "dataplane" if target_of(scope["headers"], domain, scope.get("path", "")) is not None else "other"

    return classify


def create_gateway_app(
    settings: GatewaySettings,
    store: ClusterStore,
    client: NodeClient,
    strategy: Strategy | None = None,
    *,
    metrics: GatewayMetrics | None = None,
    tls_ca: Path | None = None,
) -> tuple[ASGIApp, GatewayProxy]:
    """The gateway's ASGI app and its data-plane proxy (which the caller closes). ``metrics``: the ones the
    store counts its Redis errors into (``serve_gateway``); a fresh set otherwise. ``tls_ca``: the CA the
    gateway made for its domain, named in ``/health``."""
    metrics = metrics or GatewayMetrics()
    async def probe(view: NodeView, sandbox_id: str) -> bool:
        try:
            answer = await client.call(
                view.info.url,
                "GET",
                f"/sandboxes/{quote(sandbox_id, safe='')}",
                headers=[("x-api-key", settings.api_key)],
            )
        except UnavailableError:
            return False
        return answer.status_code == 200

    directory = Directory(store, probe)
    router = Starlette(
        routes=ROUTES,
        exception_handlers={
            WarrenError: warren_error_handler,
            HTTPException: _http_exception,
            Exception: unhandled_error_handler,
        },
    )
    router.state.gateway = Gateway(
        directory, client, strategy or LeastLoaded(), settings.max_upload_bytes, metrics=metrics,
        metrics_key=None if settings.metrics_public else settings.api_key, domain=settings.domain, tls_ca=tls_ca,
    )  # fmt: skip
    proxy = GatewayProxy(_ApiKeyAuth(router, settings.api_key), directory, settings.domain)
    return RequestMetrics(proxy, metrics, _route_class(settings.domain)), proxy


def startup_message(domain: str | None, tls: TlsFiles | None) -> str:
    """What a gateway says at start about how clients reach it (stderr, as a node does)."""
    if domain is None:
        return (
            "warren gateway: header mode (no --domain): the E2B SDK needs E2B_API_URL and E2B_SANDBOX_URL "
            "= this gateway; SDKs before 2.9 need domain mode"
        )
    text = (
        f"warren gateway: domain mode: API at https://api.{domain}, sandboxes at https://<port>-<sandboxID>.{domain}"
        f"; SDK: E2B_API_URL=https://api.{domain} E2B_DOMAIN={domain}"
    )
    if tls is not None and tls.ca is not None:
        text += (
            f"\nwarren gateway: clients must trust the gateway CA {tls.ca} (for the E2B SDK: SSL_CERT_FILE={tls.ca})"
            "; gateways behind one load balancer need one certificate: give each --tls-cert/--tls-key"
        )
    return text


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_gateway(
    settings: GatewaySettings, *, stop: asyncio.Event, ready: asyncio.Future[Mapping[str, Any]] | None = None
) -> None:
    tls = await asyncio.to_thread(
        tls_files, settings.state_dir, settings.domain, settings.tls_cert, settings.tls_key, role="gateway"
    )
    print(startup_message(settings.domain, tls), file=sys.stderr)
    metrics = GatewayMetrics()
    store = ClusterStore.connect(settings.redis_url, prefix=settings.redis_prefix, on_error=metrics.redis_errors)
    client = NodeClient()
    app, proxy = create_gateway_app(settings, store, client, metrics=metrics, tls_ca=tls.ca if tls else None)
    config = uvicorn.Config(
        app, host=settings.listen_host, port=settings.listen_port, lifespan="off", access_log=False,
        log_level="warning", timeout_graceful_shutdown=5, timeout_keep_alive=30,
        http=guarded_http_protocol(settings.http_header_timeout_s, settings.http_max_concurrency),
        ssl_certfile=str(tls.cert) if tls else None, ssl_keyfile=str(tls.key) if tls else None,
    )  # fmt: skip
    server = _Server(config)
    try:
        async with asyncio.TaskGroup() as group:
            serving = group.create_task(server.serve(), name="gateway-http")
            while not server.started:
                if serving.done() or stop.is_set():
                    break
                await asyncio.sleep(0.01)
            if ready is not None and not ready.done():
                port = next((s.getsockname()[1] for srv in server.servers for s in srv.sockets), settings.listen_port)
                ready.set_result({"url": f"{'https' if tls else 'http'}://{settings.listen_host}:{port}"})
            stopping = group.create_task(stop.wait(), name="gateway-stop")
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            server.should_exit = True
            stopping.cancel()
    finally:
        await proxy.aclose()
        await client.aclose()
        await store.aclose()
        log.info("gateway stopped")


def run_gateway(settings: GatewaySettings) -> None:
    """Run a gateway until SIGTERM or SIGINT; blocking."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("gateway on %s:%d, cluster state in %s", settings.listen_host, settings.listen_port,
                 settings.redis_url)  # fmt: skip
        await serve_gateway(settings, stop=stop)

    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
