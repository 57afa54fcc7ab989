"""Starting sandboxes: from a template (claiming a warm-pool sandbox when one is ready), from a
snapshot named by id or name, or from a fork's private snapshot; and the warm pool's own starts."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import phases
from ..config import Settings
from ..errors import InvalidRequestError, NotFoundError, RuntimeFailure
from ..ids import new_sandbox_id
from ..names import DEFAULT_TAG, split_reference
from ..runtime.base import Resources, RuntimeKind, SandboxHandle, SandboxSpec
from ..runtime.oci.layout import SandboxPaths
from ..runtime.registry import StagedRuntime
from ..snapshots import SnapshotManifest, SnapshotRepository
from ..store import (
    EgressPolicy,
    IngressPolicy,
    LifecyclePolicy,
    Requested,
    RuntimeBinding,
    SandboxRecord,
    TemplateRecord,
    TemplateRepo,
    build_id_of,
)
from .agent import DEFAULT_USER, init_agent, init_sandbox, wait_healthy
from .capacity import Capacity
from .egress import install_egress_ca
from .moves import TEMPLATE_SEAL_PREFIX
from .origin import Origin
from .pool import Pooled, WarmPool
from .requests import CreateRequest, ttl_seconds
from .runtimes import AGENT_START_DEADLINE_S, RuntimeSet
from .sandbox import Sandbox
from .sandboxlogs import LogLine, SandboxLogs, agent_lines
from .startcmd import run_start_command
from .states import SandboxState
from .table import SandboxTable

log = logging.getLogger(__name__)

_CLAIMED_AGENT_DEADLINE_S = 2.0
"""A warm-pool sandbox answered /health before; if it does not now, it is dead and the create starts afresh."""



def template_snapshot_name(template_id: str) -> str:
    """The snapshot a gVisor template's creates restore (hidden from the E2B snapshot list)."""
    return f"{TEMPLATE_SEAL_PREFIX}{template_id}"


@dataclass(frozen=True)
class Launch:
    """One sandbox to start: where from, and what the new record says."""

    origin: Origin
    runtime: str | None = None
    """``runc`` or ``gvisor``; None: the origin's."""
    timeout_s: int | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    env_vars: Mapping[str, str] = field(default_factory=dict)
    secure: bool = True
    allow_internet: bool = True
    public_traffic: bool = True
    policy: LifecyclePolicy = field(default_factory=LifecyclePolicy)
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    use_pool: bool = True
    requested: Requested = field(default_factory=Requested)


def _ingress(public: bool) -> IngressPolicy:
    """A private sandbox gets its own traffic token (E2B makes one per sandbox id: forks get new ones)."""
    return IngressPolicy() if public else IngressPolicy(public=False, traffic_token=secrets.token_urlsafe(24))


class Launcher:
    def __init__(
        self,
        *,
        settings: Settings,
        table: SandboxTable,
        capacity: Capacity,
        runtimes: RuntimeSet,
        templates: TemplateRepo,
        snapshots: SnapshotRepository | None,
        clock: Callable[[], float],
        fetch_snapshot: Callable[[str], Awaitable[SnapshotManifest | None]] | None = None,
    ) -> None:
        self._settings = settings
        self._table = table
        self._capacity = capacity
        self._runtimes = runtimes
        self._templates = templates
        self._snapshots = snapshots
        self._fetch_snapshot = fetch_snapshot
        self._clock = clock
        self.logs = SandboxLogs(clock)
        """The start commands' output (:mod:`warren.orchestrator.sandboxlogs`)."""
        self._spare_ids: set[str] = set()
        """Warm-pool sandboxes from their start until the table holds them (claimed) or they are stopped:
        their start command's output is kept under their id, which a claim makes the user's."""
        self.pool = WarmPool(self._pool_start, self._pool_stop, default_size=settings.warm_pool_size,
                             room=capacity.pool_room)  # fmt: skip
        capacity.attach_pool(self.pool)

    async def create(self, req: CreateRequest) -> SandboxRecord:
        """A new sandbox from a template, or from a snapshot named by id or name."""
        origin, current = await self._resolve(req.template)
        return await self.launch(
            Launch(
                origin,
                use_pool=current,
                runtime=req.runtime,
                timeout_s=req.timeout_s,
                metadata=req.metadata,
                env_vars={**origin.env_vars, **req.env_vars},
                secure=req.secure,
                allow_internet=req.allow_internet,
                public_traffic=req.public_traffic,
                policy=req.lifecycle or LifecyclePolicy(),
                egress=req.egress,
                requested=req.requested,
            )
        )

    async def resolve(self, name: str) -> Origin:
        """A template by id, name or ``name:tag`` (its sealed memory snapshot when it has one), else a snapshot.

        The snapshot repository reads manifests from disk: that runs in a worker thread."""
        return (await self._resolve(name))[0]

    async def _resolve(self, name: str) -> tuple[Origin, bool]:
        """The origin, and whether it is a template's current build (what its warm pool holds)."""
        template = await self._templates.find(name)
        if template is None and ":" in name:
            template, current = await self._tagged(name)
            if template is not None and not current:
                return Origin.of_template(template), False
        return await self._resolve_current(name, template), True

    async def _tagged(self, name: str) -> tuple[TemplateRecord | None, bool]:
        """``name:tag``: the build the tag names and whether it is the template's current one; None
        when no template has that name, or none has the tag but a snapshot has the whole name."""
        base, tag = split_reference(name)
        template = await self._templates.find(base)
        if template is None:
            return None, True
        build = await self._templates.tags.build(template, tag or DEFAULT_TAG)
        if build is None:
            snapshots = self._snapshots
            if snapshots is not None and await asyncio.to_thread(snapshots.find, name) is not None:
                return None, True
            raise NotFoundError(f"template '{base}' with tag '{tag}' not found")
        return build, build_id_of(build) == build_id_of(template)

    async def _resolve_current(self, name: str, template: TemplateRecord | None) -> Origin:
        snapshots = self._snapshots
        if snapshots is None:
            if template is None:
                raise NotFoundError(f"template '{name}' not found")
            return Origin.of_template(template)
        if template is not None:
            sealed = await asyncio.to_thread(snapshots.find, template_snapshot_name(template.id))
            if sealed is None:
                return Origin.of_template(template)
            origin = Origin.of_snapshot(sealed, snapshots.data_dir(sealed.snapshot_id))
            return dataclasses.replace(origin, alias=template.name, start_cmd=template.start_cmd)
        manifest = await asyncio.to_thread(snapshots.find, name)
        if manifest is None and self._fetch_snapshot is not None:  # another node's, in the shared store
            manifest = await self._fetch_snapshot(name)
        if manifest is None:
            raise NotFoundError(f"template '{name}' not found")
        return Origin.of_snapshot(manifest, snapshots.data_dir(manifest.snapshot_id))

    async def sandbox_logs(self, sandbox_id: str) -> list[LogLine]:
        """The start command's output and the agent's log (the tail of its ``runtime.log``), oldest first."""
        agent_log = SandboxPaths(self._settings.state_dir / "sandboxes" / sandbox_id).log
        agent = await asyncio.to_thread(agent_lines, agent_log)
        return sorted([*agent, *self.logs.lines(sandbox_id)], key=lambda line: line.at)

    async def launch(self, launch: Launch) -> SandboxRecord:
        """Start one sandbox and hand it its /init, holding a slot of the node's cap throughout (429
        before anything is made when none is free).

        A template create claims a warm-pool sandbox when one is ready; if that sandbox turns out
        dead, the create starts a fresh one instead (once).
        """
        with self._capacity.slot():
            kind = self._runtimes.kind(launch.runtime or launch.origin.runtime)
            source = launch.origin.snapshot_dir
            if source is not None and kind.value != launch.origin.runtime:
                raise InvalidRequestError(f"a {launch.origin.runtime} snapshot cannot start under {kind.value}")
            self._runtimes.available(kind)
            usable = launch.use_pool and source is None and launch.allow_internet and launch.egress.is_open
            pooled = self.pool.claim(launch.origin, kind) if usable else None
            phases.qualify(f"{kind.value}-{'pool' if pooled else 'snapshot' if source else 'cold'}")
            if pooled is not None:
                try:
                    return await self._from_pool(launch, kind, pooled)
                except RuntimeFailure:
                    log.warning("warm-pool sandbox %s was not usable; starting a fresh one", pooled.sandbox_id)
            await self._capacity.make_room()
            return await self._start(launch, kind, None)

    def _record(
        self, launch: Launch, kind: RuntimeKind, sandbox_id: str, staged: StagedRuntime | None, token: str | None
    ) -> SandboxRecord:
        origin = launch.origin
        now = self._clock()
        return SandboxRecord(
            id=sandbox_id,
            template_id=origin.template_id,
            alias=origin.alias,
            runtime=kind.value,
            state=SandboxState.CREATING.value,
            metadata=dict(launch.metadata),
            env_vars=dict(launch.env_vars),
            started_at=now,
            end_at=now + ttl_seconds(self._settings, launch.timeout_s),
            cpu_count=origin.cpu_count,
            memory_mb=origin.memory_mb,
            disk_mb=origin.disk_mb,
            access_token=token,
            address=None,
            allow_internet=launch.allow_internet,
            image=origin.image(),
            policy=launch.policy,
            egress=launch.egress,
            binding=RuntimeBinding(runtime_hash=staged.runtime_hash if staged else None),
            origin=origin.snapshot_id,
            requested=launch.requested,
            ingress=_ingress(launch.public_traffic),
        )

    async def _from_pool(self, launch: Launch, kind: RuntimeKind, pooled: Pooled) -> SandboxRecord:
        """A spare becomes the user's sandbox: claimed as it is, or (gVisor, a start command) started from."""
        try:
            if _started_in_pool(launch.origin, kind):
                return await self._claim(launch, pooled)
            return await self._start(launch, kind, pooled)
        finally:
            self._spare_ids.discard(pooled.sandbox_id)  # the table holds it now, or it is gone

    async def _claim(self, launch: Launch, pooled: Pooled) -> SandboxRecord:
        """A warm-pool sandbox becomes the user's: already /init'ed and its start command ready, so its
        record is saved once, as running. Only a create that adds env vars or wants no token sends one
        more /init (rotating the pool's token; the start command keeps the template's env, as in E2B).
        ``RuntimeFailure`` when the spare does not answer (the caller starts afresh)."""
        handle = pooled.handle
        token = pooled.access_token if launch.secure else None
        record = dataclasses.replace(
            self._record(launch, pooled.kind, pooled.sandbox_id, pooled.staged, token),
            state=SandboxState.RUNNING.value,
            address=handle.address,
        )
        record = dataclasses.replace(record, binding=dataclasses.replace(record.binding, init_pid=handle.init_pid))
        try:
            await wait_healthy(handle.address, handle.agent_port, time.monotonic() + _CLAIMED_AGENT_DEADLINE_S)
            if launch.env_vars or token is None:
                await init_sandbox(record, handle.address, handle.agent_port, previous_token=pooled.access_token)
            await self._table.store.put(record)  # persisted before anyone can see it
        except BaseException:
            await asyncio.shield(self._table.discard(record))
            raise
        self._table.add(record)
        self._table.exits.watch(record.id, handle.init_pid)
        return record

    async def _start(self, launch: Launch, kind: RuntimeKind, pooled: Pooled | None) -> SandboxRecord:
        origin = launch.origin
        staged = (
            pooled.staged
            if pooled
            else await self._runtimes.stage(origin.runtime_hash if origin.snapshot_dir else None, kind)
        )
        sandbox_id = pooled.sandbox_id if pooled else new_sandbox_id()
        token = secrets.token_urlsafe(24) if launch.secure else None
        sandbox = self._table.add(self._record(launch, kind, sandbox_id, staged, token))
        try:
            async with sandbox.lock:
                await sandbox.save(sandbox.record)
                await self._bring_up(sandbox, origin, staged, pooled)
        except BaseException:
            await asyncio.shield(self._table.discard(sandbox))
            raise
        return sandbox.record

    async def _bring_up(
        self, sandbox: Sandbox, origin: Origin, staged: StagedRuntime | None, pooled: Pooled | None
    ) -> None:
        """Start (or take over) the runtime's sandbox, /init its agent, run the start command: running."""
        source = origin.snapshot_dir
        if pooled is not None:
            handle = pooled.handle
        else:
            runtime = self._runtimes.available(sandbox.kind)
            spec = self._runtimes.spec(sandbox.record, staged)
            handle = await (runtime.restore(spec, source) if source is not None else runtime.start(spec))
        sandbox.bind(handle)
        deadline = time.monotonic() + (_CLAIMED_AGENT_DEADLINE_S if pooled else AGENT_START_DEADLINE_S[sandbox.kind])
        await wait_healthy(handle.address, handle.agent_port, deadline)
        previous = pooled.access_token if pooled else origin.agent_token
        await init_sandbox(sandbox.record, handle.address, handle.agent_port, previous_token=previous)
        if sandbox.record.egress.rules:
            runtime = self._runtimes.of(sandbox.kind)
            await install_egress_ca(handle.address, handle.agent_port, sandbox.record.access_token, runtime.egress_ca())
        if source is None:  # a snapshot's processes run already
            await self._run_start_command(origin, sandbox.kind, handle, sandbox.record.access_token, sandbox.id)
        await sandbox.set_state(SandboxState.RUNNING)
        self._table.exits.watch(sandbox.id, handle.init_pid)

    async def _run_start_command(
        self, origin: Origin, kind: RuntimeKind, handle: SandboxHandle, token: str | None, sandbox_id: str
    ) -> None:
        """The template's start command, awaited through its ready command (a no-op without one).

        Its output is followed into :attr:`logs` on runc only: a gVisor checkpoint (pause, snapshot, the
        template's seal) panics in runsc while the node holds that stream open."""
        followed = kind is RuntimeKind.RUNC and bool(origin.start_cmd)
        if followed:  # lines of sandboxes gone since are dropped; spares' are kept for their claim
            self.logs.prune(self._table.known_ids() | self._spare_ids)
        await run_start_command(origin, handle, token, settings=self._settings,
                                logs=self.logs if followed else None, sandbox_id=sandbox_id)  # fmt: skip

    # ----- the warm pool's sandboxes ---------------------------------------------------------------

    async def _pool_start(self, origin: Origin, kind: RuntimeKind) -> Pooled:
        """A sandbox for the warm pool, not in the store: started, /init'ed with its template's env (a
        token of its own), and on runc its start command run through its ready command. Whatever fails
        on the way stops it (``RuntimeFailure`` for the pool to count)."""
        staged = await self._runtimes.stage(None, kind)
        sandbox_id = new_sandbox_id()
        runtime = self._runtimes.available(kind)
        handle = await runtime.start(_spare_spec(origin, kind, sandbox_id, staged))
        self._spare_ids.add(sandbox_id)
        try:
            token = await self._ready_spare(origin, kind, handle)
        except BaseException:
            self._spare_ids.discard(sandbox_id)
            await asyncio.shield(runtime.stop(sandbox_id))
            raise
        return Pooled(sandbox_id, kind, handle, staged, token)

    async def _ready_spare(self, origin: Origin, kind: RuntimeKind, handle: SandboxHandle) -> str:
        """/init a started spare with its template's env only and a new token, then (runc) run its start
        command, as E2B's snapshot taken after it; the token. A gVisor spare's start command runs at its
        claim: gVisor templates with one are sealed as memory snapshots and never pooled, but for a
        template whose seal failed or is still being made."""
        token = secrets.token_urlsafe(24)
        await wait_healthy(handle.address, handle.agent_port, time.monotonic() + AGENT_START_DEADLINE_S[kind])
        await init_agent(
            handle.address,
            handle.agent_port,
            env_vars=origin.env,
            access_token=token,
            default_user=origin.user or DEFAULT_USER,
            default_workdir=origin.workdir,
        )
        if kind is RuntimeKind.RUNC:
            await self._run_start_command(origin, kind, handle, token, handle.sandbox_id)
        return token

    async def _pool_stop(self, pooled: Pooled) -> None:
        try:
            await self._runtimes.of(pooled.kind).stop(pooled.sandbox_id)
        finally:
            self._spare_ids.discard(pooled.sandbox_id)


def _started_in_pool(origin: Origin, kind: RuntimeKind) -> bool:
    """Whether a spare of ``origin`` is ready as it sits on its shelf: its template has no start command,
    or the pool ran it (runc: :meth:`Launcher._ready_spare`)."""
    return not origin.start_cmd or kind is RuntimeKind.RUNC


def _spare_spec(origin: Origin, kind: RuntimeKind, sandbox_id: str, staged: StagedRuntime | None) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id,
        runtime=kind,
        layers=tuple(Path(p) for p in origin.layers),
        resources=Resources(cpu_count=origin.cpu_count, memory_mb=origin.memory_mb, disk_mb=origin.disk_mb),
        runtime_binary=staged.binary if staged else None,
    )
