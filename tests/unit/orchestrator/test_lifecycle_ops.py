"""Pause/resume, snapshots, forks, TTL auto-pause and crash settling, over a fake runtime."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import ConflictError, InvalidRequestError, NotFoundError, WarrenError
from warren.orchestrator import CreateRequest, SandboxManager, SandboxState
from warren.orchestrator.requests import Lifecycle
from warren.runtime.base import RuntimeKind
from warren.snapshots import SnapshotRepository
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[SandboxManager, FakeRuntime, Clock, Database, Path]]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(
        TemplateRecord("t1", "base", "runc", ("/l1",), {"T": "1"}, "/w", "user", None, None, 2, 512, 1024, 0.0)
    )
    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    clock = Clock()
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
        snapshots=SnapshotRepository(tmp_path / "snapshots"),
        clock=clock,
    )
    yield manager, runtime, clock, db, tmp_path
    await agent.close()
    db.close()


async def test_pause_twice_is_409_and_connect_resumes(env: tuple) -> None:  # type: ignore[type-arg]
    manager, _runtime, *_ = env
    rec = await manager.create(CreateRequest(template="base"))
    await manager.pause(rec.id)
    assert manager.get(rec.id).state == SandboxState.PAUSED
    with pytest.raises(ConflictError):
        await manager.pause(rec.id)
    again, resumed = await manager.connect(rec.id, None)
    assert resumed and again.state == SandboxState.RUNNING
    with pytest.raises(ConflictError):
        await manager.resume(rec.id)
    with pytest.raises(NotFoundError):
        await manager.resume("nope")


async def test_snapshot_then_create_from_it_and_delete_source(env: tuple) -> None:  # type: ignore[type-arg]
    manager, runtime, *_ = env
    src = await manager.create(CreateRequest(template="base", env_vars={"A": "1"}))
    manifest = await manager.snapshot(src.id, "snap1")
    assert manifest.names == ("snap1",) and manifest.layers == ("/l1",) and manifest.env_vars == {"A": "1"}
    with pytest.raises(ConflictError):
        await manager.snapshot(src.id, "snap1")
    await manager.kill(src.id)
    child = await manager.create(CreateRequest(template="snap1"))
    assert runtime.restored_from[child.id] == src.id
    assert child.image.layers == ("/l1",) and child.origin == manifest.snapshot_id


async def test_fork_counts_and_children(env: tuple) -> None:  # type: ignore[type-arg]
    manager, runtime, _, _, tmp = env
    src = await manager.create(CreateRequest(template="base"))
    for bad in (0, 101):
        with pytest.raises(InvalidRequestError):
            await manager.fork(src.id, bad, None)
    children = await manager.fork(src.id, 3, 60)
    assert len(children) == 3 and not any(isinstance(c, WarrenError) for c in children)
    ids = {c.id for c in children if not isinstance(c, WarrenError)}
    assert len(ids) == 3 and src.id not in ids
    assert {runtime.restored_from[i] for i in ids} == {src.id}
    tokens = {c.access_token for c in children if not isinstance(c, WarrenError)}
    assert len(tokens) == 3 and src.access_token not in tokens
    assert manager.get(src.id).state == SandboxState.RUNNING
    assert not any((tmp / "snapshots" / ".tmp").iterdir())  # the private fork snapshot is gone


async def test_ttl_with_auto_pause_pauses_and_wake_resumes(env: tuple) -> None:  # type: ignore[type-arg]
    manager, _runtime, clock, *_ = env
    lc = Lifecycle(on_timeout="pause", auto_resume=True)
    rec = await manager.create(CreateRequest(template="base", timeout_s=10, lifecycle=lc))
    plain = await manager.create(CreateRequest(template="base", timeout_s=10, lifecycle=Lifecycle(on_timeout="pause")))
    async with asyncio.TaskGroup() as group:
        task = group.create_task(manager.run_timers())
        clock.now += 11
        await manager.set_timeout(plain.id, 0)
        for _ in range(300):
            if manager.get(rec.id).state == SandboxState.PAUSED and manager.get(plain.id).state == SandboxState.PAUSED:
                break
            await asyncio.sleep(0.01)
        task.cancel()
    assert manager.get(rec.id).state == SandboxState.PAUSED
    assert await manager.wake(rec.id) == "127.0.0.1"
    assert manager.get(rec.id).state == SandboxState.RUNNING
    assert await manager.wake(plain.id) is None  # no auto-resume: the proxy answers 502 (paused)


@pytest.mark.parametrize(
    ("recorded", "actual", "expected"),
    [
        ("pausing", "paused", "paused"),
        ("pausing", "running", "running"),
        ("resuming", "running", "running"),
        ("resuming", "paused", "paused"),
        ("pausing", None, None),
        ("creating", "running", None),
        ("paused", "paused", "paused"),
    ],
)
async def test_crash_mid_transition_settles(
    env: tuple,  # type: ignore[type-arg]
    recorded: str,
    actual: str | None,
    expected: str | None,
) -> None:
    manager, runtime, clock, db, tmp = env
    rec = await manager.create(CreateRequest(template="base"))
    await SandboxRepo(db).put(dataclasses.replace(rec, state=recorded))
    if actual is None:
        runtime.running.pop(rec.id)

    async def state(_: str) -> str | None:
        return actual

    runtime.state = state  # type: ignore[method-assign]
    fresh = SandboxManager(
        settings=Settings(state_dir=tmp),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
        clock=clock,
    )
    await fresh.recover()
    if expected is None:
        with pytest.raises(NotFoundError):
            fresh.get(rec.id)
        assert await SandboxRepo(db).get(rec.id) is None
    else:
        assert fresh.get(rec.id).state == expected
        stored = await SandboxRepo(db).get(rec.id)
        assert stored is not None and stored.state == expected
