"""Operations on one existing sandbox: kill, TTL changes, pause, resume/connect and auto-resume."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from .. import phases
from ..config import Settings
from ..errors import ConflictError, NotFoundError, RuntimeFailure
from ..runtime.base import PauseMode, RuntimeState
from ..store import LifecyclePolicy, SandboxRecord
from .agent import init_sandbox, wait_healthy
from .capacity import Capacity
from .egress import install_egress_ca
from .faults import FaultPoint, Faults
from .moves import Mover
from .requests import ttl_seconds
from .runtimes import AGENT_START_DEADLINE_S, RuntimeSet
from .sandbox import Sandbox
from .states import SandboxState
from .table import SandboxTable

log = logging.getLogger(__name__)


class Transitions:
    def __init__(
        self,
        *,
        settings: Settings,
        table: SandboxTable,
        capacity: Capacity,
        runtimes: RuntimeSet,
        faults: Faults,
        clock: Callable[[], float],
        mover: Mover | None = None,
    ) -> None:
        self._settings = settings
        self._mover = mover
        self._table = table
        self._capacity = capacity
        self._runtimes = runtimes
        self._faults = faults
        self._clock = clock

    async def kill(self, sandbox_id: str) -> None:
        sandbox = self._table.get(sandbox_id)
        async with sandbox.lock:
            if not self._table.holds(sandbox) or sandbox.state is SandboxState.KILLING:
                raise NotFoundError(f"sandbox {sandbox_id} not found")
            await sandbox.set_state(SandboxState.KILLING)
            await asyncio.shield(self._table.discard(sandbox))

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> SandboxRecord:
        sandbox = self._table.get(sandbox_id)
        end_at = self._clock() + ttl_seconds(self._settings, timeout_s)  # 400 when negative
        async with sandbox.lock:
            return await sandbox.update(end_at=end_at)

    def policy(self, sandbox_id: str) -> LifecyclePolicy:
        return self._table.get(sandbox_id).record.policy

    async def connect(self, sandbox_id: str, timeout_s: int | None) -> tuple[SandboxRecord, bool]:
        """Resume a paused sandbox, or extend a running one's TTL (never shortening it).

        Returns (record, resumed).
        """
        sandbox = self._table.get(sandbox_id)
        end_at = self._clock() + ttl_seconds(self._settings, timeout_s)
        resumed = False
        async with sandbox.lock:
            if sandbox.state is SandboxState.PAUSED:
                with self._capacity.slot():  # a resumed sandbox holds a slot again (429 when none is free)
                    await self._resume_locked(sandbox, end_at=end_at)
                resumed = True
            elif end_at > sandbox.record.end_at:
                with phases.phase("save.end_at"):
                    await sandbox.update(end_at=end_at)
        return sandbox.record, resumed

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxRecord:
        """Pause a running sandbox; ``ConflictError`` (409) if it is already paused."""
        sandbox = self._table.get(sandbox_id)
        async with sandbox.lock:
            if sandbox.state in (SandboxState.PAUSED, SandboxState.PAUSING):
                raise ConflictError(f"sandbox {sandbox_id} is already paused")
            await self.pause_locked(sandbox, PauseMode.MEMORY if memory else PauseMode.FILESYSTEM)
        return sandbox.record

    async def pause_locked(self, sandbox: Sandbox, mode: PauseMode) -> None:
        runtime = self._runtimes.of(sandbox.kind)
        phases.qualify(sandbox.kind.value)
        # The mode is recorded with PAUSING, so a crash mid-pause still knows how to resume.
        sandbox.stage(binding=dataclasses.replace(sandbox.record.binding, pause_mode=mode))
        with phases.phase("save.pausing"):
            await sandbox.set_state(SandboxState.PAUSING)
        with phases.phase("unroute"):
            await self._table.unroute(sandbox.id)
        try:
            with phases.phase("runtime.pause"):
                await runtime.pause(sandbox.id, mode)
            await self._faults.reached(FaultPoint.PAUSE)
        except RuntimeFailure:
            if await runtime.state(sandbox.id) == RuntimeState.RUNNING:
                await sandbox.set_state(SandboxState.RUNNING)
                self._table.exits.watch(sandbox.id, sandbox.record.binding.init_pid)
            else:
                log.warning("pause destroyed sandbox %s; removing it", sandbox.id)
                await sandbox.set_state(SandboxState.KILLING)
                await asyncio.shield(self._table.discard(sandbox))
            raise
        with phases.phase("save.paused"):
            await sandbox.set_state(SandboxState.PAUSED)
        self._capacity.freed()
        if self._mover is not None:
            self._mover.paused(sandbox.id)

    async def _resume_locked(self, sandbox: Sandbox, *, end_at: float) -> None:
        """Resume; the new ``end_at`` is saved with the RUNNING state (one write, not two)."""
        kind = sandbox.kind
        runtime = self._runtimes.available(kind)
        phases.qualify(kind.value)
        binding = sandbox.record.binding
        mode = binding.pause_mode or PauseMode.MEMORY
        staged = await self._runtimes.stage(binding.runtime_hash, kind) if binding.runtime_hash else None
        with phases.phase("save.resuming"):
            await sandbox.set_state(SandboxState.RESUMING)
        try:
            spec = self._runtimes.spec(sandbox.record, staged)
            with phases.phase("runtime.resume"):
                if binding.restore_dir is not None:  # moved here from another node: restored from its copy
                    handle = await runtime.restore(spec, Path(binding.restore_dir))
                else:
                    handle = await runtime.resume(spec, mode)
            await self._faults.reached(FaultPoint.RESUME)
            sandbox.bind(handle)
            with phases.phase("agent.healthy"):
                await wait_healthy(handle.address, handle.agent_port, time.monotonic() + AGENT_START_DEADLINE_S[kind])
            if mode is PauseMode.FILESYSTEM:
                await init_sandbox(sandbox.record, handle.address, handle.agent_port, previous_token=None)
            if sandbox.record.egress.rules:  # rules set while it was paused: it must trust the egress CA
                await install_egress_ca(handle.address, handle.agent_port, sandbox.record.access_token,
                                        runtime.egress_ca())
        except BaseException:
            await asyncio.shield(sandbox.set_state(SandboxState.PAUSED))
            raise
        sandbox.stage(end_at=end_at)
        with phases.phase("save.running"):
            await sandbox.set_state(SandboxState.RUNNING)
        self._table.exits.watch(sandbox.id, handle.init_pid)
        if self._mover is not None:
            await self._mover.restored(sandbox)
            await self._mover.resumed(sandbox.id)
