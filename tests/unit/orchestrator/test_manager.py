"""SandboxManager against a fake runtime and a fake agent (no root needed)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import InvalidRequestError, InvalidStateError, NotFoundError, RuntimeFailure, UnavailableError
from warren.orchestrator import CreateRequest, ListQuery, SandboxManager, SandboxState
from warren.orchestrator.states import transition
from warren.runtime.base import RuntimeKind
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[SandboxManager, FakeRuntime, FakeAgent, Clock, Database]]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    templates = TemplateRepo(db)
    await templates.put(
        TemplateRecord("t1", "base", "runc", ("/nonexistent",), {"T": "1"}, None, None, None, None, 2, 512, 1024, 0.0)
    )
    runc = FakeRuntime(RuntimeKind.RUNC, agent)
    gvisor = FakeRuntime(RuntimeKind.GVISOR, agent, available=False)
    clock = Clock()
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path),
        sandboxes=SandboxRepo(db),
        templates=templates,
        runtimes={RuntimeKind.RUNC: runc, RuntimeKind.GVISOR: gvisor},
        clock=clock,
    )
    yield manager, runc, agent, clock, db
    await agent.close()
    db.close()


async def test_create_inits_agent_and_persists(parts: tuple) -> None:  # type: ignore[type-arg]
    manager, runc, agent, _, db = parts
    rec = await manager.create(CreateRequest(template="base", env_vars={"A": "b"}, metadata={"k": "v"}))
    assert rec.state == SandboxState.RUNNING and rec.id in runc.running
    assert agent.inits[0]["envVars"] == {"T": "1", "A": "b"}
    assert agent.inits[0]["accessToken"] == rec.access_token and agent.inits[0]["defaultUser"] == "user"
    stored = await SandboxRepo(db).get(rec.id)
    assert stored is not None and stored.state == "running" and stored.metadata == {"k": "v"}


async def test_failed_create_removes_everything(parts: tuple) -> None:  # type: ignore[type-arg]
    manager, runc, _, _, db = parts
    runc.fail_start = True
    with pytest.raises(RuntimeFailure):
        await manager.create(CreateRequest(template="base"))
    assert await SandboxRepo(db).all() == []
    assert manager.count() == 0 and len(runc.stopped) == 1


async def test_unknown_template_and_unavailable_runtime(parts: tuple) -> None:  # type: ignore[type-arg]
    manager, runc, *_ = parts
    with pytest.raises(NotFoundError):
        await manager.create(CreateRequest(template="nope"))
    with pytest.raises(UnavailableError, match="fake: unavailable"):
        await manager.create(CreateRequest(template="base", runtime="gvisor"))
    with pytest.raises(InvalidRequestError):
        await manager.create(CreateRequest(template="base", runtime="kvm"))
    assert runc.running == {}


async def test_kill_twice(parts: tuple) -> None:  # type: ignore[type-arg]
    manager, runc, *_ = parts
    rec = await manager.create(CreateRequest(template="base"))
    await manager.kill(rec.id)
    assert rec.id not in runc.running
    with pytest.raises(NotFoundError):
        await manager.kill(rec.id)


async def test_list_filters_and_pages(parts: tuple) -> None:  # type: ignore[type-arg]
    manager, _, _, clock, _ = parts
    ids = []
    for i in range(5):
        clock.now += 1
        ids.append((await manager.create(CreateRequest(template="base", metadata={"g": str(i % 2)}))).id)
    page, token = manager.list(ListQuery(metadata={"g": "0"}, limit=2))  # newest first
    assert [r.id for r in page] == [ids[4], ids[2]] and token
    page2, token2 = manager.list(ListQuery(metadata={"g": "0"}, limit=2, next_token=token))
    assert [r.id for r in page2] == [ids[0]] and token2 is None
    with pytest.raises(InvalidRequestError):
        manager.list(ListQuery(next_token="!!!"))


async def test_ttl_expiry_kills(parts: tuple) -> None:  # type: ignore[type-arg]
    import asyncio

    manager, runc, _, clock, _ = parts
    rec = await manager.create(CreateRequest(template="base", timeout_s=10))
    keep = await manager.create(CreateRequest(template="base", timeout_s=100))
    async with asyncio.TaskGroup() as group:
        task = group.create_task(manager.run_timers())
        clock.now += 11
        await manager.set_timeout(keep.id, 100)  # wakes the timer loop
        for _ in range(200):
            if rec.id not in runc.running:
                break
            await asyncio.sleep(0.01)
        task.cancel()
    assert rec.id not in runc.running and keep.id in runc.running


async def test_connect_extends_never_shortens(parts: tuple) -> None:  # type: ignore[type-arg]
    manager, _, _, clock, _ = parts
    rec = await manager.create(CreateRequest(template="base", timeout_s=600))
    again, resumed = await manager.connect(rec.id, 10)
    assert not resumed and again.end_at == rec.end_at
    again, _ = await manager.connect(rec.id, 6000)
    assert again.end_at == clock.now + 6000


async def test_recover_readopts_running_and_drops_gone(tmp_path: Path, parts: tuple) -> None:  # type: ignore[type-arg]
    manager, runc, _agent, clock, db = parts
    alive = await manager.create(CreateRequest(template="base"))
    gone = await manager.create(CreateRequest(template="base"))
    del runc.running[gone.id]
    fresh = SandboxManager(
        settings=Settings(state_dir=tmp_path),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runc},
        clock=clock,
    )
    await fresh.recover()
    assert fresh.get(alive.id).id == alive.id
    with pytest.raises(NotFoundError):
        fresh.get(gone.id)
    assert await SandboxRepo(db).get(gone.id) is None


def test_transition_table_refuses_illegal_moves() -> None:
    assert transition("s", SandboxState.RUNNING, SandboxState.PAUSING) is SandboxState.PAUSING
    with pytest.raises(InvalidStateError, match="paused"):
        transition("s", SandboxState.PAUSED, SandboxState.PAUSING)
    assert time.time() > 0
