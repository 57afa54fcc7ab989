"""At start: re-adopt what still runs or stays paused, settle half-done transitions, drop the rest.

A crash mid-pause ends paused if the runtime finished the pause, else running; mid-resume ends
running if the runtime finished, else paused. Anything else without a live runtime is removed with
its artifacts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from .. import trees
from ..runtime.base import PauseMode, RuntimeKind, RuntimeState
from .agent import init_sandbox, wait_healthy
from .runtimes import RuntimeSet
from .sandbox import Sandbox
from .states import SandboxState
from .table import SandboxTable

log = logging.getLogger(__name__)

_FINISH_RESUME_DEADLINE_S = 30.0
_WAITING = (SandboxState.PAUSED.value, SandboxState.RESUMING.value)


def settle(recorded: SandboxState, actual: RuntimeState | None) -> SandboxState | None:
    """Where a sandbox found at start-up stands, from its record and the runtime's view; None: drop it."""
    if actual == RuntimeState.RUNNING and recorded in (
        SandboxState.RUNNING, SandboxState.PAUSING, SandboxState.RESUMING,
    ):  # fmt: skip
        return SandboxState.RUNNING
    if actual == RuntimeState.PAUSED and recorded in (
        SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.RESUMING,
    ):  # fmt: skip
        return SandboxState.PAUSED
    return None


class Recovery:
    def __init__(self, table: SandboxTable, runtimes: RuntimeSet) -> None:
        self._table = table
        self._runtimes = runtimes

    async def recover(self) -> None:
        for record in await self._table.store.all():
            runtime = self._runtimes.all.get(RuntimeKind(record.runtime))
            actual = await runtime.state(record.id) if runtime else None
            target = settle(SandboxState(record.state), actual)
            moved = record.binding.restore_dir
            if moved is not None and actual is None and record.state in _WAITING:
                target = SandboxState.PAUSED  # moved here, not restored yet: its copy is in restore_dir
            if target is None or (target is SandboxState.RUNNING and not record.address):
                log.info("dropping sandbox %s (record %s, runtime %s)", record.id, record.state, actual)
                await self._table.discard(record)
                continue
            sandbox = self._table.add(record)
            if target.value != record.state:
                await sandbox.update(state=target.value)
                log.info("sandbox %s: %s at crash, now %s", record.id, record.state, target.value)
            if target is SandboxState.RUNNING and record.state == SandboxState.RESUMING.value:
                await self._finish_resume(sandbox)
            if target is SandboxState.RUNNING and moved is not None:  # restored just before the crash
                await sandbox.update(binding=dataclasses.replace(sandbox.record.binding, restore_dir=None))
                await asyncio.to_thread(trees.remove_tree, moved)
            if target is SandboxState.RUNNING:
                self._table.exits.watch(record.id, sandbox.record.binding.init_pid)
            log.info("re-adopted sandbox %s (%s)", record.id, target.value)

    async def _finish_resume(self, sandbox: Sandbox) -> None:
        """A crash hit after the runtime resumed but maybe before /init: hand it its /init again."""
        handle = await self._runtimes.of(sandbox.kind).locate(sandbox.id)
        if handle is None:
            return
        sandbox.bind(handle)
        await sandbox.save(sandbox.record)
        if sandbox.record.binding.pause_mode is PauseMode.FILESYSTEM:
            await wait_healthy(handle.address, handle.agent_port, time.monotonic() + _FINISH_RESUME_DEADLINE_S)
            await init_sandbox(
                sandbox.record, handle.address, handle.agent_port, previous_token=sandbox.record.access_token
            )
