"""``SandboxManager``: every sandbox of this node, a thin facade over the parts it is given.

    SandboxTable   the sandboxes by id (each a :class:`~.sandbox.Sandbox`: record, lock, transitions),
                   routes, listing, teardown, removal listeners, the exit watcher
    Capacity       the node's sandbox cap and the warm pool's share of it
    Launcher       creates: templates, snapshots, forks' private snapshots, the warm pool
    Transitions    kill, TTL changes, pause, resume/connect, auto-resume
    Timers/Reaper  TTL expiry (a task group, bounded concurrency) and sandboxes whose init exited
    Recovery       what a start finds in the store, settled against the runtimes
    Snapshotter    snapshots, forks, gVisor templates sealed as memory snapshots
    MetricsSampler a 5 s series of each running sandbox's counters (one task for the node)

Each lifecycle operation is timed here, once, and told to the observer (:mod:`.observe`).

:func:`compose` builds the parts from the node's services; tests plug fakes in at the same seams
(the runtimes, the record store, the clock, the fault injector).
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from ..config import Settings
from ..errors import ConflictError, UnavailableError, WarrenError
from ..ids import new_sandbox_id
from ..runtime.base import AGENT_PORT, Runtime, RuntimeKind
from ..runtime.registry import RuntimeRegistry
from ..snapshots import SnapshotManifest, SnapshotRepository
from ..store import (
    EgressPolicy,
    LifecyclePolicy,
    NetworkConfig,
    SandboxRecord,
    SandboxRepo,
    TemplateRecord,
    TemplateRepo,
)
from .capacity import Capacity
from .egress import update_network
from .faults import NO_FAULTS, Faults
from .launcher import Launcher, template_snapshot_name
from .metrics import MetricSample
from .moves import Mover, SharedStore
from .observe import Observe, Operation, Outcome, Timing, no_observe, timed
from .pool import WarmPool
from .recovery import Recovery
from .requests import CreateRequest, ListQuery
from .runtimes import RuntimeSet
from .sampler import MetricsSampler
from .sandbox import Sandbox
from .sandboxlogs import LogLine, SandboxLogs
from .snapshotting import MAX_FORKS, Snapshotter
from .states import SandboxState
from .table import SandboxTable
from .timers import Reaper, Timers
from .transitions import Transitions


@dataclass(frozen=True)
class Parts:
    table: SandboxTable
    capacity: Capacity
    runtimes: RuntimeSet
    launcher: Launcher
    transitions: Transitions
    timers: Timers
    reaper: Reaper
    recovery: Recovery
    snapshotter: Snapshotter
    sampler: MetricsSampler
    mover: Mover
    observe: Observe


def compose(
    *,
    settings: Settings,
    sandboxes: SandboxRepo,
    templates: TemplateRepo,
    runtimes: Mapping[RuntimeKind, Runtime],
    snapshots: SnapshotRepository | None = None,
    registry: RuntimeRegistry | None = None,
    clock: Callable[[], float] = time.time,
    faults: Faults = NO_FAULTS,
    shared: SharedStore | None = None,
    observe: Observe = no_observe,
) -> Parts:
    """The manager's parts wired to each other, each given only what it uses."""
    table = SandboxTable(sandboxes, runtimes)
    capacity = Capacity(settings.max_sandboxes, table)
    rset = RuntimeSet(runtimes, registry)
    mover = Mover(table=table, runtimes=rset, templates=templates, shared=shared, snapshots=snapshots,
                  work_dir=settings.state_dir / "moved", clock=clock)  # fmt: skip
    launcher = Launcher(settings=settings, table=table, capacity=capacity, runtimes=rset, templates=templates,
                        snapshots=snapshots, clock=clock, fetch_snapshot=mover.fetch)  # fmt: skip
    transitions = Transitions(settings=settings, table=table, capacity=capacity, runtimes=rset, faults=faults,
                              clock=clock, mover=mover)  # fmt: skip
    return Parts(
        table=table,
        capacity=capacity,
        runtimes=rset,
        launcher=launcher,
        transitions=transitions,
        timers=Timers(table=table, transitions=transitions, clock=clock, observe=observe),
        reaper=Reaper(table, rset),
        recovery=Recovery(table, rset),
        snapshotter=Snapshotter(
            table=table,
            capacity=capacity,
            runtimes=rset,
            launcher=launcher,
            transitions=transitions,
            snapshots=snapshots,
            clock=clock,
            mover=mover,
        ),
        sampler=MetricsSampler(table, rset, clock),
        mover=mover,
        observe=observe,
    )


class SandboxManager:
    """Owns every sandbox of this node. Admission (503 while draining) and TTL wake-ups are its own;
    everything else is one call into a part."""

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
        faults: Faults = NO_FAULTS,
        shared: SharedStore | None = None,
        observe: Observe = no_observe,
    ) -> None:
        """The node's manager over parts :func:`compose` builds from these services; ``observe`` is told
        how long each lifecycle operation took (:mod:`.observe`)."""
        self._init(compose(settings=settings, sandboxes=sandboxes, templates=templates, runtimes=runtimes,
                           snapshots=snapshots, registry=registry, clock=clock, faults=faults,
                           shared=shared, observe=observe))  # fmt: skip

    @classmethod
    def of_parts(cls, parts: Parts) -> SandboxManager:
        """A manager over parts built elsewhere (tests replacing one part)."""
        manager = cls.__new__(cls)
        manager._init(parts)
        return manager

    def _init(self, parts: Parts) -> None:
        self._parts = parts
        self._draining = False

    @property
    def pool(self) -> WarmPool:
        return self._parts.launcher.pool

    @property
    def logs(self) -> SandboxLogs:
        return self._parts.launcher.logs

    async def sandbox_logs(self, sandbox_id: str) -> builtins.list[LogLine]:
        """The start command's output and the agent's log of a sandbox the API may see, oldest first."""
        self._parts.table.get(sandbox_id)
        return await self._parts.launcher.sandbox_logs(sandbox_id)

    # ----- admission -------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """From now on, new lifecycle operations are refused (503); running ones finish."""
        self._draining = True

    def _admit(self) -> None:
        if self._draining:
            raise UnavailableError("the node is shutting down; try another node")

    def on_removed(self, listener: Callable[[str], Awaitable[None]]) -> None:
        """Await ``listener(sandbox_id)`` whenever a sandbox stops being routable (killed, died, paused)."""
        self._parts.table.on_removed(listener)

    # ----- queries ---------------------------------------------------------------------------------

    def get(self, sandbox_id: str) -> SandboxRecord:
        return self._parts.table.get(sandbox_id).record

    def route(self, sandbox_id: str) -> tuple[str, SandboxState] | None:
        return self._parts.table.route(sandbox_id)

    def traffic_token(self, sandbox_id: str) -> str | None:
        """The token traffic to a private sandbox's ports must carry; None: public, or unknown here."""
        sandbox = self._parts.table.lookup(sandbox_id)
        if sandbox is None or sandbox.record.ingress.public:
            return None
        return sandbox.record.ingress.traffic_token

    def holder_of_token(self, token: str) -> str | None:
        return self._parts.table.holder_of_token(token)

    def list(self, query: ListQuery) -> tuple[builtins.list[SandboxRecord], str | None]:
        return self._parts.table.list(query)

    def ended(self, sandbox_id: str) -> bool:
        """Whether this node lately held a sandbox under this id that is gone (killed, timed out, died)."""
        return self._parts.table.ended(sandbox_id)

    def count(self) -> int:
        return len(self._parts.table)

    def running_ids(self) -> builtins.list[str]:
        return self._parts.table.running_ids()

    def known_ids(self) -> set[str]:
        """Every sandbox id this node's store knows and keeps, in any state (after :meth:`recover`:
        the re-adopted ones); anything else under the node's runtime markers is an orphan."""
        return self._parts.table.known_ids()

    def state_counts(self) -> dict[str, int]:
        """How many sandboxes are in each lifecycle state now (every state, zeros included)."""
        counts = dict.fromkeys((s.value for s in SandboxState), 0)
        for sandbox in self._parts.table:
            counts[sandbox.state.value] += 1
        return counts

    def pool_stats(self) -> dict[str, dict[str, int]]:
        """The warm pool's shelves: ``"<template>/<runtime>"`` -> ready, target, hits, misses."""
        return self._parts.launcher.pool.stats()

    def active_count(self) -> int:
        return self._parts.capacity.active()

    def limits(self) -> dict[str, int]:
        return self._parts.capacity.limits()

    def lifecycle(self, sandbox_id: str) -> LifecyclePolicy:
        return self._parts.transitions.policy(sandbox_id)

    async def metrics(
        self, sandbox_id: str, start: int | None = None, end: int | None = None
    ) -> builtins.list[MetricSample]:
        """The sandbox's 5 s samples within ``[start, end]`` (Unix seconds), oldest first."""
        return await self._parts.sampler.series(sandbox_id, start, end)

    async def latest_metrics(self, sandbox_ids: builtins.list[str]) -> dict[str, MetricSample]:
        """The newest sample of each known sandbox among ``sandbox_ids``."""
        return await self._parts.sampler.latest(sandbox_ids)

    # ----- lifecycle -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _timed(self, operation: Operation, sandbox_id: str) -> Iterator[Timing]:
        """Time an operation on a sandbox this node holds; one on any other is a 404 and not observed."""
        sandbox = self._parts.table.lookup(sandbox_id)
        runtime = sandbox.kind.value if sandbox is not None else None
        with timed(self._parts.observe, operation, runtime, skip=sandbox is None) as timing:
            yield timing

    async def create(self, req: CreateRequest) -> SandboxRecord:
        with timed(self._parts.observe, Operation.CREATE, req.runtime) as timing:
            self._admit()
            record = await self._parts.launcher.create(req)
            timing.runtime = record.runtime
        self._parts.timers.changed()
        return record

    async def update_network(self, sandbox_id: str, egress: EgressPolicy,
                             asked: NetworkConfig | None = None) -> SandboxRecord:
        """``PUT /sandboxes/{id}/network``: replace the sandbox's egress policy."""
        return await update_network(self._parts.table, self._parts.runtimes, sandbox_id, egress, asked)

    async def kill(self, sandbox_id: str) -> None:
        with self._timed(Operation.KILL, sandbox_id):
            await self._parts.transitions.kill(sandbox_id)
        self._parts.timers.changed()

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> SandboxRecord:
        record = await self._parts.transitions.set_timeout(sandbox_id, timeout_s)
        self._parts.timers.changed()
        return record

    async def connect(self, sandbox_id: str, timeout_s: int | None) -> tuple[SandboxRecord, bool]:
        """Resume a paused sandbox, or extend a running one's TTL (never shortening it): (record, resumed).

        Observed as a resume when it resumed, or failed on a sandbox that was paused."""
        with self._timed(Operation.RESUME, sandbox_id) as timing:
            sandbox = self._parts.table.lookup(sandbox_id)
            timing.skip |= sandbox is None or sandbox.state not in (SandboxState.PAUSING, SandboxState.PAUSED)
            self._admit()
            out = await self._parts.transitions.connect(sandbox_id, timeout_s)
            timing.skip = not out[1]
        self._parts.timers.changed()
        return out

    async def resume(self, sandbox_id: str, timeout_s: int | None = None) -> SandboxRecord:
        """Resume a paused sandbox; ``ConflictError`` if it is running."""
        record, resumed = await self.connect(sandbox_id, timeout_s)
        if not resumed:
            raise ConflictError(f"sandbox {sandbox_id} is not paused")
        return record

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxRecord:
        """Pause a running sandbox; ``ConflictError`` (409) if it is already paused."""
        with self._timed(Operation.PAUSE, sandbox_id):
            return await self._parts.transitions.pause(sandbox_id, memory=memory)

    async def wake(self, sandbox_id: str) -> str | None:
        """For proxy traffic to a paused sandbox: resume it if it auto-resumes and return its address.

        None when it does not auto-resume (the proxy answers 502, saying it is paused), unless a connect
        is resuming it right now: then the traffic waits for that resume. Concurrent callers share one
        resume: they queue on the sandbox's lock and find it running.
        """
        if not self._parts.transitions.policy(sandbox_id).auto_resume:
            sandbox = self._parts.table.get(sandbox_id)
            return await self._resumed(sandbox) if sandbox.state is SandboxState.RESUMING else None
        record, _ = await self.connect(sandbox_id, None)
        return record.address

    async def _resumed(self, sandbox: Sandbox) -> str | None:
        """The address of a sandbox a connect is resuming, once that ends (None if it did not run)."""
        async with sandbox.lock:  # the connect holds the lock until the sandbox runs (or failed)
            running = sandbox.state is SandboxState.RUNNING and self._parts.table.holds(sandbox)
            return sandbox.record.address if running else None

    # ----- snapshots -------------------------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, name: str | None = None) -> SnapshotManifest:
        with self._timed(Operation.SNAPSHOT, sandbox_id):
            return await self._parts.snapshotter.snapshot(sandbox_id, name)

    async def fork(
        self, sandbox_id: str, count: int, timeout_s: int | None
    ) -> builtins.list[SandboxRecord | WarrenError]:
        with self._timed(Operation.FORK, sandbox_id) as timing:
            self._admit()
            out = await self._parts.snapshotter.fork(sandbox_id, count, timeout_s)
            if any(isinstance(child, WarrenError) for child in out):
                timing.outcome = Outcome.ERROR
        self._parts.timers.changed()
        return out

    async def seal_template(self, template: TemplateRecord) -> None:
        await self._parts.snapshotter.seal_template(template)

    async def forget_template(self, template: TemplateRecord) -> None:
        await self._parts.snapshotter.forget_template(template)

    # ----- the node's lifetime ---------------------------------------------------------------------

    async def recover(self) -> None:
        """On start: re-adopt what still runs or stays paused; settle half-done transitions; drop the rest."""
        await self._parts.recovery.recover()
        await self._parts.mover.sweep()
        self._parts.timers.changed()

    async def run_timers(self) -> None:
        """Apply TTL timeouts for the node's lifetime."""
        await self._parts.timers.run()

    async def run_metrics(self) -> None:
        """Sample every running sandbox each 5 s bucket, for the node's lifetime."""
        await self._parts.sampler.run()

    async def run_reaper(self) -> None:
        """Remove sandboxes whose init exited while running, for the node's lifetime."""
        await self._parts.reaper.run()

    async def run_mover(self) -> None:
        """Park what pauses in the shared store, for the node's lifetime (returns at once without one)."""
        await self._parts.mover.run()

    # ----- moves between nodes (a shared snapshot store) --------------------------------------------

    @property
    def mover(self) -> Mover:
        return self._parts.mover

    async def adopt(self, sandbox_id: str) -> SandboxRecord:
        """Hold a sandbox another node parked as paused here; its resume restores it."""
        self._admit()
        return await self._parts.mover.adopt(sandbox_id)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot from this node's repository and from the shared store."""
        await self._parts.snapshotter.delete(snapshot_id)
        await self._parts.mover.unpublish(snapshot_id)

    async def release(self, sandbox_id: str) -> None:
        """Drop this node's copy of a paused sandbox that moved to another node."""
        await self._parts.mover.release(sandbox_id)


__all__ = ["AGENT_PORT", "MAX_FORKS", "Parts", "SandboxManager", "compose", "new_sandbox_id", "template_snapshot_name"]
