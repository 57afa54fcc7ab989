"""The node's ``GET /metrics``: the collector read at scrape time from a fake, the histogram fed through the
orchestrator's observe seam, per-app registries, and who may scrape (``WARREN_METRICS_PUBLIC``)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from tests.framework.prom import Samples, samples, value
from warren.api import Services, create_app
from warren.api.metrics import CONTENT_TYPE, NodeMetrics
from warren.config import Settings
from warren.orchestrator import SandboxManager
from warren.orchestrator.observe import Operation, Outcome
from warren.runtime.base import RuntimeKind
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo

KEY = "wrn_unit"

@dataclass
class FakeState:
    states: dict[str, int] = field(default_factory=lambda: {"running": 2, "paused": 1})
    limit: dict[str, int] = field(default_factory=lambda: {"active": 2, "max": 5, "spares": 0})
    pool: dict[str, dict[str, int]] = field(default_factory=dict)

    def state_counts(self) -> Mapping[str, int]:
        return self.states

    def limits(self) -> Mapping[str, int]:
        return self.limit

    def pool_stats(self) -> Mapping[str, Mapping[str, int]]:
        return self.pool


def scrape(metrics: NodeMetrics) -> Samples:
    from prometheus_client import generate_latest

    return samples(generate_latest(metrics.registry).decode())


def test_gauges_are_read_at_scrape_time() -> None:
    state = FakeState(pool={"t1/runc": {"ready": 2, "target": 3, "hits": 7, "misses": 1}})
    metrics = NodeMetrics()
    metrics.watch(state)
    first = scrape(metrics)
    assert value(first, "warren_sandboxes", state="running") == 2
    assert value(first, "warren_sandboxes", state="paused") == 1
    assert value(first, "warren_sandbox_limit") == 5
    assert value(first, "warren_sandbox_active") == 2
    assert value(first, "warren_sandbox_capacity") == 3
    assert value(first, "warren_warm_pool_ready", template="t1", runtime="runc") == 2
    assert value(first, "warren_warm_pool_target", template="t1", runtime="runc") == 3
    assert value(first, "warren_warm_pool_hits_total", template="t1", runtime="runc") == 7
    assert value(first, "warren_warm_pool_misses_total", template="t1", runtime="runc") == 1
    assert any(name.startswith("process_") for name, _ in first)
    state.states["running"] = 0
    state.limit = {"active": 0, "max": 0}
    again = scrape(metrics)
    assert value(again, "warren_sandboxes", state="running") == 0
    assert math.isinf(value(again, "warren_sandbox_capacity"))  # no cap


def test_observations_fill_the_histogram_and_registries_are_per_app() -> None:
    one, two = NodeMetrics(), NodeMetrics()  # two in one process: no "Duplicated timeseries"
    one.observe(Operation.CREATE, "runc", Outcome.OK, 0.003)
    one.observe(Operation.CREATE, "runc", Outcome.OK, 45.0)
    one.observe(Operation.PAUSE, "gvisor", Outcome.ERROR, 0.2)
    one.redis_errors("heartbeat")
    got = scrape(one)
    create = {"operation": "create", "runtime": "runc", "outcome": "ok"}
    assert value(got, "warren_sandbox_operation_seconds_count", **create) == 2
    assert value(got, "warren_sandbox_operation_seconds_bucket", **create, le="0.005") == 1
    assert value(got, "warren_sandbox_operation_seconds_bucket", **create, le="60.0") == 2
    assert value(got, "warren_sandbox_operation_seconds_bucket", **create, le="0.001") == 0
    paused = {"operation": "pause", "runtime": "gvisor", "outcome": "error"}
    assert value(got, "warren_sandbox_operation_seconds_count", **paused) == 1
    assert value(got, "warren_redis_errors_total", operation="heartbeat") == 1
    assert value(scrape(two), "warren_sandbox_operation_seconds_count", **create) == 0


@dataclass
class Node:
    client: httpx.AsyncClient
    metrics: NodeMetrics


@pytest.fixture
async def make_node(tmp_path: Path) -> AsyncIterator[Callable[..., Node]]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    templates = TemplateRepo(db)
    await templates.put(TemplateRecord("t1", "base", "runc", ("/x",), {}, None, None, None, None, 2, 512, 1024, 0.0))
    made: list[tuple[httpx.AsyncClient, object]] = []

    async def no_import(*_: object) -> TemplateRecord:
        raise AssertionError("not used")

    def make(*, public: bool = True, with_metrics: bool = True) -> Node:
        settings = Settings(state_dir=tmp_path, metrics_public=public)
        metrics = NodeMetrics()
        manager = SandboxManager(settings=settings, sandboxes=SandboxRepo(db), templates=templates,
                                 runtimes={RuntimeKind.RUNC: FakeRuntime(RuntimeKind.RUNC, agent)},
                                 observe=metrics.observe)  # fmt: skip
        metrics.watch(manager)
        svc = Services(settings, manager, templates, KEY, lambda: {}, no_import,
                       metrics=metrics if with_metrics else None)  # fmt: skip
        app, proxy = create_app(svc)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")
        made.append((client, proxy))
        return Node(client, metrics)

    yield make
    for client, proxy in made:
        await client.aclose()
        await proxy.aclose()  # type: ignore[attr-defined]
    await agent.close()
    db.close()


async def test_a_scrape_after_create_pause_resume_kill(make_node: Callable[..., Node]) -> None:
    node = make_node()
    c, auth = node.client, {"X-API-Key": KEY}
    r = await c.post("/v2/sandboxes", json={"templateID": "base"}, headers=auth)
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    assert (await c.post(f"/sandboxes/{sid}/pause", headers=auth)).status_code == 204
    mid = await c.get("/metrics")
    assert mid.status_code == 200 and mid.headers["content-type"] == CONTENT_TYPE
    assert value(samples(mid.text), "warren_sandboxes", state="paused") == 1
    assert value(samples(mid.text), "warren_sandboxes", state="running") == 0
    assert (await c.post(f"/sandboxes/{sid}/resume", json={}, headers=auth)).status_code == 201
    assert (await c.get(f"/sandboxes/{sid}/metrics", headers=auth)).status_code == 200  # E2B's route, untouched
    assert (await c.get("/sandboxes/metrics", params={"sandbox_ids": sid}, headers=auth)).status_code == 200
    assert (await c.delete(f"/sandboxes/{sid}", headers=auth)).status_code == 204
    got = samples((await c.get("/metrics")).text)
    for op in ("create", "pause", "resume", "kill"):
        assert value(got, "warren_sandbox_operation_seconds_count", operation=op, runtime="runc", outcome="ok") == 1
    assert value(got, "warren_sandboxes", state="paused") == 0
    assert value(got, "warren_sandboxes", state="running") == 0


async def test_metrics_need_the_key_unless_public(make_node: Callable[..., Node]) -> None:
    public = make_node()
    assert (await public.client.get("/metrics")).status_code == 200
    private = make_node(public=False)
    c = private.client
    assert (await c.get("/metrics")).status_code == 401
    assert (await c.get("/metrics", headers={"Authorization": "Bearer nope"})).status_code == 401
    assert (await c.get("/metrics", headers={"X-API-Key": KEY})).status_code == 200
    assert (await c.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
    assert (await c.get("/health")).status_code == 200  # unchanged: public


async def test_a_node_built_without_metrics_says_so(make_node: Callable[..., Node]) -> None:
    node = make_node(with_metrics=False)
    r = await node.client.get("/metrics")
    assert r.status_code == 404 and "metrics" in r.json()["message"]
