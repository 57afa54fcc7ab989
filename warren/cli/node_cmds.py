"""Node commands: ``serve`` (run a node) and ``setup`` (build the agent bundle and templates).

``warren.config``, ``warren.node`` and ``warren.runtime.agent_bundle`` are imported when the
command runs, so the client commands start fast and never depend on the server's modules.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

import warren
from warren.cli.client import CliError
from warren.cli.config import DEFAULT_CACHE_DIR, DEFAULT_STATE_DIR
from warren.templates import Progress, ensure_builtin_templates

DEFAULT_LISTEN = "127.0.0.1:3000"
DEFAULT_GATEWAY_STATE_DIR = Path("/var/lib/warren-gateway")


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (all interfaces) → (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise typer.BadParameter(f"expected HOST:PORT, got {value!r}", param_hint="--listen")
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"
    return host, int(port_text)


def serve(
    listen: Annotated[str, typer.Option("--listen", help="Address to serve on, HOST:PORT.")] = DEFAULT_LISTEN,
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="Node state: database, layers, api-key.")
    ] = DEFAULT_STATE_DIR,
    cache_dir: Annotated[
        Path,
        typer.Option("--cache-dir", envvar="WARREN_CACHE_DIR", help="Agent bundle and built-in templates (see setup)."),
    ] = DEFAULT_CACHE_DIR,
    runsc: Annotated[
        Path | None,
        typer.Option("--runsc", envvar="WARREN_RUNSC", help="runsc binary for gVisor (default: from PATH)."),
    ] = None,
    domain: Annotated[
        str | None,
        typer.Option(
            "--domain",
            help="Domain mode: sandboxes at https://<port>-<id>.<domain> (add :PORT when not on 443); "
            "the SDK then needs only E2B_API_URL and E2B_DOMAIN.",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", help="Certificate (PEM) for <domain> and *.<domain>; default: the node makes one."),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="Private key (PEM) of --tls-cert.")] = None,
    cluster_redis: Annotated[
        str | None,
        typer.Option("--cluster-redis", help="Join the cluster whose state is in this Redis (redis://host:port/db)."),
    ] = None,
    shared_store: Annotated[
        str | None,
        typer.Option(
            "--shared-store",
            help="Share paused sandboxes and snapshots with other nodes here: file:///mount/path (or an absolute "
            "path) or s3://bucket[/prefix] (endpoint: WARREN_S3_ENDPOINT or ?endpoint=URL).",
        ),
    ] = None,
) -> None:
    """Run a warren node until SIGTERM or SIGINT."""
    host, port = parse_listen(listen)
    settings_cls = _load("warren.config", "Settings")
    run_node = _load("warren.node", "run_node")
    fields: dict[str, Any] = {
        "listen_host": host,
        "listen_port": port,
        "cache_dir": cache_dir,
        "runsc_path": runsc,
        "domain": domain,
    }
    fields.update({k: v for k, v in (("tls_cert", tls_cert), ("tls_key", tls_key)) if v is not None})
    if cluster_redis:
        fields["cluster_redis"] = cluster_redis
    if shared_store:
        fields["shared_store"] = shared_store
    if hasattr(settings_cls, "from_env"):  # applies the node's own WARREN_* variables (api key, ...)
        settings = settings_cls.from_env(state_dir, **fields)
    else:
        settings = settings_cls(state_dir=state_dir, **fields)
    run_node(settings)


def setup(
    cache_dir: Annotated[
        Path,
        typer.Option("--cache-dir", envvar="WARREN_CACHE_DIR", help="Where to put the agent bundle and templates."),
    ] = DEFAULT_CACHE_DIR,
    extras: Annotated[
        list[str] | None,
        typer.Option("--with", help="Also build an optional template into the cache: code-interpreter."),
    ] = None,
) -> None:
    """Build the guest agent bundle and the built-in templates (busybox, base). Needs root.

    ``--with code-interpreter`` also builds ``code-interpreter-v1`` (minutes; a node otherwise builds it
    when a sandbox first names it)."""
    console = Console(stderr=True)
    build_agent_bundle = _load("warren.runtime.agent_bundle", "build_agent_bundle")
    guest_src = Path(warren.__file__).parent / "guest"
    with console.status("Building the guest agent bundle…") as status:
        bundle = build_agent_bundle(cache_dir, guest_src)
        if inspect.isawaitable(bundle):
            bundle = asyncio.run(_awaited(bundle))
        console.print(f"[green]✓[/green] agent bundle{f'  {bundle}' if bundle else ''}", highlight=False)

        def on_progress(name: str, progress: Progress) -> None:
            if progress is Progress.BUILDING:
                status.update(f"Building template {name}…")
            else:
                console.print(f"[green]✓[/green] template {name} ({progress.value})", highlight=False)

        built = ensure_builtin_templates(cache_dir, on_progress=on_progress)
    for name, path in built.items():
        console.print(f"  {name}: {path}", highlight=False)
    for extra in extras or ():
        build_extra = _load("warren.cli.setup_extras", "build_extra")
        started = time.monotonic()
        with console.status(f"Building {extra}…") as status:
            template = build_extra(cache_dir, extra, lambda line, what=extra: status.update(f"{what}: {line[:100]}"))
        console.print(f"[green]✓[/green] template {(template.get('names') or [extra])[0]} "
                      f"({time.monotonic() - started:.0f}s)", highlight=False)  # fmt: skip


def gateway(
    redis: Annotated[str, typer.Option("--redis", envvar="WARREN_CLUSTER_REDIS", help="The cluster's Redis URL.")],
    listen: Annotated[str, typer.Option("--listen", help="Address to serve on, HOST:PORT.")] = "127.0.0.1:8080",
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="WARREN_API_KEY", help="The API key the nodes share.")
    ] = None,
    metrics_public: Annotated[
        bool,
        typer.Option(
            "--metrics-public/--metrics-private",
            envvar="WARREN_METRICS_PUBLIC",
            help="GET /metrics without the API key (private: X-API-Key or Authorization: Bearer).",
        ),
    ] = True,
    domain: Annotated[
        str | None,
        typer.Option(
            "--domain",
            envvar="WARREN_DOMAIN",
            help="Domain mode: HTTPS, the API at https://api.<domain> and sandboxes at https://<port>-<id>.<domain> "
            "(add :PORT when not on 443), routed to their nodes (which stay in header mode: no --domain on "
            "nodes); the SDK then needs only E2B_API_URL and E2B_DOMAIN, and SDKs before 2.9 work too.",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            envvar="WARREN_TLS_CERT",
            help="Certificate (PEM) for <domain> and *.<domain>. The production way: gateways behind one load "
            "balancer must all serve the same one. Default: the gateway makes a CA and one in <state-dir>/tls.",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", envvar="WARREN_TLS_KEY", help="Private key (PEM) of --tls-cert.")
    ] = None,
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir",
            envvar="WARREN_GATEWAY_STATE_DIR",
            help="Where a gateway in domain mode without --tls-cert keeps its CA and certificate (tls/); "
            "gateways sharing this dir (its tls/ca.pem and ca-key.pem) share one CA.",
        ),
    ] = DEFAULT_GATEWAY_STATE_DIR,
) -> None:
    """Run a stateless gateway: the E2B API and data-plane proxy in front of the cluster's nodes.

    Header mode by default: the SDK gets E2B_API_URL and E2B_SANDBOX_URL = the gateway.

    Domain mode (--domain D): HTTPS for api.D and <port>-<id>.D, the SDK gets E2B_API_URL=https://api.D, E2B_DOMAIN=D.

    The nodes stay in header mode. Gateways behind one load balancer need one certificate: --tls-cert/--tls-key."""
    if not api_key:
        raise CliError("the gateway needs the nodes' API key: --api-key or WARREN_API_KEY")
    host, port = parse_listen(listen)
    run_gateway = _load("warren.cluster.gateway", "run_gateway")
    gateway_settings = _load("warren.cluster.gateway", "GatewaySettings")
    tls_config_error = _load("warren.api.tls", "TlsConfigError")
    settings = gateway_settings(redis_url=redis, api_key=api_key, listen_host=host, listen_port=port,
                                metrics_public=metrics_public, domain=domain or None, tls_cert=tls_cert,
                                tls_key=tls_key, state_dir=state_dir)  # fmt: skip
    try:
        run_gateway(settings)
    except tls_config_error as exc:
        raise CliError(str(exc)) from exc


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("gateway")(gateway)
    app.command("setup")(setup)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _load(module: str, attr: str) -> Any:
    """``module.attr``, imported now; a missing one is a clean error, not a traceback."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CliError(f"{module}.{attr} is not available in this installation: {exc}") from exc
