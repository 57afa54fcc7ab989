"""Prometheus metrics of a small real cluster (one node with a cap of 1, one gateway, its own redis-server):
the gateway counts a create and a placement failure and sees the node, and both count Redis errors while
Redis is down. Its own module: it stops Redis, which the big cluster's tests must not see."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.framework.cluster import Cluster, Gateway, cluster_node, need_cluster_host, running_cluster
from tests.framework.node import Node
from tests.framework.prom import Samples, samples, value
from tests.framework.redis import RedisServer

pytestmark = [pytest.mark.root, pytest.mark.slow]

def scrape(url: str) -> Samples:
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    return samples(r.text)


def eventually(url: str, check: Callable[[Samples], bool], timeout: float = 15.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        got = scrape(url)
        if check(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


@dataclass
class Small:
    cluster: Cluster
    node: Node
    gateway: Gateway


@pytest.fixture(scope="module")
def small(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path) -> Iterator[Small]:
    need_cluster_host()
    key = "wrn_test_" + os.urandom(8).hex()
    base = tmp_path_factory.mktemp("metrics-cluster")
    node = cluster_node(base / "m1" / "state", "m1", redis_server.url, key, patched_runsc, 1)
    gateway = Gateway(base / "gw", redis_server.url, key)
    with running_cluster(redis_server, [node], [gateway], key) as cluster:
        yield Small(cluster, node, gateway)


def test_the_gateway_counts_creates_placement_failures_and_nodes(small: Small) -> None:
    gw = small.gateway
    assert value(scrape(gw.url), "warren_nodes", status="ready") == 1
    with gw.client() as c:
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
        try:
            full = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})  # the node's cap is 1
            assert full.status_code == 429, full.text
            got = scrape(gw.url)
            assert value(got, "warren_gateway_requests_total", route="create", code="201") == 1
            assert value(got, "warren_gateway_requests_total", route="create", code="429") == 1
            assert value(got, "warren_gateway_request_seconds_count", route="create") == 2
            assert value(got, "warren_placement_failures_total", reason="full") == 1
            assert value(got, "warren_placement_failures_total", reason="refused") == 0
            on_node = scrape(small.node.url)
            created = {"operation": "create", "runtime": "runc", "outcome": "ok"}
            assert value(on_node, "warren_sandbox_operation_seconds_count", **created) == 1
            assert value(on_node, "warren_sandboxes", state="running") == 1
            assert value(on_node, "warren_sandbox_limit") == 1 and value(on_node, "warren_sandbox_capacity") == 0
        finally:
            assert c.delete(f"/sandboxes/{sid}").status_code == 204
        got = scrape(gw.url)
        assert value(got, "warren_gateway_requests_total", route="sandbox", code="204") == 1


def test_redis_errors_are_counted_while_redis_is_down(small: Small) -> None:
    gw, node, redis = small.gateway, small.node, small.cluster.redis
    assert value(scrape(node.url), "warren_redis_errors_total", operation="heartbeat") == 0
    redis.stop()
    try:
        with gw.client() as c:
            assert c.get("/nodes").status_code == 503
        got = scrape(gw.url)
        assert value(got, "warren_redis_errors_total", operation="list_nodes") >= 2  # /nodes and the scrape
        assert not [k for k in got if k[0] == "warren_nodes"]  # unknown, not stale
        beats = eventually(node.url, lambda s: value(s, "warren_redis_errors_total", operation="heartbeat") >= 2)
        assert value(beats, "warren_redis_errors_total", operation="heartbeat") >= 2  # one per failed beat
    finally:
        redis.start()
    small.cluster.wait_nodes({"m1": "ready"})  # re-registered by its next heartbeat
    assert value(scrape(gw.url), "warren_nodes", status="ready") == 1
