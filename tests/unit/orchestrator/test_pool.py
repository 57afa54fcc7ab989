"""The warm pool over a fake runtime: claim, refill, hit/miss counts, drain."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.orchestrator import CreateRequest, SandboxManager
from warren.runtime.base import RuntimeKind
from warren.store import Database, SandboxRecord, SandboxRepo, TemplateRecord, TemplateRepo


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
        # (spares are /init'ed when they start, so a refill's /init may come after the claim's)
        claim_init = [i for i in agent.inits if i["accessToken"] == second.access_token][-1]
        assert claim_init["envVars"] == {"A": "b"}
        stats = next(iter(manager.pool.stats().values()))
        assert stats["hits"] == 1 and stats["misses"] == 1
        assert await SandboxRepo(db).get(second.id) is not None
        task.cancel()
    # cancelling the pool task drains it: only the two created sandboxes remain
    assert set(runtime.running) == {first.id, second.id}
    await agent.close()
    db.close()


async def test_a_claim_without_env_vars_is_one_record_save_and_no_init(tmp_path: Path) -> None:
    """Spares are /init'ed when they start (template env, user, a token of their own); a create that
    adds nothing takes one as it is. The runtime and agent are fakes (no root needed)."""
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(
        TemplateRecord("t1", "base", "runc", ("/l",), {"T": "1"}, "/w", None, None, None, 1, 256, 1, 0.0)
    )
    saves: list[tuple[str, str]] = []

    class CountingRepo(SandboxRepo):
        async def put(self, rec: SandboxRecord) -> None:
            saves.append((rec.id, rec.state))
            await super().put(rec)

    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, warm_pool_size=1),
        sandboxes=CountingRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
    )
    async with asyncio.TaskGroup() as group:
        task = group.create_task(manager.pool.run())
        manager.pool.want(await TemplateRepo(db).find("base"))  # type: ignore[arg-type]
        for _ in range(200):
            if manager.pool.spares() == 1 and agent.inits:
                break
            await asyncio.sleep(0.01)
        (spare_id,) = runtime.running
        spare_init = agent.inits[-1]
        assert spare_init["envVars"] == {"T": "1"} and spare_init["defaultUser"] == "user"
        rec = await manager.create(CreateRequest(template="base"))
        assert rec.id == spare_id and rec.access_token == spare_init["accessToken"]
        # (the pool refills meanwhile: a new spare gets an /init with a token of its own)
        assert [i for i in agent.inits if i["accessToken"] == rec.access_token] == [spare_init]
        assert saves == [(rec.id, "running")]
        assert manager.get(rec.id).state == "running"
        task.cancel()
    await agent.close()
    db.close()
