"""The metrics series and sampler, and list paging, against a fake runtime (no root needed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.api.models import parse_create, parse_list_query, rfc3339
from warren.config import Settings
from warren.errors import InvalidRequestError, NotFoundError
from warren.orchestrator import CreateRequest, ListQuery, SandboxManager, SandboxState
from warren.orchestrator.metrics import MetricSample, MetricSeries
from warren.orchestrator.requests import Order
from warren.runtime.base import PauseMode, RuntimeKind, SandboxHandle, SandboxSpec, SandboxStats
from warren.store import Database, NetworkConfig, Requested, SandboxRepo, TemplateRecord, TemplateRepo


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Env = tuple[SandboxManager, FakeRuntime, Clock, Database]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    templates = TemplateRepo(db)
    await templates.put(
        TemplateRecord("t1", "base", "runc", ("/nonexistent",), {}, None, None, None, None, 2, 512, 1024, 0.0)
    )
    await templates.put(
        TemplateRecord("t2", "other", "runc", ("/nonexistent",), {}, None, None, None, None, 1, 256, 1024, 0.0)
    )
    runc = FakeRuntime(RuntimeKind.RUNC, agent)
    clock = Clock()
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, warm_pool_size=0),
        sandboxes=SandboxRepo(db),
        templates=templates,
        runtimes={RuntimeKind.RUNC: runc},
        clock=clock,
    )
    yield manager, runc, clock, db
    await agent.close()
    db.close()


# ----- the series --------------------------------------------------------------------------------

def _sample(when: float, mem: int = 10) -> MetricSample:
    return MetricSample.of(when, SandboxStats(2, 0, mem, 100, 1, 5, 50), 12.345)


def test_one_sample_per_bucket_stamped_with_its_start() -> None:
    series = MetricSeries()
    series.add(_sample(1001.2, mem=1))
    series.add(_sample(1003.9, mem=2))  # same bucket: replaces
    series.add(_sample(1005.0, mem=3))
    series.add(_sample(999.0, mem=4))  # older than the newest: dropped
    assert [(s.timestamp, s.mem_used) for s in series.between(None, None)] == [(1000, 2), (1005, 3)]
    assert series.newest() is not None and series.newest().cpu_used_pct == 12.35  # type: ignore[union-attr]
    assert series.covers(1009.9) and not series.covers(1010.0)


def test_range_filters_are_inclusive() -> None:
    series = MetricSeries()
    for t in range(1000, 1050, 5):
        series.add(_sample(t))
    assert [s.timestamp for s in series.between(1010, 1020)] == [1010, 1015, 1020]
    assert [s.timestamp for s in series.between(1041, None)] == [1045]
    assert [s.timestamp for s in series.between(None, 1004)] == [1000]
    assert series.between(2000, None) == []


def test_a_long_life_stays_bounded_and_covered() -> None:
    series = MetricSeries(kept=16)
    for i in range(1000):
        series.add(_sample(1000 + 5 * i, mem=i))
    stamps = [s.timestamp for s in series.between(None, None)]
    assert len(stamps) <= 16
    assert stamps[0] == 1000 and stamps[-1] == 1000 + 5 * 999  # the whole life, coarser when old
    assert stamps == sorted(set(stamps)) and all(t % 5 == 0 for t in stamps)
    assert max(s.mem_used for s in series.between(None, None)) == 999  # merges keep the peak


# ----- the sampler -------------------------------------------------------------------------------


async def test_sampler_samples_running_sandboxes_only_and_forgets_killed(env: Env) -> None:
    manager, _runtime, clock, _ = env
    a = await manager.create(CreateRequest(template="base"))
    b = await manager.create(CreateRequest(template="base"))
    sampler = manager._parts.sampler
    for _ in range(3):
        await sampler.tick()
        clock.now += 5
    assert len(await manager.metrics(a.id, None, int(clock.now) - 5)) == 3
    await manager.pause(b.id)
    paused_at = clock.now
    for _ in range(3):
        await sampler.tick()
        clock.now += 5
    assert [s.timestamp for s in await manager.metrics(b.id) if s.timestamp >= paused_at] == []  # none while paused
    assert len(await manager.metrics(a.id)) == 7  # six ticks and the read's own sample
    latest = await manager.latest_metrics([a.id, b.id, "inope"])
    assert set(latest) == {a.id, b.id} and latest[b.id].timestamp < paused_at
    await manager.kill(a.id)
    await sampler.tick()
    assert a.id not in sampler._series
    with pytest.raises(NotFoundError):
        await manager.metrics(a.id)


async def test_a_fresh_sandbox_has_its_first_sample_at_once(env: Env) -> None:
    manager, _, clock, _ = env
    rec = await manager.create(CreateRequest(template="base"))
    series = await manager.metrics(rec.id)
    assert len(series) == 1 and series[0].timestamp == int(clock.now // 5 * 5) and series[0].mem_total == 1000


# ----- list paging -------------------------------------------------------------------------------


async def _create(manager: SandboxManager, clock: Clock, template: str = "base", **meta: str) -> str:
    clock.now += 1
    return (await manager.create(CreateRequest(template=template, metadata=dict(meta)))).id


async def _all_pages(manager: SandboxManager, query: ListQuery, between: list[str], clock: Clock) -> list[str]:
    """Every page of ``query``, creating one sandbox after each page (a concurrent create)."""
    seen: list[str] = []
    page, token = manager.list(query)
    seen += [r.id for r in page]
    while token:
        between.append(await _create(manager, clock, g="x"))
        page, token = manager.list(ListQuery(**{**query.__dict__, "next_token": token}))
        seen += [r.id for r in page]
    return seen


@pytest.mark.parametrize("order", [Order.DESC, Order.ASC])
async def test_pages_neither_skip_nor_repeat_under_concurrent_creates(env: Env, order: Order) -> None:
    manager, _, clock, _ = env
    ids = [await _create(manager, clock, g="x") for _ in range(7)]
    created: list[str] = []
    seen = await _all_pages(manager, ListQuery(metadata={"g": "x"}, limit=2, order=order), created, clock)
    assert len(seen) == len(set(seen))
    assert set(ids) <= set(seen) <= set(ids) | set(created)
    expected = ids[::-1] if order is Order.DESC else ids
    assert [i for i in seen if i in ids] == expected


async def test_started_after_and_template_filters(env: Env) -> None:
    manager, _, clock, _ = env
    a = await _create(manager, clock)
    b = await _create(manager, clock, template="other")
    c = await _create(manager, clock)
    started_b = manager.get(b).started_at
    assert [r.id for r in manager.list(ListQuery(started_after=started_b))[0]] == [c, b]
    assert [r.id for r in manager.list(ListQuery(template="base"))[0]] == [c, a]
    assert [r.id for r in manager.list(ListQuery(template="t2"))[0]] == [b]
    assert manager.list(ListQuery(template="nope"))[0] == []
    # startedAfter given as a listed startedAt (microseconds) finds that very sandbox
    query = parse_list_query({"startedAfter": rfc3339(started_b), "order": "asc"})
    assert [r.id for r in manager.list(query)[0]] == [b, c]


def test_list_query_parsing() -> None:
    q = parse_list_query({"order": "asc", "startedAfter": "2025-01-02T03:04:05.5+01:00", "template": "base"})
    assert q.order is Order.ASC and q.template == "base" and q.started_after == 1735783445.5
    assert parse_list_query({}).order is Order.DESC
    assert parse_list_query({"startedAfter": "2025-01-02T03:04:05"}).started_after == 1735787045.0  # UTC
    for bad in ({"order": "up"}, {"startedAfter": "yesterday"}):
        with pytest.raises(InvalidRequestError):
            parse_list_query(bad)


def test_rfc3339_truncates_to_the_microsecond() -> None:
    assert rfc3339(1.9999996) == "1970-01-01T00:00:01.999999Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"


# ----- what the create asked for -----------------------------------------------------------------


def test_create_keeps_what_it_asked_for() -> None:
    req = parse_create({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": True}})
    assert req.egress.deny_out == ("0.0.0.0/0",)  # enforced by the sandbox's egress rules (update_network lifts it)
    assert req.requested == Requested(None, NetworkConfig(allow_public_traffic=True, deny_out=("0.0.0.0/0",)))
    assert parse_create({"templateID": "base"}).requested == Requested()
    assert parse_create({"templateID": "base", "allow_internet_access": False}).requested.allow_internet_access is False
    ip = parse_create({"templateID": "base", "network": {"allowOut": ["1.1.1.1"], "denyOut": ["10.0.0.0/8"]}})
    assert ip.requested.network == NetworkConfig(allow_out=("1.1.1.1",), deny_out=("10.0.0.0/8",))
    assert ip.egress.allow_out == ("1.1.1.1/32",) and ip.egress.deny_out == ("10.0.0.0/8",)
    private = parse_create({"templateID": "base", "network": {"allowPublicTraffic": False}})
    assert private.public_traffic is False and private.requested.network == NetworkConfig(allow_public_traffic=False)
    for network in ({"denyOut": ["example.com"]}, {"allowPublicTraffic": "no"}, {"allowOut": ["*"]},
                    {"maskRequestHost": "x"}, {"rules": {"*": [{}]}}, "all", {"denyOut": "0.0.0.0/0"}):  # fmt: skip
        with pytest.raises(InvalidRequestError):
            parse_create({"templateID": "base", "network": network})
    with pytest.raises(InvalidRequestError):
        parse_create({"templateID": "base", "allow_internet_access": "no"})


async def test_requested_survives_the_store(env: Env) -> None:
    manager, _, _, db = env
    asked = Requested(False, NetworkConfig(allow_public_traffic=True, deny_out=("0.0.0.0/0",)))
    rec = await manager.create(CreateRequest(template="base", allow_internet=False, requested=asked))
    stored = await SandboxRepo(db).get(rec.id)
    assert stored is not None and stored.requested == asked
    plain = await manager.create(CreateRequest(template="base"))
    again = await SandboxRepo(db).get(plain.id)
    assert again is not None and again.requested == Requested()


# ----- proxy traffic to a paused sandbox ---------------------------------------------------------


async def test_traffic_waits_for_a_connect_that_is_resuming(env: Env) -> None:
    manager, runtime, _, _ = env
    rec = await manager.create(CreateRequest(template="base"))  # no auto-resume
    await manager.pause(rec.id)
    assert await manager.wake(rec.id) is None  # paused: the proxy answers 502
    gate, entered = asyncio.Event(), asyncio.Event()
    resume = runtime.resume

    async def slow_resume(spec: SandboxSpec, mode: PauseMode) -> SandboxHandle:
        entered.set()
        await gate.wait()
        return await resume(spec, mode)

    runtime.resume = slow_resume  # type: ignore[method-assign]
    async with asyncio.TaskGroup() as group:
        connecting = group.create_task(manager.connect(rec.id, None))
        await entered.wait()
        assert manager.get(rec.id).state == SandboxState.RESUMING
        waking = group.create_task(manager.wake(rec.id))
        await asyncio.sleep(0.01)
        assert not waking.done()
        gate.set()
    assert waking.result() == connecting.result()[0].address is not None


async def test_a_failing_read_costs_one_sample_not_the_node(env: Env) -> None:
    manager, runtime, clock, _ = env
    rec = await manager.create(CreateRequest(template="base"))

    async def broken(sandbox_id: str) -> SandboxStats:
        raise ValueError("unparsable cgroup file")

    stats = runtime.stats
    runtime.stats = broken  # type: ignore[method-assign]
    sampler = manager._parts.sampler
    await sampler.tick()
    assert sampler._series.get(rec.id) is None
    runtime.stats = stats  # type: ignore[method-assign]
    clock.now += 5
    await sampler.tick()
    assert len(await manager.metrics(rec.id)) == 1
    runner = asyncio.create_task(manager.run_metrics())
    await asyncio.sleep(0.05)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
