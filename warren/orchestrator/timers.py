"""Background work for the node's lifetime: TTL expiry and reaping sandboxes whose init exited.

Expiry runs each expired sandbox's timeout action as its own task in one TaskGroup, at most
``concurrency`` at a time, so one slow checkpoint does not hold up the other expiries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..errors import ConflictError, NotFoundError, WarrenError
from ..runtime.base import RuntimeState
from ..store import OnTimeout
from .observe import Observe, Operation, no_observe, timed
from .runtimes import RuntimeSet
from .states import SandboxState
from .table import SandboxTable
from .transitions import Transitions

log = logging.getLogger(__name__)

DEFAULT_EXPIRY_CONCURRENCY = 4
_MAX_WAIT_S = 3600.0


class Timers:
    def __init__(
        self,
        *,
        table: SandboxTable,
        transitions: Transitions,
        clock: Callable[[], float],
        concurrency: int = DEFAULT_EXPIRY_CONCURRENCY,
        observe: Observe = no_observe,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._table = table
        self._transitions = transitions
        self._clock = clock
        self._observe = observe
        self._changed = asyncio.Event()
        self._gate = asyncio.Semaphore(concurrency)
        self._expiring: set[str] = set()
        """Sandboxes whose timeout action is under way (not started again meanwhile)."""

    def changed(self) -> None:
        """A TTL or the set of running sandboxes changed: look again when the next one ends."""
        self._changed.set()

    async def run(self) -> None:
        """Apply the timeout action of sandboxes whose TTL ended. Runs for the node's lifetime."""
        async with asyncio.TaskGroup() as group:
            while True:
                self._changed.clear()
                now = self._clock()
                running = [
                    sb.record for sb in self._table if sb.state is SandboxState.RUNNING and sb.id not in self._expiring
                ]
                for record in running:
                    if record.end_at <= now:
                        self._expiring.add(record.id)
                        group.create_task(self._expire(record.id), name=f"expire-{record.id}")
                pending = [r.end_at for r in running if r.end_at > now]
                wait = min(pending) - self._clock() if pending else _MAX_WAIT_S
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.01, min(wait, _MAX_WAIT_S))):
                        await self._changed.wait()

    async def _expire(self, sandbox_id: str) -> None:
        try:
            async with self._gate:
                sandbox = self._table.lookup(sandbox_id)
                if sandbox is None:
                    return
                policy = sandbox.record.policy
                if policy.on_timeout is OnTimeout.PAUSE:
                    log.info("sandbox %s reached its timeout; pausing", sandbox_id)
                    with timed(self._observe, Operation.PAUSE, sandbox.kind.value):
                        await self._transitions.pause(sandbox_id, memory=policy.pause_memory)
                else:
                    log.info("sandbox %s reached its timeout; killing", sandbox_id)
                    with timed(self._observe, Operation.KILL, sandbox.kind.value):
                        await self._transitions.kill(sandbox_id)
        except (NotFoundError, ConflictError):
            pass
        except WarrenError as exc:
            log.warning("timeout action on %s failed: %s", sandbox_id, exc)
        finally:
            self._expiring.discard(sandbox_id)
            self._changed.set()


class Reaper:
    """Removes sandboxes whose init process exited while they were running (crash, OOM)."""

    def __init__(self, table: SandboxTable, runtimes: RuntimeSet) -> None:
        self._table = table
        self._runtimes = runtimes

    async def run(self) -> None:
        """Runs for the node's lifetime."""
        exits = self._table.exits
        try:
            while True:
                sandbox_id = await exits.exited.get()
                sandbox = self._table.lookup(sandbox_id)
                if sandbox is None or sandbox.state is not SandboxState.RUNNING:
                    continue
                async with sandbox.lock:
                    if sandbox.state is not SandboxState.RUNNING or not self._table.holds(sandbox):
                        continue
                    if await self._runtimes.of(sandbox.kind).state(sandbox_id) == RuntimeState.RUNNING:
                        exits.watch(sandbox_id, sandbox.record.binding.init_pid)
                        continue
                    log.warning("sandbox %s stopped on its own (crash or OOM); removing it", sandbox_id)
                    await sandbox.set_state(SandboxState.KILLING)
                    await asyncio.shield(self._table.discard(sandbox))
        finally:
            exits.close()
