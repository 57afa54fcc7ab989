"""The node's sandbox cap under concurrency, with the warm pool, over a fake runtime.

The fake runtime (``tests.framework.fakes``) stands in for runc so that many creates can race in
one event loop; the real-node behaviour (429 bodies, nothing half-created) is in
``tests/e2e/test_limits.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import TooManyRequestsError
from warren.orchestrator import CreateRequest, SandboxManager
from warren.runtime.base import RuntimeKind
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo


async def _manager(tmp_path: Path, **settings: int) -> tuple[SandboxManager, FakeRuntime, FakeAgent, Database]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    for tid, name in (("t1", "base"), ("t2", "other")):
        record = TemplateRecord(tid, name, "runc", ("/l",), {}, None, None, None, None, 1, 256, 1, 0.0)
        await TemplateRepo(db).put(record)
    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, **settings),  # type: ignore[arg-type]
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
    )
    return manager, runtime, agent, db


async def test_racing_creates_get_exactly_the_free_slots(tmp_path: Path) -> None:
    manager, runtime, agent, db = await _manager(tmp_path, max_sandboxes=3, warm_pool_size=0)
    results = await asyncio.gather(
        *(manager.create(CreateRequest(template="base")) for _ in range(8)), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, TooManyRequestsError)]
    assert len(refused) == 5 and len(runtime.running) == 3 and manager.active_count() == 3
    assert "maximum number of concurrent sandboxes on this node (3)" in str(refused[0])
    assert len(await SandboxRepo(db).all()) == 3
    await agent.close()
    db.close()


async def test_paused_sandboxes_free_their_slot_and_resume_needs_one(tmp_path: Path) -> None:
    manager, _, agent, db = await _manager(tmp_path, max_sandboxes=1, warm_pool_size=0)
    first = await manager.create(CreateRequest(template="base"))
    await manager.pause(first.id)
    second = await manager.create(CreateRequest(template="base"))
    with pytest.raises(TooManyRequestsError):
        await manager.connect(first.id, None)
    assert manager.get(first.id).state == "paused" and manager.active_count() == 1
    await manager.kill(second.id)
    record, resumed = await manager.connect(first.id, None)
    assert resumed and record.state == "running" and manager.active_count() == 1
    await agent.close()
    db.close()


async def test_pool_fills_free_slots_only_and_gives_them_up_to_creates(tmp_path: Path) -> None:
    manager, runtime, agent, db = await _manager(tmp_path, max_sandboxes=2, warm_pool_size=2)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(manager.pool.run())
        await manager.create(CreateRequest(template="base"))
        for _ in range(500):
            if manager.pool.spares() == 1 and len(runtime.running) == 2:
                break
            await asyncio.sleep(0.01)
        assert manager.pool.spares() == 1 and len(runtime.running) == 2  # 1 user + 1 spare: the cap
        await manager.create(CreateRequest(template="other"))  # no spare of its own: takes the spare's slot
        assert manager.pool.spares() == 0 and len(runtime.running) == 2
        with pytest.raises(TooManyRequestsError):
            await manager.create(CreateRequest(template="base"))
        assert len(runtime.running) == 2
        task.cancel()
    await agent.close()
    db.close()
