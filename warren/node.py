"""The composition root: builds every service of a node, owns its TaskGroup, serves HTTP.

``run_node(settings)`` is what the CLI calls; tests and benchmarks call :func:`serve` in-process with
their own ``stop`` and ``ready`` events.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import uvicorn

from . import phases
from .aio import wait_event_or_task
from .api import Services, create_app
from .api.auth import load_or_create_api_key
from .api.httpguard import guarded_http_protocol
from .api.metrics import NodeMetrics
from .cluster.membership import Heartbeat, NodeServices, advertise_url, node_id_of
from .cluster.store import ClusterStore
from .config import Settings
from .errors import ConflictError, InvalidRequestError, UnavailableError
from .footprint import FootprintCaps, apply_footprint_caps
from .ids import new_template_id
from .images import LayerStore
from .names import validate_name
from .node_runtimes import guest_source_dir, reap_orphans_for_node, start_runtimes
from .node_tls import domain_info, startup_message, tls_files
from .orchestrator import SandboxManager
from .orchestrator.faults import faults_from_env
from .orchestrator.moves import SCRATCH
from .orchestrator.requests import ListQuery
from .orchestrator.shutdown import preserve_all
from .runtime import build_agent_bundle
from .runtime.base import RuntimeKind
from .snapshots import SnapshotRepository
from .snapshots.shared import SharedSnapshots, open_object_store
from .statedir import seal_state_dir
from .store import Database, SandboxRepo, TemplateRecord, TemplateRepo
from .store.lock import INSTANCE_LOCK_NAME, acquire_instance_lock
from .templates.build import BuildRuntime, BuildService, Usage
from .templates.codeinterp import Provisioner

log = logging.getLogger("warren.node")

_BUILTIN_RESOURCES = {"base": (2, 512), "busybox": (1, 256)}
_GRACEFUL_HTTP_SHUTDOWN_S = 5


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: the node owns SIGTERM/SIGINT (uvicorn re-raises them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_node(settings: Settings) -> None:
    """Run a node until SIGTERM or SIGINT; blocking."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request otherwise
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_run_with_signals(settings))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (the proxy's per-request cost roughly halves), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _run_with_signals(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop=stop)


async def _import_template(
    repo: TemplateRepo,
    state_dir: Path,
    src: Path,
    name: str,
    runtime: str | None,
    roots: tuple[Path, ...] | None = None,
) -> TemplateRecord:
    """``roots``: the API's import roots (403 outside them); ``None`` for the node's own imports."""
    from .templates import import_template
    from .templates.importer import check_import_root

    validate_name(name, "template")
    if not src.is_absolute():
        raise InvalidRequestError(f"{src} is not an absolute path to a directory")
    if roots is not None:
        check_import_root(src, roots)
    if not await asyncio.to_thread(src.is_dir):
        raise InvalidRequestError(f"{src} is not an absolute path to a directory")
    if await repo.find(name) is not None:
        raise ConflictError(f"template '{name}' exists already")
    kind = RuntimeKind(runtime) if runtime in {k.value for k in RuntimeKind} else RuntimeKind.RUNC
    if runtime is not None and runtime != kind.value:
        raise InvalidRequestError(f"unknown runtime {runtime!r}")
    layer = await asyncio.to_thread(import_template, src, state_dir, name, roots=roots)
    cpu, mem = _BUILTIN_RESOURCES.get(name, (2, 512))
    record = TemplateRecord(
        id=new_template_id(),
        name=name,
        runtime=kind.value,
        layers=(str(layer),),
        env={},
        workdir=None,
        user=None,
        start_cmd=None,
        ready_cmd=None,
        cpu_count=cpu,
        memory_mb=mem,
        disk_mb=2048,
        created_at=time.time(),
    )
    await repo.put(record)
    return record


async def _ensure_builtin_templates(settings: Settings, repo: TemplateRepo) -> None:
    """A node on an empty state dir imports the built-in templates from the setup cache."""
    from .templates import ensure_builtin_templates

    built = await asyncio.to_thread(ensure_builtin_templates, settings.cache_dir)
    for name, template_dir in built.items():
        if await repo.find(name) is None:
            await _import_template(repo, settings.state_dir, template_dir / "rootfs", name, None)
            log.info("imported built-in template %s", name)


async def _build_service(
    settings: Settings,
    templates: TemplateRepo,
    runc: BuildRuntime | None,
    manager: SandboxManager,
    snapshots: SnapshotRepository,
) -> BuildService:
    """Template builds and pulls: the node's image layer store, and what keeps layers in use."""

    def usage() -> Usage:
        sandboxes, _ = manager.list(ListQuery())
        layers = {p for r in sandboxes for p in r.image.layers}
        layers |= {p for m in snapshots.list() for p in m.layers}
        return Usage(frozenset(r.template_id for r in sandboxes), frozenset(layers))

    image_store = await asyncio.to_thread(LayerStore, settings.state_dir / "images")
    builds = BuildService(settings=settings, templates=templates, runtime=runc, image_store=image_store, usage=usage)
    await builds.recover()
    return builds


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event,
    ready: asyncio.Future[Mapping[str, Any]] | None = None,
) -> None:
    """Run one node until ``stop`` is set. ``ready`` gets ``{"url", "api_key"}`` once it listens."""
    caps = apply_footprint_caps(os.environ)
    await asyncio.to_thread(seal_state_dir, settings.state_dir)
    lock = await acquire_instance_lock(settings.state_dir / INSTANCE_LOCK_NAME, budget_s=settings.lock_budget_s)
    with lock:
        phases.configure(settings.profile_file)
        try:
            await _serve_locked(settings, caps, stop=stop, ready=ready)
        finally:
            phases.configure(None)


async def _serve_locked(
    settings: Settings,
    caps: FootprintCaps,
    *,
    stop: asyncio.Event,
    ready: asyncio.Future[Mapping[str, Any]] | None,
) -> None:
    api_key, created = load_or_create_api_key(settings.state_dir, settings.api_key)
    if created:
        print(f"warren: generated API key {api_key} (saved in {settings.state_dir / 'api-key'})", file=sys.stderr)
    tls = await asyncio.to_thread(tls_files, settings.state_dir, settings.domain, settings.tls_cert, settings.tls_key)
    print(startup_message(settings.domain, tls), file=sys.stderr)
    db = await asyncio.to_thread(Database, settings.state_dir / "warren.db")  # may migrate the schema
    try:
        agent_bundle = await build_agent_bundle(settings.cache_dir, guest_source_dir())
        node_runtimes = await start_runtimes(settings, agent_bundle)
        runtimes = node_runtimes.as_mapping()
        templates = TemplateRepo(db)
        await _ensure_builtin_templates(settings, templates)
        snapshots = await asyncio.to_thread(SnapshotRepository, settings.state_dir / "snapshots")
        shared = _shared_store(settings)
        metrics = NodeMetrics()
        manager = SandboxManager(
            settings=settings,
            sandboxes=SandboxRepo(db),
            templates=templates,
            runtimes=runtimes,
            snapshots=snapshots,
            registry=node_runtimes.registry,
            faults=faults_from_env(),  # a test seam: inert unless WARREN_TEST_STALL is set
            shared=shared,
            observe=metrics.observe,
        )
        metrics.watch(manager)
        await manager.recover()
        await reap_orphans_for_node(node_runtimes, manager.known_ids(), settings)
        runc = node_runtimes.backends.get(RuntimeKind.RUNC)
        builds = await _build_service(settings, templates, runc, manager, snapshots)
        builds.on_built = manager.seal_template
        builds.on_deleted = manager.forget_template
        code_interpreter = Provisioner(builds=builds, templates=templates, cache_dir=settings.cache_dir,
                                       state_dir=settings.state_dir, on_imported=manager.seal_template)  # fmt: skip

        async def import_template(src: Path, name: str, runtime: str | None) -> TemplateRecord:
            return await _import_template(
                templates, settings.state_dir, src, name, runtime, settings.allowed_import_roots()
            )

        services = Services(
            settings=settings,
            manager=manager,
            templates=templates,
            api_key=api_key,
            probes=lambda: {k.value: r.probe().to_json() for k, r in runtimes.items()},
            import_template=import_template,
            snapshots=snapshots,
            registry=node_runtimes.registry,
            reload_runtimes=lambda: node_runtimes.reload(settings),
            builds=builds,
            code_interpreter=code_interpreter,
            metrics=metrics,
            info={"node": settings.node_name, "agent_bundle": str(agent_bundle), "footprint": caps.__dict__,
                  "diskQuota": node_runtimes.backends[RuntimeKind.RUNC].disks.status(),
                  **domain_info(settings.domain, tls)},
        )
        app, proxy = create_app(services, max_keepalive=caps.http_max_keepalive)
        manager.on_removed(proxy.abort)
        config = uvicorn.Config(
            app,
            host=settings.listen_host,
            port=settings.listen_port,
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=_GRACEFUL_HTTP_SHUTDOWN_S,
            timeout_keep_alive=30,
            # Request-head timeout (slow loris) and a JSON 503 over the concurrency cap: api/httpguard.py.
            http=guarded_http_protocol(settings.http_header_timeout_s, settings.http_max_concurrency),
            ssl_certfile=str(tls.cert) if tls else None,
            ssl_keyfile=str(tls.key) if tls else None,
        )
        server = _Server(config)
        try:
            async with asyncio.TaskGroup() as group:
                serving = group.create_task(server.serve(), name="http-server")
                timers = group.create_task(manager.run_timers(), name="ttl-timers")
                reaper = group.create_task(manager.run_reaper(), name="exit-reaper")
                sampler = group.create_task(manager.run_metrics(), name="metrics-sampler")
                prewarm = group.create_task(node_runtimes.registry.prewarmer.run(), name="runtime-prewarm")
                pool = group.create_task(manager.pool.run(), name="warm-pool")
                while not server.started:
                    if stop.is_set() or server.should_exit:
                        break
                    await asyncio.sleep(0.01)
                port = _bound_port(server) or settings.listen_port
                if ready is not None and not ready.done():
                    scheme = "https" if tls else "http"
                    ready.set_result({"url": f"{scheme}://{settings.listen_host}:{port}", "api_key": api_key})
                heartbeat = None
                if settings.cluster_redis and not stop.is_set():
                    member = NodeServices(
                        node_id_of(settings), advertise_url(settings, port, "https" if tls else "http"), manager,
                        templates, snapshots, node_runtimes.registry,
                        lambda: tuple(k.value for k, r in runtimes.items() if r.probe().available), time.time(),
                    )  # fmt: skip
                    metrics.redis_errors.expect(("heartbeat", "leave"))
                    cluster = ClusterStore.connect(settings.cluster_redis, on_error=metrics.redis_errors)
                    heartbeat = Heartbeat(cluster, member.node_id, member.snapshot,
                                          interval_s=settings.cluster_heartbeat_s, ttl_s=settings.cluster_ttl_s,
                                          after=member.settle_moves)  # fmt: skip
                    beating = group.create_task(heartbeat.run(), name="cluster-heartbeat")
                    manager.mover.check_owner(functools.partial(_bound_here, cluster, member.node_id))
                # Parking starts once it knows whose sandboxes are whose (a cluster's bindings).
                mover = group.create_task(manager.run_mover(), name="shared-store-parking")
                await wait_event_or_task(stop, serving)
                # Shutdown order (seed 000): refuse new work, preserve sandboxes while the API still
                # answers (503 for new lifecycle calls), then stop HTTP, then the helpers.
                if heartbeat is not None:
                    heartbeat.draining = True  # gateways place nothing new here from the next beat
                    heartbeat.poke()
                report = await preserve_all(manager, concurrency=settings.shutdown_concurrency)
                if report.failed:
                    log.error("left running (re-adopted at next start): %s", sorted(report.failed))
                mover.cancel()
                if shared is not None:  # what it paused can come back on another node while this one is away
                    await _park_before_leaving(manager)
                if heartbeat is not None:
                    beating.cancel()
                    await heartbeat.leave()  # its roster now says paused: nothing of it is lost
                    await cluster.aclose()
                server.should_exit = True
                timers.cancel()
                reaper.cancel()
                sampler.cancel()
                prewarm.cancel()
                pool.cancel()  # its finally stops the pooled sandboxes
                await code_interpreter.aclose()
                await builds.aclose()
                await manager.logs.aclose()
                await node_runtimes.aclose()  # releases of the sandboxes just paused
        finally:
            await proxy.aclose()
    finally:
        db.close()
        log.info("node stopped")


_PARK_AT_SHUTDOWN_S = 60.0
"""How long a stopping node spends copying its paused sandboxes to the shared store; the rest are parked
at its next start."""


async def _bound_here(cluster: ClusterStore, node_id: str, sandbox_id: str) -> bool:
    """Whether the cluster binds ``sandbox_id`` to this node, or to none (Redis away: yes, so pauses park)."""
    try:
        return (await cluster.binding(sandbox_id)) in (None, node_id)
    except UnavailableError:
        return True


def _shared_store(settings: Settings) -> SharedSnapshots | None:
    if not settings.shared_store:
        return None
    return SharedSnapshots(open_object_store(settings.shared_store), settings.state_dir / "moved" / SCRATCH)


async def _park_before_leaving(manager: SandboxManager) -> None:
    try:
        async with asyncio.timeout(_PARK_AT_SHUTDOWN_S):
            parked = await manager.mover.park_all()
        log.info("parked %d paused sandboxes in the shared store", parked)
    except TimeoutError:
        log.warning("parking at shutdown took over %.0f s; the rest are parked at the next start", _PARK_AT_SHUTDOWN_S)


def _bound_port(server: uvicorn.Server) -> int | None:
    for srv in getattr(server, "servers", []):
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    return None
