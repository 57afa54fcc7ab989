"""Snapshots into the repository, forks, and gVisor templates sealed as memory snapshots."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import time
from pathlib import Path

from ..errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RuntimeFailure,
    UnavailableError,
    WarrenError,
)
from ..ids import new_snapshot_id
from ..runtime.base import Runtime, RuntimeKind
from ..snapshots import SnapshotManifest, SnapshotRepository
from ..store import SandboxRecord, TemplateRecord
from .agent import wait_healthy
from .core import MAX_FORKS, _Live, new_sandbox_id, template_snapshot_name
from .lifecycle import LifecycleOps
from .origin import Origin
from .requests import Lifecycle
from .states import SandboxState

log = logging.getLogger(__name__)





class SnapshotOps(LifecycleOps):
    """Snapshots into the repository, forks, and gVisor templates sealed as memory snapshots."""

    # ----- snapshots and forks -------------------------------------------------------------------

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
        if name is not None and repo.find(name) is not None:
            raise ConflictError(f"a snapshot named {name!r} exists already")
        live = self._get_live(sandbox_id)
        snapshot_id = new_snapshot_id()
        async with live.lock:
            self._require(live, SandboxState.RUNNING, SandboxState.PAUSED)
            async with repo.writing(snapshot_id) as data:
                memory = await self._snapshot_locked(live, data)
                manifest = self._manifest(live.record, snapshot_id, (name,) if name else (), memory)
                await repo.commit(data, manifest)
        return manifest

    async def _snapshot_locked(self, live: _Live, dest: Path) -> bool:
        """Fill ``dest`` from the sandbox; follow the source if the runtime moved it (gVisor restore)."""
        runtime = self._available_runtime(RuntimeKind(live.record.runtime))
        running = live.state is SandboxState.RUNNING
        if running:
            self._exits.unwatch(live.record.id)
            await self._removed(live.record.id)  # no open connection may cross a checkpoint (B3)
        try:
            contents = await runtime.snapshot(live.record.id, dest)
        except RuntimeFailure:
            if running and await runtime.state(live.record.id) != "running":
                log.warning("snapshot destroyed sandbox %s; removing it", live.record.id)
                await self._set_state(live, SandboxState.KILLING)
                await asyncio.shield(self._discard(live))
            raise
        finally:
            if running and live.record.id in self._live:
                await self._follow(live, runtime)
        return contents.memory

    async def _follow(self, live: _Live, runtime: Runtime) -> None:
        """Re-read where a running sandbox now lives (a gVisor snapshot restores it in a fresh netns)."""
        handle = await runtime.locate(live.record.id)
        if handle is None:
            return
        if handle.address != live.record.address or handle.init_pid != live.record.extra.get("init_pid"):
            live.record = dataclasses.replace(
                live.record, address=handle.address, extra={**live.record.extra, "init_pid": handle.init_pid}
            )
            await self._sandboxes.put(live.record)
        await wait_healthy(handle.address, handle.agent_port, time.monotonic() + 30)
        self._exits.watch(live.record.id, handle.init_pid)

    def _manifest(self, rec: SandboxRecord, snapshot_id: str, names: tuple[str, ...], memory: bool) -> SnapshotManifest:
        return SnapshotManifest(
            snapshot_id=snapshot_id,
            names=names,
            source_sandbox_id=rec.id,
            template_id=rec.template_id,
            runtime=rec.runtime,
            layers=tuple(rec.extra.get("layers", ())),
            env=dict(rec.extra.get("env", {})),
            workdir=rec.extra.get("workdir"),
            user=rec.extra.get("user"),
            memory=memory,
            created_at=self._clock(),
            cpu_count=rec.cpu_count,
            memory_mb=rec.memory_mb,
            disk_mb=rec.disk_mb,
            env_vars=dict(rec.env_vars),
            metadata=dict(rec.metadata),
            agent_token=rec.access_token if memory else None,
            runtime_hash=rec.extra.get("runtime_hash"),
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
        self._admit()
        self._check_room(count, f"forking {count} sandbox{'es' if count > 1 else ''}")  # before any snapshot
        repo = self._repo()
        live = self._get_live(sandbox_id)
        async with repo.writing("fork-" + new_sandbox_id()) as data:
            async with live.lock:
                self._require(live, SandboxState.RUNNING)
                memory = await self._snapshot_locked(live, data)
            source = live.record
            origin = Origin.of_snapshot(self._manifest(source, "fork", (), memory), data)

            async def child() -> SandboxRecord | WarrenError:
                try:
                    return await self._launch(
                        origin,
                        runtime_name=source.runtime,
                        timeout_s=timeout_s,
                        metadata=source.metadata,
                        env_vars=source.env_vars,
                        secure=source.access_token is not None,
                        allow_internet=source.allow_internet,
                        lifecycle=Lifecycle.of_extra(source.extra),
                    )
                except WarrenError as exc:
                    return exc

            return list(await asyncio.gather(*(child() for _ in range(count))))

    async def seal_template(self, template: TemplateRecord) -> None:
        """gVisor templates with a start command become memory snapshots (E2B's model): start one
        sandbox, let the start command pass its ready check, checkpoint it. Creates then restore that
        image, so the start command's process is alive without being started again. A failure is
        logged and the template keeps working the slow way (start command run at each create)."""
        if template.runtime != RuntimeKind.GVISOR.value or not template.start_cmd or self._snapshots is None:
            return
        name = template_snapshot_name(template.id)
        if (old := self._snapshots.find(name)) is not None:
            await self._snapshots.delete(old.snapshot_id)
        try:
            record = await self._launch(
                Origin.of_template(template),
                runtime_name=None,
                timeout_s=600,
                metadata={},
                env_vars={},
                secure=True,
                allow_internet=True,
                use_pool=False,
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
                await self.kill(record.id)

    async def forget_template(self, template: TemplateRecord) -> None:
        """A template was deleted: drop its sealed snapshot and stop refilling its warm pool."""
        self.pool.forget(template.id)
        if self._snapshots is not None and (sealed := self._snapshots.find(template_snapshot_name(template.id))):
            await self._snapshots.delete(sealed.snapshot_id)
