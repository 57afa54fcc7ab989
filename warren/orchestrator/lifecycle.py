"""Pause, resume, connect and auto-resume; TTL expiry; exit reaping; settling state after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from ..errors import (
    ConflictError,
    NotFoundError,
    RuntimeFailure,
    WarrenError,
)
from ..runtime.base import PauseMode, RuntimeKind
from ..store import SandboxRecord
from .agent import wait_healthy
from .core import _AGENT_START_DEADLINE_S, ManagerCore, _Live
from .requests import Lifecycle
from .states import SandboxState

log = logging.getLogger(__name__)





class LifecycleOps(ManagerCore):
    """Pause, resume, connect, auto-resume, TTL expiry, exit reaping, and recovery after a restart."""

    async def wake(self, sandbox_id: str) -> str | None:
        """For proxy traffic to a paused sandbox: resume it if it auto-resumes and return its address.

        None when it does not auto-resume (the proxy answers 410). Concurrent callers share one
        resume: they queue on the sandbox's lock and find it running.
        """
        live = self._get_live(sandbox_id)
        if not Lifecycle.of_extra(live.record.extra).auto_resume:
            return None
        record, _ = await self.connect(sandbox_id, None)
        return record.address

    def lifecycle(self, sandbox_id: str) -> Lifecycle:
        return Lifecycle.of_extra(self._get_live(sandbox_id).record.extra)

    async def connect(self, sandbox_id: str, timeout_s: int | None) -> tuple[SandboxRecord, bool]:
        """Resume a paused sandbox, or extend a running one's TTL (never shortening it).

        Returns (record, resumed).
        """
        self._admit()
        live = self._get_live(sandbox_id)
        end_at = self._clock() + self._timeout(timeout_s)
        resumed = False
        async with live.lock:
            if live.state is SandboxState.PAUSED:
                with self._sandbox_slot():  # a resumed sandbox holds a slot again (429 when none is free)
                    await self._resume_locked(live)
                resumed = True
            if end_at > live.record.end_at or resumed:
                record = dataclasses.replace(live.record, end_at=end_at)
                await self._sandboxes.put(record)
                live.record = record
        self._ttl_changed.set()
        return live.record, resumed

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxRecord:
        """Pause a running sandbox; ``ConflictError`` (409) if it is already paused."""
        live = self._get_live(sandbox_id)
        async with live.lock:
            if live.state in (SandboxState.PAUSED, SandboxState.PAUSING):
                raise ConflictError(f"sandbox {sandbox_id} is already paused")
            await self._pause_locked(live, PauseMode.MEMORY if memory else PauseMode.FILESYSTEM)
        return live.record

    async def _pause_locked(self, live: _Live, mode: PauseMode) -> None:
        runtime = self._runtimes[RuntimeKind(live.record.runtime)]
        # The mode is recorded with PAUSING, so a crash mid-pause still knows how to resume.
        live.record = dataclasses.replace(live.record, extra={**live.record.extra, "pause_mode": mode.value})
        await self._set_state(live, SandboxState.PAUSING)
        self._exits.unwatch(live.record.id)
        await self._removed(live.record.id)
        try:
            await runtime.pause(live.record.id, mode)
            await self._test_stall("pause")
        except RuntimeFailure:
            if await runtime.state(live.record.id) == "running":
                await self._set_state(live, SandboxState.RUNNING)
                self._exits.watch(live.record.id, live.record.extra.get("init_pid"))
            else:
                log.warning("pause destroyed sandbox %s; removing it", live.record.id)
                await self._set_state(live, SandboxState.KILLING)
                await asyncio.shield(self._discard(live))
            raise
        await self._set_state(live, SandboxState.PAUSED)
        self.pool.poke()  # its slot of the sandbox cap is free

    async def resume(self, sandbox_id: str, timeout_s: int | None = None) -> SandboxRecord:
        """Resume a paused sandbox; ``ConflictError`` if it is running."""
        record, resumed = await self.connect(sandbox_id, timeout_s)
        if not resumed:
            raise ConflictError(f"sandbox {sandbox_id} is not paused")
        return record

    async def _resume_locked(self, live: _Live) -> None:
        kind = RuntimeKind(live.record.runtime)
        runtime = self._available_runtime(kind)
        mode = PauseMode(live.record.extra.get("pause_mode", PauseMode.MEMORY.value))
        recorded = live.record.extra.get("runtime_hash")
        staged = await self._stage(recorded, kind) if recorded else None
        await self._set_state(live, SandboxState.RESUMING)
        try:
            handle = await runtime.resume(self._spec(live.record, staged), mode)
            await self._test_stall("resume")
            live.record = dataclasses.replace(
                live.record, address=handle.address, extra={**live.record.extra, "init_pid": handle.init_pid}
            )
            await wait_healthy(handle.address, handle.agent_port, time.monotonic() + _AGENT_START_DEADLINE_S[kind])
            if mode is PauseMode.FILESYSTEM:
                await self._init(live, handle.address, handle.agent_port, previous_token=None)
        except BaseException:
            await asyncio.shield(self._set_state(live, SandboxState.PAUSED))
            raise
        await self._set_state(live, SandboxState.RUNNING)
        self._exits.watch(live.record.id, handle.init_pid)

    # ----- background ----------------------------------------------------------------------------

    async def run_timers(self) -> None:
        """Kill sandboxes whose TTL expired. Runs for the node's lifetime."""
        while True:
            self._ttl_changed.clear()
            now = self._clock()
            expired = [
                lv.record.id
                for lv in self._live.values()
                if lv.state is SandboxState.RUNNING and lv.record.end_at <= now
            ]
            for sandbox_id in expired:
                await self._expire(sandbox_id)
            pending = [lv.record.end_at for lv in self._live.values() if lv.state is SandboxState.RUNNING]
            wait = min(pending) - self._clock() if pending else 3600.0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, min(wait, 3600.0))):
                    await self._ttl_changed.wait()

    async def _expire(self, sandbox_id: str) -> None:
        live = self._live.get(sandbox_id)
        if live is None:
            return
        policy = Lifecycle.of_extra(live.record.extra)
        try:
            if policy.on_timeout == "pause":
                log.info("sandbox %s reached its timeout; pausing", sandbox_id)
                await self.pause(sandbox_id, memory=policy.pause_memory)
            else:
                log.info("sandbox %s reached its timeout; killing", sandbox_id)
                await self.kill(sandbox_id)
        except (NotFoundError, ConflictError):
            pass
        except WarrenError as exc:
            log.warning("timeout action on %s failed: %s", sandbox_id, exc)

    async def run_reaper(self) -> None:
        """Remove sandboxes whose init process exited while they were running. Runs for the node's lifetime."""
        try:
            while True:
                sandbox_id = await self._exits.exited.get()
                live = self._live.get(sandbox_id)
                if live is None or live.state is not SandboxState.RUNNING:
                    continue
                async with live.lock:
                    if live.state is not SandboxState.RUNNING or self._live.get(sandbox_id) is not live:
                        continue
                    runtime = self._runtimes[RuntimeKind(live.record.runtime)]
                    if await runtime.state(sandbox_id) == "running":
                        self._exits.watch(sandbox_id, live.record.extra.get("init_pid"))
                        continue
                    log.warning("sandbox %s stopped on its own (crash or OOM); removing it", sandbox_id)
                    await self._set_state(live, SandboxState.KILLING)
                    await asyncio.shield(self._discard(live))
        finally:
            self._exits.close()

    async def _finish_resume(self, live: _Live) -> None:
        """A crash hit after the runtime resumed but maybe before /init: hand it its /init again."""
        runtime = self._runtimes[RuntimeKind(live.record.runtime)]
        handle = await runtime.locate(live.record.id)
        if handle is None:
            return
        live.record = dataclasses.replace(
            live.record, address=handle.address, extra={**live.record.extra, "init_pid": handle.init_pid}
        )
        await self._sandboxes.put(live.record)
        if live.record.extra.get("pause_mode") == PauseMode.FILESYSTEM.value:
            await wait_healthy(handle.address, handle.agent_port, time.monotonic() + 30)
            await self._init(live, handle.address, handle.agent_port, previous_token=live.record.access_token)

    async def recover(self) -> None:
        """On start: re-adopt what still runs or stays paused; settle half-done transitions; drop the rest.

        A crash mid-pause ends paused if the runtime finished the pause, else running; mid-resume ends
        running if the runtime finished, else paused. Anything else without a live runtime is removed
        with its artifacts.
        """
        for record in await self._sandboxes.all():
            runtime = self._runtimes.get(RuntimeKind(record.runtime))
            actual = await runtime.state(record.id) if runtime else None
            target = _settle(SandboxState(record.state), actual)
            if target is None or (target is SandboxState.RUNNING and not record.address):
                log.info("dropping sandbox %s (record %s, runtime %s)", record.id, record.state, actual)
                await self._discard(_Live(record))
                continue
            live = _Live(dataclasses.replace(record, state=target.value))
            if target.value != record.state:
                await self._sandboxes.put(live.record)
                log.info("sandbox %s: %s at crash, now %s", record.id, record.state, target.value)
            self._live[record.id] = live
            if target is SandboxState.RUNNING and record.state == SandboxState.RESUMING.value:
                await self._finish_resume(live)
            if target is SandboxState.RUNNING:
                self._exits.watch(record.id, record.extra.get("init_pid"))
            log.info("re-adopted sandbox %s (%s)", record.id, target.value)
        self._ttl_changed.set()



def _settle(recorded: SandboxState, actual: str | None) -> SandboxState | None:
    """Where a sandbox found at start-up stands, from its record and the runtime's view."""
    if actual == "running" and recorded in (SandboxState.RUNNING, SandboxState.PAUSING, SandboxState.RESUMING):
        return SandboxState.RUNNING
    if actual == "paused" and recorded in (SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.RESUMING):
        return SandboxState.PAUSED
    return None


