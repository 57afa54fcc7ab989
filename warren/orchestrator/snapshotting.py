"""Snapshots into the repository, forks, and gVisor templates sealed as memory snapshots."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ConflictError, InvalidRequestError, NotFoundError, RuntimeFailure, UnavailableError, WarrenError
from ..ids import new_sandbox_id, new_snapshot_id
from ..runtime.base import Runtime, RuntimeKind, RuntimeState
from ..snapshots import SnapshotManifest, SnapshotRepository
from ..store import SandboxRecord, TemplateRecord
from .agent import wait_healthy
from .capacity import Capacity
from .launcher import Launch, Launcher, template_snapshot_name
from .moves import Mover
from .origin import Origin
from .runtimes import RuntimeSet
from .sandbox import Sandbox
from .states import SandboxState
from .table import SandboxTable
from .transitions import Transitions

log = logging.getLogger(__name__)

MAX_FORKS = 100
"""E2B's limit (``SandboxForkRequest.count``, 1-100)."""
_FOLLOW_DEADLINE_S = 30.0
_SEAL_TIMEOUT_S = 600


class Snapshotter:
    def __init__(
        self,
        *,
        table: SandboxTable,
        capacity: Capacity,
        runtimes: RuntimeSet,
        launcher: Launcher,
        transitions: Transitions,
        snapshots: SnapshotRepository | None,
        clock: Callable[[], float],
        mover: Mover | None = None,
    ) -> None:
        self._mover = mover
        self._table = table
        self._capacity = capacity
        self._runtimes = runtimes
        self._launcher = launcher
        self._transitions = transitions
        self._snapshots = snapshots
        self._clock = clock

    def _repo(self) -> SnapshotRepository:
        if self._snapshots is None:
            raise UnavailableError("this node has no snapshot repository")
        return self._snapshots

    async def snapshot(self, sandbox_id: str, name: str | None = None) -> SnapshotManifest:
        """Snapshot a running or paused sandbox into the repository; the source keeps its state.

        A paused sandbox is snapshotted as it is (its checkpoint and upper dir are copied) and stays
        paused. Names are unique across snapshots (409 otherwise).
        """
        repo = self._repo()
        if name is not None and await asyncio.to_thread(repo.find, name) is not None:
            raise ConflictError(f"a snapshot named {name!r} exists already")
        sandbox = self._table.get(sandbox_id)
        snapshot_id = new_snapshot_id()
        async with sandbox.lock:
            sandbox.require(SandboxState.RUNNING, SandboxState.PAUSED)
            async with repo.writing(snapshot_id) as data:
                memory = await self._snapshot_locked(sandbox, data)
                manifest = self._manifest(sandbox.record, snapshot_id, (name,) if name else (), memory)
                await repo.commit(data, manifest)
        if self._mover is not None:
            self._mover.snapshotted(snapshot_id)
        return manifest

    async def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot from the repository (by id)."""
        await self._repo().delete(snapshot_id)

    async def _snapshot_locked(self, sandbox: Sandbox, dest: Path) -> bool:
        """Fill ``dest`` from the sandbox; follow the source if the runtime moved it (gVisor restore)."""
        runtime = self._runtimes.available(sandbox.kind)
        running = sandbox.state is SandboxState.RUNNING
        if running:
            await self._table.unroute(sandbox.id)  # no open connection may cross a checkpoint (B3)
        try:
            contents = await runtime.snapshot(sandbox.id, dest)
        except RuntimeFailure:
            if running and await runtime.state(sandbox.id) != RuntimeState.RUNNING:
                log.warning("snapshot destroyed sandbox %s; removing it", sandbox.id)
                await sandbox.set_state(SandboxState.KILLING)
                await asyncio.shield(self._table.discard(sandbox))
            raise
        finally:
            if running and self._table.holds(sandbox):
                await self._follow(sandbox, runtime)
        return contents.memory

    async def _follow(self, sandbox: Sandbox, runtime: Runtime) -> None:
        """Re-read where a running sandbox now lives (a gVisor snapshot restores it in a fresh netns)."""
        handle = await runtime.locate(sandbox.id)
        if handle is None:
            return
        if handle.address != sandbox.record.address or handle.init_pid != sandbox.record.binding.init_pid:
            sandbox.bind(handle)
            await sandbox.save(sandbox.record)
        await wait_healthy(handle.address, handle.agent_port, time.monotonic() + _FOLLOW_DEADLINE_S)
        self._table.exits.watch(sandbox.id, handle.init_pid)

    def _manifest(self, rec: SandboxRecord, snapshot_id: str, names: tuple[str, ...], memory: bool) -> SnapshotManifest:
        return SnapshotManifest(
            snapshot_id=snapshot_id,
            names=names,
            source_sandbox_id=rec.id,
            template_id=rec.template_id,
            runtime=rec.runtime,
            layers=rec.image.layers,
            env=dict(rec.image.env),
            workdir=rec.image.workdir,
            user=rec.image.user,
            memory=memory,
            created_at=self._clock(),
            cpu_count=rec.cpu_count,
            memory_mb=rec.memory_mb,
            disk_mb=rec.disk_mb,
            env_vars=dict(rec.env_vars),
            metadata=dict(rec.metadata),
            agent_token=rec.access_token if memory else None,
            runtime_hash=rec.binding.runtime_hash,
        )

    async def fork(
        self, sandbox_id: str, count: int, timeout_s: int | None
    ) -> builtins.list[SandboxRecord | WarrenError]:
        """``count`` independent children of a running sandbox; the source keeps running.

        Each child is a fresh sandbox (new id, token, netns) restored from one private snapshot
        taken at this moment; the snapshot is discarded afterwards. Per-child failures are returned.
        """
        if not 1 <= count <= MAX_FORKS:
            raise InvalidRequestError(f"count must be between 1 and {MAX_FORKS}")
        sandbox = self._table.get(sandbox_id)
        sandbox.require(SandboxState.RUNNING)  # 409 for a paused source, before the node's cap (429)
        self._capacity.check(count, f"forking {count} sandbox{'es' if count > 1 else ''}")  # before any snapshot
        repo = self._repo()
        async with repo.writing("fork-" + new_sandbox_id()) as data:
            async with sandbox.lock:
                sandbox.require(SandboxState.RUNNING)
                memory = await self._snapshot_locked(sandbox, data)
            source = sandbox.record
            launch = Launch(
                Origin.of_snapshot(self._manifest(source, "fork", (), memory), data),
                runtime=source.runtime,
                timeout_s=timeout_s,
                metadata=source.metadata,
                env_vars=source.env_vars,
                secure=source.access_token is not None,
                allow_internet=source.allow_internet,
                public_traffic=source.ingress.public,
                policy=source.policy,
                egress=source.egress,
                requested=source.requested,
            )

            async def child() -> SandboxRecord | WarrenError:
                try:
                    return await self._launcher.launch(launch)
                except WarrenError as exc:
                    return exc

            async with asyncio.TaskGroup() as group:
                children = [group.create_task(child(), name=f"fork-{sandbox_id}-{i}") for i in range(count)]
            return [task.result() for task in children]

    async def seal_template(self, template: TemplateRecord) -> None:
        """gVisor templates with a start command become memory snapshots (E2B's model): start one
        sandbox, let the start command pass its ready check, checkpoint it. Creates then restore that
        image, so the start command's process is alive without being started again. A failure is
        logged and the template keeps working the slow way (start command run at each create)."""
        if template.runtime != RuntimeKind.GVISOR.value or not template.start_cmd or self._snapshots is None:
            return
        name = template_snapshot_name(template.id)
        if (old := await asyncio.to_thread(self._snapshots.find, name)) is not None:
            await self._snapshots.delete(old.snapshot_id)
        try:
            record = await self._launcher.launch(
                Launch(Origin.of_template(template), timeout_s=_SEAL_TIMEOUT_S, use_pool=False)
            )
        except WarrenError as exc:
            log.warning("template %s: could not start it for its memory snapshot: %s", template.name, exc)
            return
        try:
            await self.snapshot(record.id, name)
            log.info("template %s sealed as a gVisor memory snapshot", template.name)
        except WarrenError as exc:
            log.warning("template %s: memory snapshot failed: %s", template.name, exc)
        finally:
            with contextlib.suppress(NotFoundError):
                await self._transitions.kill(record.id)

    async def forget_template(self, template: TemplateRecord) -> None:
        """A template was deleted: drop its sealed snapshot and stop refilling its warm pool."""
        self._launcher.pool.forget(template.id)
        if self._snapshots is None:
            return
        sealed = await asyncio.to_thread(self._snapshots.find, template_snapshot_name(template.id))
        if sealed is not None:
            await self._snapshots.delete(sealed.snapshot_id)
