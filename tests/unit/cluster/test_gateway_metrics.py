"""The gateway's ``GET /metrics`` in-process, over a fake cluster store and fake nodes: requests by route
class and status, placement failures by reason, nodes by status read at scrape time, Redis errors."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from tests.framework.prom import Samples, samples, value
from warren.cluster.gateway import GatewaySettings, create_gateway_app
from warren.cluster.gateway.metrics import GatewayMetrics
from warren.cluster.records import NodeInfo, NodeView, TemplateInfo
from warren.cluster.store import ClusterStore, Reserved

KEY = "wrn_unit"
BASE = TemplateInfo("t-base", "base", "runc")

def view(node_id: str, *, alive: bool = True, draining: bool = False, active: int = 0, cap: int = 4) -> NodeView:
    info = NodeInfo(
        node_id=node_id, url=f"http://{node_id}", max_sandboxes=cap, active=active, running=active, paused=0,
        draining=draining, runtime_classes=("runc",), runtime_hashes=("h",), templates=(BASE,),
    )  # fmt: skip
    return NodeView(info, alive, 0)


@dataclass
class FakeStore:
    views: list[NodeView] = field(default_factory=list)
    released: int = 0

    async def nodes(self) -> list[NodeView]:
        return list(self.views)

    async def reserve(self, node_id: str, *, hold_s: float) -> Reserved | str:
        view = next(v for v in self.views if v.node_id == node_id)
        return "full" if view.load >= view.info.max_sandboxes else Reserved(node_id, "tok")

    async def release(self, reserved: Reserved) -> None:
        self.released += 1

    async def commit(self, reserved: Reserved, sandbox_id: str, *, hold_s: float) -> None:
        pass

    async def binding(self, sandbox_id: str) -> str | None:
        return None

    async def template_node(self, ref: str) -> str | None:
        return None

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


@dataclass
class FakeNodes:
    """Every node answers a create with ``status``."""

    status: int = 201

    async def forward(self, base_url: str, request: object, body: bytes, *, path: str | None = None) -> httpx.Response:
        if self.status == 201:
            return httpx.Response(201, json={"sandboxID": "sbx1", "templateID": "base"})
        return httpx.Response(self.status, json={"code": self.status, "message": "no"})

    async def call(self, *args: object, **kwargs: object) -> httpx.Response:
        return httpx.Response(404, json={"code": 404, "message": "no"})

    async def aclose(self) -> None:
        pass


@dataclass
class Gw:
    client: httpx.AsyncClient
    store: FakeStore
    nodes: FakeNodes
    metrics: GatewayMetrics

    async def scrape(self) -> Samples:
        r = await self.client.get("/metrics")
        assert r.status_code == 200, r.text
        return samples(r.text)


@pytest.fixture
async def make_gateway() -> AsyncIterator[Callable[..., Gw]]:
    made: list[tuple[httpx.AsyncClient, object]] = []

    def make(*, public: bool = True, store: object | None = None) -> Gw:
        fake, nodes, metrics = FakeStore([view("a"), view("b")]), FakeNodes(), GatewayMetrics()
        settings = GatewaySettings(redis_url="redis://unused", api_key=KEY, metrics_public=public)
        app, proxy = create_gateway_app(settings, store or fake, nodes, metrics=metrics)  # type: ignore[arg-type]
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                   headers={"X-API-Key": KEY})  # fmt: skip
        made.append((client, proxy))
        return Gw(client, fake, nodes, metrics)

    yield make
    for client, proxy in made:
        await client.aclose()
        await proxy.aclose()  # type: ignore[attr-defined]


async def test_requests_are_counted_by_route_class_and_status(make_gateway: Callable[..., Gw]) -> None:
    gw = make_gateway()
    assert (await gw.client.post("/v2/sandboxes", json={"templateID": "base"})).status_code == 201
    assert (await gw.client.get("/nodes")).status_code == 200
    assert (await gw.client.get("/nodes", headers={"X-API-Key": "wrong"})).status_code == 401
    assert (await gw.client.get("/sandboxes/sbx1")).status_code == 404
    assert (await gw.client.get("/warren/anything")).status_code == 501
    sbx = {"E2b-Sandbox-Id": "nope", "E2b-Sandbox-Port": "49983"}
    assert (await gw.client.post("/process.Process/Start", headers=sbx)).status_code == 502
    got = await gw.scrape()
    assert value(got, "warren_gateway_requests_total", route="create", code="201") == 1
    assert value(got, "warren_gateway_requests_total", route="nodes", code="200") == 1
    assert value(got, "warren_gateway_requests_total", route="other", code="401") == 1
    assert value(got, "warren_gateway_requests_total", route="sandbox", code="404") == 1
    assert value(got, "warren_gateway_requests_total", route="other", code="501") == 1
    assert value(got, "warren_gateway_requests_total", route="dataplane", code="502") == 1
    assert value(got, "warren_gateway_request_seconds_count", route="create") == 1
    assert value(got, "warren_placement_failures_total", reason="full") == 0  # shown before any failure


async def test_placement_failures_by_reason(make_gateway: Callable[..., Gw]) -> None:
    gw = make_gateway()
    gw.store.views = [view("a", active=4), view("b", active=4)]
    assert (await gw.client.post("/sandboxes", json={"templateID": "base"})).status_code == 429
    gw.store.views = [view("a"), view("b")]
    gw.nodes.status = 429  # every node's own cap refuses it
    assert (await gw.client.post("/sandboxes", json={"templateID": "base"})).status_code == 429
    gw.nodes.status = 503  # draining nodes the heartbeat did not show yet
    assert (await gw.client.post("/sandboxes", json={"templateID": "base"})).status_code == 503
    gw.store.views = [view("a", alive=False), view("b", draining=True)]
    assert (await gw.client.post("/sandboxes", json={"templateID": "base"})).status_code == 503
    got = await gw.scrape()
    assert value(got, "warren_placement_failures_total", reason="full") == 2
    assert value(got, "warren_placement_failures_total", reason="refused") == 1
    assert value(got, "warren_placement_failures_total", reason="no_candidate") == 1
    assert gw.store.released == 4  # each node's reservation was given back


async def test_nodes_by_status_are_read_at_scrape_time(make_gateway: Callable[..., Gw]) -> None:
    gw = make_gateway()
    gw.store.views = [view("a"), view("b"), view("c", draining=True), view("d", alive=False),
                      view("e", alive=False, draining=True)]  # fmt: skip
    got = await gw.scrape()
    assert value(got, "warren_nodes", status="ready") == 2
    assert value(got, "warren_nodes", status="draining") == 1
    assert value(got, "warren_nodes", status="dead") == 1
    assert value(got, "warren_nodes", status="stopped") == 1
    gw.store.views = [view("a")]
    again = await gw.scrape()
    assert value(again, "warren_nodes", status="ready") == 1 and value(again, "warren_nodes", status="dead") == 0


async def test_redis_away_is_counted_and_the_scrape_still_answers(make_gateway: Callable[..., Gw]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = GatewayMetrics()
    store = ClusterStore.connect(f"redis://127.0.0.1:{port}/0", timeout_s=0.5, on_error=metrics.redis_errors)
    try:
        settings = GatewaySettings(redis_url="redis://unused", api_key=KEY)
        app, proxy = create_gateway_app(settings, store, FakeNodes(), metrics=metrics)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            assert (await c.get("/nodes", headers={"X-API-Key": KEY})).status_code == 503
            r = await c.get("/metrics")
            assert r.status_code == 200
        await proxy.aclose()
    finally:
        await store.aclose()
    got = samples(r.text)
    assert value(got, "warren_redis_errors_total", operation="list_nodes") == 2  # /nodes and the scrape
    assert not [k for k in got if k[0] == "warren_nodes"]  # unknown, not stale


async def test_metrics_need_the_key_unless_public(make_gateway: Callable[..., Gw]) -> None:
    public = make_gateway()
    assert (await public.client.get("/metrics", headers={"X-API-Key": ""})).status_code == 200
    private = make_gateway(public=False)
    assert (await private.client.get("/metrics", headers={"X-API-Key": ""})).status_code == 401
    assert (await private.client.get("/metrics")).status_code == 200
    bearer = {"X-API-Key": "", "Authorization": f"Bearer {KEY}"}
    assert (await private.client.get("/metrics", headers=bearer)).status_code == 200
