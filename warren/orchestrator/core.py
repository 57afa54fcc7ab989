"""The core of the sandbox manager: records, routes, create (from a template, a snapshot or the warm
pool), kill, timeouts, metrics.

One :class:`_Live` per sandbox holds its record, its route and a lock; every state change is
persisted through :func:`transition` before it is visible to anyone else.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Settings
from ..errors import (
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    RuntimeFailure,
    TooManyRequestsError,
    UnavailableError,
)
from ..ids import new_sandbox_id
from ..runtime.base import AGENT_PORT, Resources, Runtime, RuntimeKind, SandboxSpec, SandboxStats
from ..runtime.registry import RuntimeRegistry, StagedRuntime
from ..snapshots import SnapshotRepository
from ..store import SandboxRecord, SandboxRepo, TemplateRepo
from .agent import init_agent, wait_healthy
from .exits import ExitWatcher
from .origin import Origin
from .pool import Pooled, WarmPool
from .requests import CreateRequest, Lifecycle, ListQuery
from .startcmd import run_start_command
from .states import SandboxState, public_state, transition

log = logging.getLogger(__name__)

MAX_FORKS = 20
_AGENT_START_DEADLINE_S = {RuntimeKind.RUNC: 30.0, RuntimeKind.GVISOR: 60.0}
DEFAULT_USER = "user"
_HOLDS_SLOT = frozenset({SandboxState.RUNNING, SandboxState.PAUSING})
"""States that hold a slot of the node's sandbox cap by themselves; creating and resuming sandboxes
hold a reservation instead (:meth:`ManagerCore._sandbox_slot`), paused and killing ones none."""


@dataclass
class _Live:
    record: SandboxRecord
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def state(self) -> SandboxState:
        return SandboxState(self.record.state)




class ManagerCore:
    """Sandbox records, creation and teardown: what every lifecycle operation builds on."""

    def __init__(
        self,
        *,
        settings: Settings,
        sandboxes: SandboxRepo,
        templates: TemplateRepo,
        runtimes: Mapping[RuntimeKind, Runtime],
        snapshots: SnapshotRepository | None = None,
        registry: RuntimeRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._sandboxes = sandboxes
        self._templates = templates
        self._runtimes = runtimes
        self._snapshots = snapshots
        self._registry = registry
        self.pool = WarmPool(
            self._pool_start, self._pool_stop, default_size=settings.warm_pool_size, room=self._pool_room
        )
        self._reserved = 0
        """Slots of the sandbox cap held by creates and resumes in progress."""
        self._clock = clock
        self._live: dict[str, _Live] = {}
        self._ttl_changed = asyncio.Event()
        self._cpu_samples: dict[str, tuple[float, int]] = {}
        self._draining = False
        self._exits = ExitWatcher()
        self._removal_listeners: list[Callable[[str], Awaitable[None]]] = []

    def on_removed(self, listener: Callable[[str], Awaitable[None]]) -> None:
        """Await ``listener(sandbox_id)`` whenever a sandbox stops being routable (killed, died, paused)."""
        self._removal_listeners.append(listener)

    async def _removed(self, sandbox_id: str) -> None:
        for listener in self._removal_listeners:
            try:
                await listener(sandbox_id)
            except Exception:
                log.exception("removal listener failed for %s", sandbox_id)

    def begin_drain(self) -> None:
        """From now on, new lifecycle operations are refused (503); running ones finish."""
        self._draining = True

    async def _test_stall(self, point: str) -> None:
        """Test hook (``WARREN_TEST_STALL=pause|resume``): stop forever at ``point`` so a test can
        SIGKILL the node mid-transition. Never set in production."""
        if self._settings.extra.get("test_stall") == point:
            log.warning("test hook: stalling at %s", point)
            await asyncio.Event().wait()

    def _admit(self) -> None:
        if self._draining:
            raise UnavailableError("the node is shutting down; try another node")

    # ----- the sandbox cap (E2B: concurrent sandboxes, 429) ----------------------------------------

    def active_count(self) -> int:
        """Sandboxes holding CPU and memory: running, pausing, and creates/resumes in progress."""
        return self._reserved + sum(1 for lv in self._live.values() if lv.state in _HOLDS_SLOT)

    def limits(self) -> dict[str, int]:
        return {"active": self.active_count(), "max": self._settings.max_sandboxes, "spares": self.pool.spares()}

    def _check_room(self, wanted: int = 1, what: str = "") -> None:
        cap = self._settings.max_sandboxes
        if cap and self.active_count() + wanted > cap:
            lead = f"{what} would exceed" if what else "You have reached"
            raise TooManyRequestsError(
                f"{lead} the maximum number of concurrent sandboxes on this node ({cap}). "
                "Kill or pause a sandbox first, or raise WARREN_MAX_SANDBOXES."
            )

    @contextlib.contextmanager
    def _sandbox_slot(self) -> Iterator[None]:
        """Hold one slot of the cap for a create or resume (429 when none is free)."""
        self._check_room()
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1
            self.pool.poke()

    def _pool_room(self) -> bool:
        cap = self._settings.max_sandboxes
        return not cap or self.active_count() + self.pool.spares() < cap

    async def _make_room(self) -> None:
        """Stop warm spares while they and the users' sandboxes exceed the cap (spares never block a create)."""
        cap = self._settings.max_sandboxes
        while cap and self.active_count() + self.pool.spares() > cap and await self.pool.evict_one():
            pass

    # ----- queries -------------------------------------------------------------------------------

    def route(self, sandbox_id: str) -> tuple[str, SandboxState] | None:
        """The agent address of a sandbox and its state, or None if this node does not know it."""
        live = self._live.get(sandbox_id)
        if live is None or live.record.address is None:
            return None
        return live.record.address, live.state

    def _get_live(self, sandbox_id: str) -> _Live:
        live = self._live.get(sandbox_id)
        if live is None or live.state in (SandboxState.CREATING, SandboxState.KILLING):
            raise NotFoundError(f"sandbox {sandbox_id} not found")
        return live

    def get(self, sandbox_id: str) -> SandboxRecord:
        return self._get_live(sandbox_id).record

    def count(self) -> int:
        return len(self._live)

    def list(self, query: ListQuery) -> tuple[list[SandboxRecord], str | None]:
        """Filtered, ordered by start time; returns one page and the token of the next one."""
        records = sorted(
            (
                lv.record
                for lv in self._live.values()
                if lv.state not in (SandboxState.CREATING, SandboxState.KILLING)
            ),
            key=lambda r: (r.started_at, r.id),
        )
        out = [
            r
            for r in records
            if public_state(SandboxState(r.state)) in query.states
            and all(r.metadata.get(k) == v for k, v in query.metadata.items())
        ]
        if query.next_token:
            after = _decode_token(query.next_token)
            out = [r for r in out if (r.started_at, r.id) > after]
        if query.limit is not None and len(out) > query.limit:
            page = out[: query.limit]
            return page, _encode_token(page[-1])
        return out, None

    # ----- create --------------------------------------------------------------------------------

    async def create(self, req: CreateRequest) -> SandboxRecord:
        """A new sandbox from a template, or from a snapshot named by id or name."""
        self._admit()
        origin = await self._resolve_origin(req.template)
        return await self._launch(
            origin,
            runtime_name=req.runtime,
            timeout_s=req.timeout_s,
            metadata=req.metadata,
            env_vars={**origin.env_vars, **req.env_vars},
            secure=req.secure,
            allow_internet=req.allow_internet,
            lifecycle=req.lifecycle,
        )

    async def _resolve_origin(self, name: str) -> Origin:
        template = await self._templates.find(name)
        if template is not None:
            sealed = self._snapshots.find(template_snapshot_name(template.id)) if self._snapshots else None
            if sealed is not None and self._snapshots is not None:
                origin = Origin.of_snapshot(sealed, self._snapshots.data_dir(sealed.snapshot_id))
                return dataclasses.replace(origin, alias=template.name, start_cmd=template.start_cmd)
            return Origin.of_template(template)
        manifest = self._snapshots.find(name) if self._snapshots is not None else None
        if manifest is not None and self._snapshots is not None:
            return Origin.of_snapshot(manifest, self._snapshots.data_dir(manifest.snapshot_id))
        raise NotFoundError(f"template '{name}' not found")

    def _available_runtime(self, kind: RuntimeKind) -> Runtime:
        runtime = self._runtimes.get(kind)
        probe = runtime.probe() if runtime else {"available": False, "reason": "not configured"}
        if runtime is None or not probe.get("available"):
            raise UnavailableError(f"runtime {kind.value} is not available on this node: {probe.get('reason')}")
        return runtime

    async def _launch(
        self,
        origin: Origin,
        *,
        runtime_name: str | None,
        timeout_s: int | None,
        metadata: Mapping[str, str],
        env_vars: Mapping[str, str],
        secure: bool,
        allow_internet: bool,
        lifecycle: Lifecycle | None = None,
        snapshot_dir: Path | None = None,
        use_pool: bool = True,
        admitted: bool = False,
    ) -> SandboxRecord:
        """Start one sandbox from ``origin`` (or ``snapshot_dir``, for forks) and hand it its /init.

        A template create claims a warm-pool sandbox when one is ready (then it is only /init'ed);
        if that sandbox turns out dead, the create starts a fresh one instead. It holds a slot of
        the node's sandbox cap throughout (429 before anything is made when none is free).
        """
        if not admitted:
            with self._sandbox_slot():
                return await self._launch(
                    origin,
                    runtime_name=runtime_name,
                    timeout_s=timeout_s,
                    metadata=metadata,
                    env_vars=env_vars,
                    secure=secure,
                    allow_internet=allow_internet,
                    lifecycle=lifecycle,
                    snapshot_dir=snapshot_dir,
                    use_pool=use_pool,
                    admitted=True,
                )
        kind = self._runtime_kind(runtime_name or origin.runtime)
        source = snapshot_dir or origin.snapshot_dir
        if source is not None and kind.value != origin.runtime:
            raise InvalidRequestError(f"a {origin.runtime} snapshot cannot start under {kind.value}")
        runtime = self._available_runtime(kind)
        pooled = self.pool.claim(origin, kind) if use_pool and source is None and allow_internet else None
        if pooled is None:
            await self._make_room()
        staged = pooled.staged if pooled else await self._stage(origin.runtime_hash if source else None, kind)
        timeout = self._timeout(timeout_s)
        now = self._clock()
        record = SandboxRecord(
            id=pooled.sandbox_id if pooled else new_sandbox_id(),
            template_id=origin.template_id,
            alias=origin.alias,
            runtime=kind.value,
            state=SandboxState.CREATING.value,
            metadata=dict(metadata),
            env_vars=dict(env_vars),
            started_at=now,
            end_at=now + timeout,
            cpu_count=origin.cpu_count,
            memory_mb=origin.memory_mb,
            disk_mb=origin.disk_mb,
            access_token=secrets.token_urlsafe(24) if secure else None,
            address=None,
            allow_internet=allow_internet,
            extra={
                **origin.extra(),
                **((lifecycle or Lifecycle()).to_extra()),
                **({"runtime_hash": staged.runtime_hash} if staged else {}),
            },
        )
        live = _Live(record)
        self._live[record.id] = live
        try:
            async with live.lock:
                await self._sandboxes.put(record)
                if pooled is not None:
                    handle = pooled.handle
                else:
                    spec = self._spec(record, staged)
                    handle = await (runtime.restore(spec, source) if source is not None else runtime.start(spec))
                live.record = dataclasses.replace(
                    live.record, address=handle.address, extra={**live.record.extra, "init_pid": handle.init_pid}
                )
                deadline = time.monotonic() + (2.0 if pooled else _AGENT_START_DEADLINE_S[kind])
                await wait_healthy(handle.address, handle.agent_port, deadline)
                await self._init(live, handle.address, handle.agent_port, previous_token=origin.agent_token)
                await run_start_command(origin, handle, record.access_token, fresh=not source, settings=self._settings)
                await self._set_state(live, SandboxState.RUNNING)
                self._exits.watch(record.id, handle.init_pid)
        except RuntimeFailure:
            await asyncio.shield(self._discard(live))
            if pooled is None:
                raise
            log.warning("warm-pool sandbox %s was not usable; starting a fresh one", record.id)
            return await self._launch(
                origin,
                runtime_name=runtime_name,
                timeout_s=timeout_s,
                metadata=metadata,
                env_vars=env_vars,
                secure=secure,
                allow_internet=allow_internet,
                lifecycle=lifecycle,
                use_pool=False,
                admitted=True,
            )
        except BaseException:
            await asyncio.shield(self._discard(live))
            raise
        self._ttl_changed.set()
        return live.record

    async def _pool_start(self, origin: Origin, kind: RuntimeKind) -> Pooled:
        """A sandbox for the warm pool: started and answering, not /init'ed, not in the store."""
        staged = await self._stage(None, kind)
        sandbox_id = new_sandbox_id()
        spec = SandboxSpec(
            sandbox_id=sandbox_id,
            runtime=kind,
            layers=tuple(Path(p) for p in origin.layers),
            resources=Resources(cpu_count=origin.cpu_count, memory_mb=origin.memory_mb, disk_mb=origin.disk_mb),
            runtime_binary=staged.binary if staged else None,
        )
        runtime = self._available_runtime(kind)
        handle = await runtime.start(spec)
        try:
            await wait_healthy(handle.address, handle.agent_port, time.monotonic() + _AGENT_START_DEADLINE_S[kind])
        except BaseException:
            await asyncio.shield(runtime.stop(sandbox_id))
            raise
        return Pooled(sandbox_id, kind, handle, staged)

    async def _pool_stop(self, pooled: Pooled) -> None:
        await self._runtimes[pooled.kind].stop(pooled.sandbox_id)

    async def _init(self, live: _Live, address: str, port: int, *, previous_token: str | None) -> None:
        extra = live.record.extra
        await init_agent(
            address,
            port,
            env_vars={**extra.get("env", {}), **live.record.env_vars},
            access_token=live.record.access_token,
            default_user=extra.get("user") or DEFAULT_USER,
            default_workdir=extra.get("workdir"),
            previous_token=previous_token,
        )

    async def _stage(self, runtime_hash: str | None, kind: RuntimeKind) -> StagedRuntime | None:
        """The runtime to run on: the recorded hash (409 if the index misses it), else the default."""
        if self._registry is None:
            return None
        if runtime_hash is None:
            runtime_hash = self._registry.default_hash(kind.value)
            if runtime_hash is None:
                return None
        return await self._registry.stage(runtime_hash)

    def _spec(self, record: SandboxRecord, staged: StagedRuntime | None = None) -> SandboxSpec:
        return SandboxSpec(
            runtime_binary=staged.binary if staged else None,
            sandbox_id=record.id,
            runtime=RuntimeKind(record.runtime),
            layers=tuple(Path(p) for p in record.extra.get("layers", ())),
            resources=Resources(cpu_count=record.cpu_count, memory_mb=record.memory_mb, disk_mb=record.disk_mb),
            allow_internet=record.allow_internet,
        )

    def _runtime_kind(self, name: str) -> RuntimeKind:
        try:
            return RuntimeKind(name)
        except ValueError:
            raise InvalidRequestError(
                f"unknown runtime {name!r}; expected one of {[k.value for k in RuntimeKind]}"
            ) from None

    def _timeout(self, timeout_s: int | None) -> int:
        if timeout_s is None:
            return self._settings.default_timeout_s
        if timeout_s < 0:
            raise InvalidRequestError("timeout must not be negative")
        return min(timeout_s, self._settings.max_timeout_s)

    async def _set_state(self, live: _Live, target: SandboxState) -> None:
        transition(live.record.id, live.state, target)
        record = dataclasses.replace(live.record, state=target.value)
        await self._sandboxes.put(record)
        live.record = record

    async def _discard(self, live: _Live) -> None:
        """Remove a sandbox and everything it owns; safe on any half-made sandbox."""
        sandbox_id = live.record.id
        runtime = self._runtimes.get(RuntimeKind(live.record.runtime))
        self._exits.unwatch(sandbox_id)
        await self._removed(sandbox_id)
        try:
            if runtime is not None:
                await runtime.stop(sandbox_id)
        finally:
            self._live.pop(sandbox_id, None)
            self._cpu_samples.pop(sandbox_id, None)
            self.pool.poke()  # a slot of the sandbox cap may be free for a spare
            await self._sandboxes.delete(sandbox_id)

    # ----- lifecycle -----------------------------------------------------------------------------

    async def kill(self, sandbox_id: str) -> None:
        live = self._get_live(sandbox_id)
        async with live.lock:
            if self._live.get(sandbox_id) is not live or live.state is SandboxState.KILLING:
                raise NotFoundError(f"sandbox {sandbox_id} not found")
            await self._set_state(live, SandboxState.KILLING)
            await asyncio.shield(self._discard(live))
        self._ttl_changed.set()

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> SandboxRecord:
        live = self._get_live(sandbox_id)
        if timeout_s < 0:
            raise InvalidRequestError("timeout must not be negative")
        async with live.lock:
            record = dataclasses.replace(live.record, end_at=self._clock() + self._timeout(timeout_s))
            await self._sandboxes.put(record)
            live.record = record
        self._ttl_changed.set()
        return record

    def _require(self, live: _Live, *states: SandboxState) -> None:
        if live.state not in states:
            raise InvalidStateError(f"sandbox {live.record.id} is {live.state.value}")

    def running_ids(self) -> builtins.list[str]:
        return [i for i, lv in self._live.items() if lv.state is SandboxState.RUNNING]

    def known_ids(self) -> set[str]:
        """Every sandbox id this node's store knows and keeps, in any state (after :meth:`recover`:
        the re-adopted ones); anything else under the node's runtime markers is an orphan."""
        return set(self._live)

    async def metrics(self, sandbox_id: str) -> tuple[SandboxStats, float]:
        """Current counters and CPU use in percent since the previous call (0 the first time)."""
        live = self._get_live(sandbox_id)
        stats = await self._runtimes[RuntimeKind(live.record.runtime)].stats(sandbox_id)
        now = time.monotonic()
        prev = self._cpu_samples.get(sandbox_id)
        self._cpu_samples[sandbox_id] = (now, stats.cpu_usage_ns)
        pct = 0.0
        if prev is not None and now > prev[0]:
            pct = (stats.cpu_usage_ns - prev[1]) / 1e9 / (now - prev[0]) / max(1, stats.cpu_count) * 100
        return stats, max(0.0, pct)


def template_snapshot_name(template_id: str) -> str:
    """The snapshot a gVisor template's creates restore (hidden from the E2B snapshot list)."""
    return f"template:{template_id}"



def _encode_token(record: SandboxRecord) -> str:
    return base64.urlsafe_b64encode(f"{record.started_at!r}:{record.id}".encode()).decode()


def _decode_token(token: str) -> tuple[float, str]:
    try:
        started, _, sandbox_id = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        return float(started), sandbox_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequestError("invalid nextToken") from None


__all__ = ["AGENT_PORT", "MAX_FORKS", "ManagerCore", "new_sandbox_id", "template_snapshot_name"]

