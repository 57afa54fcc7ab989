"""The warm pool over a fake runtime: claim, refill, hit/miss counts, drain."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.orchestrator import CreateRequest, SandboxManager
from warren.runtime.base import RuntimeKind
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo


async def test_second_create_is_claimed_from_the_pool(tmp_path: Path) -> None:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    template = TemplateRecord("t1", "base", "runc", ("/l",), {}, None, None, None, None, 1, 256, 1, 0.0)
    await TemplateRepo(db).put(template)
    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, warm_pool_size=2),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
    )
    async with asyncio.TaskGroup() as group:
        task = group.create_task(manager.pool.run())
        first = await manager.create(CreateRequest(template="base"))
        for _ in range(200):
            if next(iter(manager.pool.stats().values()))["ready"] == 2:
                break
            await asyncio.sleep(0.01)
        pooled_ids = set(runtime.running) - {first.id}
        second = await manager.create(CreateRequest(template="base", env_vars={"A": "b"}))
        assert second.id in pooled_ids
        assert agent.inits[-1]["envVars"] == {"A": "b"} and agent.inits[-1]["accessToken"] == second.access_token
        stats = next(iter(manager.pool.stats().values()))
        assert stats["hits"] == 1 and stats["misses"] == 1
        assert await SandboxRepo(db).get(second.id) is not None
        task.cancel()
    # cancelling the pool task drains it: only the two created sandboxes remain
    assert set(runtime.running) == {first.id, second.id}
    await agent.close()
    db.close()
