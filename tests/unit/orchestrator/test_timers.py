"""TTL expiry runs each timeout action as its own task: one slow checkpoint does not hold up the others.

The runtime is a fake whose pause waits on an event (the seam where runc cannot run unprivileged);
concurrency is shown with events, never timings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.orchestrator import CreateRequest, SandboxManager, SandboxState
from warren.orchestrator.requests import Lifecycle
from warren.runtime.base import PauseMode, RuntimeKind
from warren.store import Database, OnTimeout, SandboxRepo, TemplateRecord, TemplateRepo


class GatedPauseRuntime(FakeRuntime):
    """Each pause waits until :attr:`release` is set; :attr:`in_flight` counts the waiting ones."""

    def __init__(self, agent: FakeAgent) -> None:
        super().__init__(RuntimeKind.RUNC, agent)
        self.release = asyncio.Event()
        self.in_flight: set[str] = set()
        self.changed = asyncio.Event()

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None:
        self.in_flight.add(sandbox_id)
        self.changed.set()
        await self.release.wait()
        self.in_flight.discard(sandbox_id)


async def _until(predicate: Callable[[], bool]) -> None:
    """Yield until ``predicate`` holds (record saves run in a worker thread)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never became true")


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_slow_pause_does_not_delay_other_expiries(tmp_path: Path) -> None:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(
        TemplateRecord("t1", "base", "runc", ("/l",), {}, None, None, None, None, 1, 256, 1024, 0.0)
    )
    runtime = GatedPauseRuntime(agent)
    clock = Clock()
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, warm_pool_size=0),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
        clock=clock,
    )
    pausing = Lifecycle(on_timeout=OnTimeout.PAUSE)
    slow = await manager.create(CreateRequest(template="base", timeout_s=10, lifecycle=pausing))
    other = await manager.create(CreateRequest(template="base", timeout_s=10, lifecycle=pausing))
    killed = await manager.create(CreateRequest(template="base", timeout_s=10))
    try:
        async with asyncio.TaskGroup() as group:
            timers = group.create_task(manager.run_timers())
            clock.now += 11
            await manager.set_timeout(killed.id, 0)  # wakes the timers
            while runtime.in_flight != {slow.id, other.id}:
                runtime.changed.clear()
                await runtime.changed.wait()
            # Both pauses are in the runtime at once, and the kill did not wait for either.
            await _until(lambda: killed.id not in manager.known_ids())
            runtime.release.set()
            await _until(lambda: {manager.get(slow.id).state, manager.get(other.id).state} == {SandboxState.PAUSED})
            timers.cancel()
    finally:
        await agent.close()
        db.close()
