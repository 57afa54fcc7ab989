"""The manager tells its observer how long each lifecycle operation took, once per operation, with the
sandbox's runtime and whether it failed; and counts its sandboxes by state on demand (the seam the node's
Prometheus metrics hang on: warren.api.metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import ConflictError, NotFoundError, WarrenError
from warren.orchestrator import CreateRequest, SandboxManager, SandboxState
from warren.orchestrator.observe import Operation, Outcome, no_observe, timed
from warren.orchestrator.requests import Lifecycle
from warren.runtime.base import RuntimeKind
from warren.snapshots import SnapshotRepository
from warren.store import Database, OnTimeout, SandboxRepo, TemplateRecord, TemplateRepo


@dataclass
class Recorder:
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def __call__(self, operation: Operation, runtime: str, outcome: Outcome, seconds: float) -> None:
        self.seen.append((operation.value, runtime, outcome.value))
        self.seconds.append(seconds)

    def take(self) -> list[tuple[str, str, str]]:
        out, self.seen = self.seen, []
        return out


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Env:
    manager: SandboxManager
    seen: Recorder
    clock: Clock


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(
        TemplateRecord("t1", "base", "runc", ("/l1",), {}, None, None, None, None, 1, 256, 1024, 0.0)
    )
    seen, clock = Recorder(), Clock()
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: FakeRuntime(RuntimeKind.RUNC, agent)},
        snapshots=SnapshotRepository(tmp_path / "snapshots"),
        clock=clock,
        observe=seen,
    )
    yield Env(manager, seen, clock)
    await agent.close()
    db.close()


async def test_each_operation_is_observed_once_with_its_runtime(env: Env) -> None:
    m = env.manager
    rec = await m.create(CreateRequest(template="base"))
    await m.pause(rec.id)
    await m.resume(rec.id)
    await m.snapshot(rec.id, "snap")
    children = await m.fork(rec.id, 2, None)
    await m.kill(rec.id)
    assert env.seen.take() == [
        ("create", "runc", "ok"),
        ("pause", "runc", "ok"),
        ("resume", "runc", "ok"),
        ("snapshot", "runc", "ok"),
        ("fork", "runc", "ok"),
        ("kill", "runc", "ok"),
    ]
    assert all(s >= 0 for s in env.seen.seconds)
    for child in children:
        assert not isinstance(child, WarrenError)
        await m.kill(child.id)


async def test_failures_are_labelled(env: Env) -> None:
    m = env.manager
    rec = await m.create(CreateRequest(template="base"))
    await m.pause(rec.id)
    env.seen.take()
    with pytest.raises(ConflictError):
        await m.pause(rec.id)
    with pytest.raises(NotFoundError):
        await m.kill("nope")
    with pytest.raises(NotFoundError):
        await m.create(CreateRequest(template="no-such-template"))
    with pytest.raises(WarrenError):
        await m.create(CreateRequest(template="base", runtime="made-up"))
    with pytest.raises(WarrenError):
        await m.create(CreateRequest(template="base", runtime="gvisor"))
    assert env.seen.take() == [
        ("pause", "runc", "error"),  # a sandbox the node does not hold: a 404, not observed
        ("create", "unknown", "error"),
        ("create", "unknown", "error"),  # never "made-up": labels come from a closed set
        ("create", "gvisor", "error"),
    ]
    await m.kill(rec.id)


async def test_a_connect_to_a_running_sandbox_is_no_resume(env: Env) -> None:
    m = env.manager
    rec = await m.create(CreateRequest(template="base"))
    env.seen.take()
    _, resumed = await m.connect(rec.id, 60)
    assert not resumed and env.seen.take() == []
    await m.kill(rec.id)


async def test_ttl_expiry_is_observed_like_a_call(env: Env) -> None:
    m = env.manager
    paused = await m.create(CreateRequest(template="base", timeout_s=10, lifecycle=Lifecycle(OnTimeout.PAUSE)))
    killed = await m.create(CreateRequest(template="base", timeout_s=10))
    env.seen.take()
    async with asyncio.TaskGroup() as group:
        timers = group.create_task(m.run_timers())
        env.clock.now += 11
        await m.set_timeout(killed.id, 0)  # wakes the timers: both are past their end
        for _ in range(500):
            if len(env.seen.seen) == 2:
                break
            await asyncio.sleep(0.01)
        timers.cancel()
    assert sorted(env.seen.take()) == [("kill", "runc", "ok"), ("pause", "runc", "ok")]
    assert m.get(paused.id).state == SandboxState.PAUSED
    with pytest.raises(NotFoundError):
        m.get(killed.id)
    await m.kill(paused.id)


async def test_state_counts_cover_every_state(env: Env) -> None:
    m = env.manager
    a = await m.create(CreateRequest(template="base"))
    b = await m.create(CreateRequest(template="base"))
    await m.pause(b.id)
    counts = m.state_counts()
    assert counts == {"creating": 0, "running": 1, "pausing": 0, "paused": 1, "resuming": 0, "killing": 0}
    await m.kill(a.id)
    await m.kill(b.id)
    assert set(m.state_counts().values()) == {0}


def test_timed_observes_errors_and_cancellation() -> None:
    seen = Recorder()
    with timed(seen, Operation.KILL, "runc") as t:
        t.runtime = "gvisor"
    with timed(seen, Operation.KILL, "runc", skip=True):
        pass
    with pytest.raises(RuntimeError), timed(seen, Operation.PAUSE, "runc"):
        raise RuntimeError("boom")
    with pytest.raises(asyncio.CancelledError), timed(seen, Operation.RESUME, None):
        raise asyncio.CancelledError
    assert seen.take() == [("kill", "gvisor", "ok"), ("pause", "runc", "error"), ("resume", "unknown", "error")]
    no_observe(Operation.CREATE, "runc", Outcome.OK, 0.1)
