"""The warm pool over a fake runtime: claim, refill, hit/miss counts, drain."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import RuntimeFailure
from warren.orchestrator import CreateRequest, SandboxManager
from warren.orchestrator.origin import Origin
from warren.orchestrator.pool import MAX_FAILURES, MAX_STARTING, Pooled, WarmPool
from warren.runtime.base import RuntimeKind, SandboxHandle
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


# ----- refills with slow or failing starts (start commands): one shelf never holds up another -------


def _origin(template_id: str) -> Origin:
    return Origin(template_id, template_id, "runc", ("/l",), {}, None, None, 1, 256, 1)


class _Starts:
    """A pool's start and stop: a template's starts wait on its gate (if it has one) and then fail (if it is
    broken); counts the starts under way at once."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.broken: set[str] = set()
        self.attempts: dict[str, int] = {}
        self.running = 0
        self.most = 0
        self.stopped: list[str] = []

    async def start(self, origin: Origin, kind: RuntimeKind) -> Pooled:
        tid = origin.template_id
        self.attempts[tid] = self.attempts.get(tid, 0) + 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if tid in self.gates:
                await self.gates[tid].wait()
            if tid in self.broken:
                raise RuntimeFailure(f"{tid}: the template's ready command did not succeed")
            sandbox_id = f"{tid}-{self.attempts[tid]}"
            return Pooled(sandbox_id, kind, SandboxHandle(sandbox_id, kind, "127.0.0.1"), None, "token")
        finally:
            self.running -= 1

    async def stop(self, pooled: Pooled) -> None:
        self.stopped.append(pooled.sandbox_id)


def _ready(pool: WarmPool, template_id: str) -> int:
    return pool.stats()[f"{template_id}/runc"]["ready"]


@pytest.mark.looptime
async def test_a_slow_start_holds_up_only_its_own_shelf() -> None:
    starts = _Starts()
    starts.gates["slow"] = asyncio.Event()
    pool = WarmPool(starts.start, starts.stop, default_size=2)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(pool.run())
        assert pool.claim(_origin("slow"), RuntimeKind.RUNC) is None
        assert pool.claim(_origin("fast"), RuntimeKind.RUNC) is None
        await asyncio.sleep(1)
        assert (_ready(pool, "slow"), _ready(pool, "fast")) == (0, 2)
        assert starts.attempts["slow"] == 1  # one start at a time per shelf
        assert pool.claim(_origin("fast"), RuntimeKind.RUNC) is not None
        await asyncio.sleep(1)
        assert _ready(pool, "fast") == 2
        starts.gates["slow"].set()
        await asyncio.sleep(1)
        assert _ready(pool, "slow") == 2
        task.cancel()
    assert sorted(starts.stopped) == ["fast-2", "fast-3", "slow-1", "slow-2"]


@pytest.mark.looptime
async def test_a_failing_shelf_backs_off_alone_and_gives_up() -> None:
    starts = _Starts()
    starts.broken.add("broken")
    pool = WarmPool(starts.start, starts.stop, default_size=2)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(pool.run())
        pool.claim(_origin("broken"), RuntimeKind.RUNC)
        pool.claim(_origin("fine"), RuntimeKind.RUNC)
        await asyncio.sleep(0.5)
        assert _ready(pool, "fine") == 2  # not behind the broken shelf's back-off
        assert starts.attempts["broken"] == 1
        await asyncio.sleep(30)
        assert starts.attempts["broken"] == MAX_FAILURES
        assert pool.stats()["broken/runc"]["target"] == 0 and pool.spares() == 2
        task.cancel()
    assert sorted(starts.stopped) == ["fine-1", "fine-2"]


@pytest.mark.looptime
async def test_starts_at_once_are_bounded_node_wide() -> None:
    starts = _Starts()
    names = [f"t{i}" for i in range(5)]
    for name in names:
        starts.gates[name] = asyncio.Event()
    pool = WarmPool(starts.start, starts.stop, default_size=1)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(pool.run())
        for name in names:
            pool.claim(_origin(name), RuntimeKind.RUNC)
        await asyncio.sleep(1)
        assert starts.running == MAX_STARTING and pool.spares() == MAX_STARTING
        for name in names:
            starts.gates[name].set()
        await asyncio.sleep(1)
        assert [_ready(pool, name) for name in names] == [1] * len(names)
        assert starts.most == MAX_STARTING
        task.cancel()


@pytest.mark.looptime
async def test_a_start_under_way_is_cancelled_with_the_pool() -> None:
    starts = _Starts()
    starts.gates["slow"] = asyncio.Event()
    pool = WarmPool(starts.start, starts.stop, default_size=1)
    task = asyncio.create_task(pool.run())
    pool.claim(_origin("slow"), RuntimeKind.RUNC)
    await asyncio.sleep(1)
    assert starts.running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert starts.running == 0 and pool.spares() == 0
