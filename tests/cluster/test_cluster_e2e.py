"""Three nodes, two gateways, one real redis-server on loopback: the unmodified E2B SDK through either
gateway, placement that spreads and never over-commits, and the failures a cluster must survive
(a gateway restart, a Redis restart, a node SIGKILLed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox, AsyncTemplate, Sandbox, Template
from e2b.exceptions import NotFoundException

from tests.framework.cluster import (
    HEARTBEAT_S,
    TTL_S,
    Cluster,
    Gateway,
    cluster_node,
    need_cluster_host,
    own_network,
    own_table,
    running_cluster,
)
from tests.framework.node import DEFAULT_CACHE
from tests.framework.redis import RedisServer
from tests.framework.s3 import FAKE_CREDENTIALS, S3Server

pytestmark = [pytest.mark.root, pytest.mark.slow]

CAP = 4
NODE_IDS = ("node-a", "node-b", "node-c")


@dataclass(frozen=True)
class SharedStoreEnv:
    bucket: str
    endpoint: str
    env: dict[str, str]

    def client(self) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.endpoint)

    def parked(self, sandbox_id: str) -> bool:
        """Whether a complete copy of the paused sandbox is in the store (its manifest is written last)."""
        found = self.client().list_objects_v2(Bucket=self.bucket, Prefix=f"warren/paused/{sandbox_id}/manifest")
        return bool(found.get("KeyCount"))

    def wait_parked(self, sandbox_id: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.parked(sandbox_id):
            assert time.monotonic() < deadline, f"{sandbox_id} was not parked in the shared store"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def shared(s3_server: S3Server) -> SharedStoreEnv:
    """One bucket of the local S3 server (moto, standing in for S3/MinIO) that every node shares."""
    bucket = s3_server.make_bucket()
    env = {"WARREN_SHARED_STORE": f"s3://{bucket}/warren", "WARREN_S3_ENDPOINT": s3_server.endpoint,
           **FAKE_CREDENTIALS, "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
           "NO_PROXY": "127.0.0.1,localhost"}  # fmt: skip
    return SharedStoreEnv(bucket, s3_server.endpoint, env)


@pytest.fixture(scope="module")
def cluster(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path, shared: SharedStoreEnv
) -> Iterator[Cluster]:
    need_cluster_host()
    key = "wrn_test_" + os.urandom(8).hex()
    base = tmp_path_factory.mktemp("cluster")
    nodes = [
        cluster_node(base / i / "state", i, redis_server.url, key, patched_runsc, CAP, shared.env, own_network(n))
        for n, i in enumerate(NODE_IDS)
    ]
    gateways = [Gateway(base / f"gw{i}", redis_server.url, key) for i in range(2)]
    tables = tuple(own_table(n) for n in range(len(NODE_IDS)))
    with running_cluster(redis_server, nodes, gateways, key, gvisor_template=True, tables=tables) as c:
        yield c


@pytest.fixture(params=["runc", "gvisor"])
def template(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    if request.param == "gvisor":
        with cluster.nodes[0].client() as c:
            probe = c.get("/health").json()["runtimes"].get("gvisor", {})
        if not probe.get("available"):
            pytest.skip(f"gVisor unavailable: {probe.get('reason')}")
        return "base-gvisor"
    return "base"


def node_of(cluster: Cluster, sandbox_id: str) -> str:
    """Which node has the sandbox, asked of the nodes themselves (not of the gateway)."""
    for node_id in NODE_IDS:
        node = cluster.node(node_id)
        if node.proc is None or node.proc.poll() is not None:
            continue
        with node.client() as c:
            if c.get(f"/sandboxes/{sandbox_id}").status_code == 200:
                return node_id
    raise AssertionError(f"no node has {sandbox_id}")


def kill_all(cluster: Cluster) -> None:
    for node in cluster.nodes:
        if node.proc is not None and node.proc.poll() is None:
            node.kill_all_sandboxes()


def wait_idle(cluster: Cluster, timeout: float = 20.0) -> None:
    """Until the nodes' heartbeats say no sandbox holds a slot and no reservation is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with cluster.gateways[0].client() as c:
            nodes = [n for n in c.get("/nodes").json() if n["nodeID"] in NODE_IDS]
        if all(n["activeCount"] == 0 and n["reserved"] == 0 for n in nodes):
            return
        time.sleep(0.1)
    raise AssertionError(f"nodes not idle: {nodes}")


def test_nodes_register_with_their_capacity_and_runtimes(cluster: Cluster) -> None:
    for gw in cluster.gateways:
        with gw.client() as c:
            nodes = {n["nodeID"]: n for n in c.get("/nodes").json()}
            assert set(nodes) >= set(NODE_IDS)
            for node_id in NODE_IDS:
                assert nodes[node_id]["status"] == "ready"
                assert nodes[node_id]["maxSandboxes"] == CAP
                assert nodes[node_id]["runtimeHashes"]
                assert "runc" in nodes[node_id]["runtimeClasses"]
            detail = c.get("/nodes/node-b").json()
            assert detail["nodeID"] == "node-b" and detail["lostSandboxes"] == []
            assert c.get("/nodes/nope").status_code == 404
            assert c.get("/nodes", headers={"X-API-Key": "wrong"}).status_code == 401


def test_sdk_through_either_gateway(cluster: Cluster, template: str) -> None:
    gw0, gw1 = cluster.gateways
    sbx = Sandbox.create(template=template, timeout=300, **gw0.sdk())
    try:
        assert sbx.commands.run("echo hi").stdout.strip() == "hi"
        sbx.files.write("/home/user/c.txt", "through a gateway")
        assert sbx.files.read("/home/user/c.txt") == "through a gateway"
        sbx.commands.run("echo in-memory > /tmp/m.txt")
        assert sbx.pause() is True
        assert Sandbox.get_info(sbx.sandbox_id, **gw1.sdk()).state.value == "paused"
        resumed = Sandbox.connect(sbx.sandbox_id, **gw1.sdk())
        assert resumed.files.read("/home/user/c.txt") == "through a gateway"
        assert resumed.commands.run("cat /tmp/m.txt").stdout.strip() == "in-memory"
        assert any(s.sandbox_id == sbx.sandbox_id for s in Sandbox.list(**gw1.sdk()).next_items())
        resumed.set_timeout(120)
    finally:
        Sandbox.kill(sbx.sandbox_id, **gw1.sdk())
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **gw0.sdk())
    with gw0.client() as c:
        assert c.get(f"/sandboxes/{sbx.sandbox_id}").status_code == 404
    assert Sandbox.kill(sbx.sandbox_id, **gw0.sdk()) is False


async def test_async_sdk_through_a_gateway(cluster: Cluster, template: str) -> None:
    gw = cluster.gateways[1]
    sbx = await AsyncSandbox.create(template=template, timeout=300, **gw.sdk())
    try:
        assert (await sbx.commands.run("echo async")).stdout.strip() == "async"
        await sbx.files.write("/home/user/a.txt", "async-gw")
        assert await sbx.files.read("/home/user/a.txt") == "async-gw"
        assert await sbx.pause() is True
        resumed = await AsyncSandbox.connect(sbx.sandbox_id, **cluster.gateways[0].sdk())
        assert await resumed.files.read("/home/user/a.txt") == "async-gw"
    finally:
        await AsyncSandbox.kill(sbx.sandbox_id, **gw.sdk())


def test_creates_spread_over_the_nodes(cluster: Cluster) -> None:
    ids = []
    wait_idle(cluster)
    try:
        for i in range(3):
            with cluster.gateways[i % 2].client() as c:
                r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
                assert r.status_code == 201, r.text
                ids.append(r.json()["sandboxID"])
        assert sorted(node_of(cluster, i) for i in ids) == list(NODE_IDS)
    finally:
        kill_all(cluster)


def test_fifty_concurrent_creates_through_both_gateways_never_exceed_a_nodes_cap(cluster: Cluster) -> None:
    async def burst() -> list[httpx.Response]:
        clients = [
            httpx.AsyncClient(base_url=gw.url, headers={"X-API-Key": cluster.api_key}, timeout=300)
            for gw in cluster.gateways
        ]
        try:
            return await asyncio.gather(
                *(clients[i % 2].post("/sandboxes", json={"templateID": "base", "timeout": 300}) for i in range(50))
            )
        finally:
            for c in clients:
                await c.aclose()

    wait_idle(cluster)  # the previous test's kills are in the nodes' heartbeats
    try:
        answers = asyncio.run(burst())
        statuses = Counter(a.status_code for a in answers)
        assert set(statuses) <= {201, 429}, [a.text for a in answers if a.status_code not in (201, 429)]
        # A node counts a create twice for a moment (its slot, and the sandbox already running): a create
        # racing that moment, or a heartbeat taken in it, may see the node full. Never more than the cap.
        assert CAP * len(NODE_IDS) - 2 <= statuses[201] <= CAP * len(NODE_IDS), statuses
        per_node = Counter(node_of(cluster, a.json()["sandboxID"]) for a in answers if a.status_code == 201)
        assert max(per_node.values()) <= CAP, per_node
        for node in cluster.nodes:
            with node.client() as c:
                assert len(c.get("/v2/sandboxes").json()) <= CAP
        # Nothing leaked: once the heartbeats settle, the free slots are exactly what the burst left.
        wait_settled = time.monotonic() + 10
        with cluster.gateways[1].client() as c:
            for _ in range(CAP * len(NODE_IDS) - statuses[201]):
                while (r := c.post("/sandboxes", json={"templateID": "base", "timeout": 120})).status_code == 429:
                    assert time.monotonic() < wait_settled, r.text
                    time.sleep(0.2)
                assert r.status_code == 201, r.text
            r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
            assert r.status_code == 429, r.text
    finally:
        kill_all(cluster)


def test_a_drained_node_gets_nothing_new_and_keeps_serving_what_it_has(cluster: Cluster) -> None:
    gw0, gw1 = cluster.gateways
    sbx = Sandbox.create(template="base", timeout=300, **gw0.sdk())
    drained = node_of(cluster, sbx.sandbox_id)
    try:
        with gw0.client() as c:
            assert c.post(f"/nodes/{drained}", json={"status": "draining"}).status_code == 204
            assert c.post(f"/nodes/{drained}", json={"status": "bogus"}).status_code == 400
            assert c.post("/nodes/nope", json={"status": "draining"}).status_code == 404
        cluster.wait_nodes({drained: "draining"})
        with gw1.client() as c:
            for _ in range(4):
                r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
                assert r.status_code == 201, r.text
                assert node_of(cluster, r.json()["sandboxID"]) != drained
        assert sbx.commands.run("echo still-served").stdout.strip() == "still-served"
    finally:
        with gw0.client() as c:
            c.post(f"/nodes/{drained}", json={"status": "ready"})
        kill_all(cluster)
    cluster.wait_nodes({drained: "ready"})


def _paused_on(cluster: Cluster, shared: SharedStoreEnv, node_id: str, template: str) -> tuple[str, int | None]:
    """A sandbox made on ``node_id`` (directly), with a file and (gVisor) a process whose memory must survive,
    paused through a gateway and parked in the shared store: (its id, the process's pid or None)."""
    with cluster.node(node_id).client() as c:
        r = c.post("/sandboxes", json={"templateID": template, "timeout": 600})
        assert r.status_code == 201, r.text
        sandbox_id = r.json()["sandboxID"]
    box = Sandbox.connect(sandbox_id, **cluster.gateways[0].sdk())
    box.files.write("/home/user/moved.txt", f"from {node_id}")
    pid = None
    if template == "base-gvisor":  # memory moves with it: a process and what it holds in memory
        pid = box.commands.run("sleep 3600", background=True).pid
    assert box.pause() is True
    shared.wait_parked(sandbox_id)
    return sandbox_id, pid


def _check_moved(cluster: Cluster, sandbox_id: str, old: str, pid: int | None, via: Gateway) -> str:
    """Resumed through ``via`` on a node other than ``old``, with its file and (gVisor) its process."""
    box = Sandbox.connect(sandbox_id, timeout=300, **via.sdk())
    now = node_of(cluster, sandbox_id)
    assert now != old
    assert box.files.read("/home/user/moved.txt") == f"from {old}"
    if pid is not None:
        assert box.commands.run(f"cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout.strip() == "sleep 3600"
    assert box.commands.run("echo moved").stdout.strip() == "moved"
    return now


def _released(cluster: Cluster, node_id: str, sandbox_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    with cluster.node(node_id).client() as c:
        while c.get(f"/sandboxes/{sandbox_id}").status_code != 404:
            assert time.monotonic() < deadline, f"node {node_id} kept its copy of moved sandbox {sandbox_id}"
            time.sleep(0.2)


def test_a_drained_nodes_paused_sandboxes_resume_on_another_node(
    cluster: Cluster, shared: SharedStoreEnv, template: str
) -> None:
    gw0, gw1 = cluster.gateways
    drained = "node-a"
    sandbox_id, pid = _paused_on(cluster, shared, drained, template)
    try:
        with gw0.client() as c:
            assert c.post(f"/nodes/{drained}", json={"status": "draining"}).status_code == 204
        cluster.wait_nodes({drained: "draining"})
        _check_moved(cluster, sandbox_id, drained, pid, gw1)
        _released(cluster, drained, sandbox_id)
        assert not shared.parked(sandbox_id)  # resumed: the store's copy is stale, and gone
        Sandbox.connect(sandbox_id, **gw0.sdk()).pause()  # and it can pause and move again
        shared.wait_parked(sandbox_id)
    finally:
        with gw0.client() as c:
            c.post(f"/nodes/{drained}", json={"status": "ready"})
        Sandbox.kill(sandbox_id, **gw0.sdk())
    cluster.wait_nodes({drained: "ready"})
    assert not shared.parked(sandbox_id)  # a kill deletes the parked copy


def test_a_sigkilled_nodes_paused_sandboxes_resume_elsewhere_with_files_and_memory(
    cluster: Cluster, shared: SharedStoreEnv
) -> None:
    gw0, gw1 = cluster.gateways
    victim_id = "node-c"
    victim = cluster.node(victim_id)
    with victim.client() as c:
        gvisor = c.get("/health").json()["runtimes"].get("gvisor", {}).get("available")
    made = [_paused_on(cluster, shared, victim_id, t) for t in (["base", "base-gvisor"] if gvisor else ["base"])]
    doomed, _ = _paused_on(cluster, shared, victim_id, "base")
    try:
        victim.stop(signal.SIGKILL)
        cluster.wait_nodes({victim_id: "dead"}, timeout=TTL_S + 10)
        with gw0.client() as c:  # a kill of one paused on the dead node: its parked copy goes
            assert c.delete(f"/sandboxes/{doomed}").status_code == 204
            assert c.get(f"/sandboxes/{doomed}").status_code == 404
        assert not shared.parked(doomed)
        for sandbox_id, pid in made:
            _check_moved(cluster, sandbox_id, victim_id, pid, gw1)
        victim.start()  # it comes back with its old copies: it releases them, they are bound elsewhere
        cluster.wait_nodes({victim_id: "ready"})
        for sandbox_id, _ in made:
            _released(cluster, victim_id, sandbox_id)
            assert node_of(cluster, sandbox_id) != victim_id
        time.sleep(4 * HEARTBEAT_S)  # a returning node parks what it holds paused, unless it moved away
        for sandbox_id, _ in made:
            assert not shared.parked(sandbox_id), f"node {victim_id} parked its stale copy of {sandbox_id}"
    finally:
        if victim.proc is None or victim.proc.poll() is not None:
            victim.start()
            cluster.wait_nodes({victim_id: "ready"})
        for sandbox_id, _ in made:
            with contextlib.suppress(Exception):
                Sandbox.kill(sandbox_id, **gw0.sdk())


def test_a_snapshot_in_the_shared_store_starts_sandboxes_on_other_nodes(
    cluster: Cluster, shared: SharedStoreEnv, template: str
) -> None:
    gw0, gw1 = cluster.gateways
    origin = "node-a"
    with cluster.node(origin).client() as c:
        r = c.post("/sandboxes", json={"templateID": template, "timeout": 300})
        assert r.status_code == 201, r.text
        source_id = r.json()["sandboxID"]
    made: list[str] = [source_id]
    try:
        box = Sandbox.connect(source_id, **gw0.sdk())
        box.files.write("/home/user/snap.txt", "shared")
        info = box.create_snapshot()
        deadline = time.monotonic() + 60
        while not shared.client().list_objects_v2(
            Bucket=shared.bucket, Prefix=f"warren/snapshots/{info.snapshot_id}/manifest"
        ).get("KeyCount"):
            assert time.monotonic() < deadline, "the snapshot was not published"
            time.sleep(0.2)
        time.sleep(3 * HEARTBEAT_S)  # the origin's heartbeat says it is shared (placement reads that)
        with gw0.client() as c:
            assert c.post(f"/nodes/{origin}", json={"status": "draining"}).status_code == 204
        cluster.wait_nodes({origin: "draining"})
        child = Sandbox.create(template=info.snapshot_id, timeout=120, **gw1.sdk())
        made.append(child.sandbox_id)
        assert node_of(cluster, child.sandbox_id) != origin
        assert child.files.read("/home/user/snap.txt") == "shared"
        with gw0.client() as c:
            c.post(f"/nodes/{origin}", json={"status": "ready"})
        cluster.wait_nodes({origin: "ready"})
        time.sleep(1.5)  # the puller's heartbeat lists its copy
        assert Sandbox.delete_snapshot(info.snapshot_id, **gw1.sdk()) is True
        left = shared.client().list_objects_v2(Bucket=shared.bucket, Prefix=f"warren/snapshots/{info.snapshot_id}/")
        assert not left.get("KeyCount"), [o["Key"] for o in left.get("Contents", [])]
    finally:
        with gw0.client() as c:
            c.post(f"/nodes/{origin}", json={"status": "ready"})
        for sandbox_id in made:
            with contextlib.suppress(Exception):
                Sandbox.kill(sandbox_id, **gw0.sdk())


def test_a_move_goes_only_to_a_node_with_the_runtime_hash(
    cluster: Cluster, shared: SharedStoreEnv, redis_server: RedisServer
) -> None:
    """A parked sandbox whose runtime no node has: adopt is a 409 naming the hash, and so is the resume
    through a gateway (its node, a ghost registered in Redis, is dead)."""
    sandbox_id, _ = _paused_on(cluster, shared, "node-b", "base")
    gw0, _ = cluster.gateways
    ghost_hash = "f" * 64
    try:
        rewrite_parked_hash(shared, sandbox_id, ghost_hash)
        with cluster.node("node-a").client() as c:
            r = c.post(f"/warren/sandboxes/{sandbox_id}/adopt")
            assert r.status_code == 409 and ghost_hash in r.json()["message"], r.text
        with cluster.node("node-b").client() as c:  # its node lets it go, as if it had died
            assert c.post(f"/warren/sandboxes/{sandbox_id}/release").status_code == 204
        asyncio.run(register_dead_ghost(redis_server.url, sandbox_id))
        with gw0.client() as c:
            r = c.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60})
            assert r.status_code == 409 and ghost_hash in r.json()["message"], r.text
    finally:
        asyncio.run(forget_ghost(redis_server.url, sandbox_id))
        for key in shared.client().list_objects_v2(Bucket=shared.bucket, Prefix=f"warren/paused/{sandbox_id}/").get(
            "Contents", []
        ):
            shared.client().delete_object(Bucket=shared.bucket, Key=key["Key"])
        with cluster.node("node-b").client() as c:
            c.delete(f"/sandboxes/{sandbox_id}")


def test_list_merges_every_node_with_pagination(cluster: Cluster) -> None:
    tag = uuid.uuid4().hex
    wait_idle(cluster)  # so that the three creates spread over the three nodes
    try:
        for _i in range(3):
            with cluster.gateways[0].client() as c:
                r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120, "metadata": {"suite": tag}})
                assert r.status_code == 201, r.text
        with cluster.gateways[1].client() as c:
            orders: dict[str, list[str]] = {}
            for order in ("desc", "asc"):
                seen: list[dict[str, str]] = []
                token: str | None = None
                for _ in range(5):
                    params = {"metadata": f"suite={tag}", "limit": "1", "order": order}
                    r = c.get("/v2/sandboxes", params={**params, **({"nextToken": token} if token else {})})
                    assert r.status_code == 200 and "x-warren-partial" not in r.headers
                    seen += r.json()
                    token = r.headers.get("x-next-token")
                    if not token:
                        break
                starts = [s["startedAt"] for s in seen]
                assert starts == sorted(starts, reverse=order == "desc")
                orders[order] = [s["sandboxID"] for s in seen]
            assert len(set(orders["asc"])) == 3 and orders["desc"] == orders["asc"][::-1]
            assert len({node_of(cluster, s) for s in orders["asc"]}) == 3
            assert c.get("/v2/sandboxes", params={"nextToken": "garbage"}).status_code == 400
    finally:
        kill_all(cluster)


def test_a_gateway_restart_loses_nothing(cluster: Cluster) -> None:
    gw = cluster.gateways[0]
    sbx = Sandbox.create(template="base", timeout=300, **gw.sdk())
    try:
        with gw.client() as c:  # a route the node does not have is its 404, and the sandbox stays bound
            assert c.post(f"/sandboxes/{sbx.sandbox_id}/no-such-route", json={}).status_code == 404
            assert c.get(f"/sandboxes/{sbx.sandbox_id}").status_code == 200
        gw.stop()
        gw.start()
        again = Sandbox.connect(sbx.sandbox_id, **gw.sdk())
        assert again.commands.run("echo after-restart").stdout.strip() == "after-restart"
    finally:
        Sandbox.kill(sbx.sandbox_id, **gw.sdk())


def test_a_redis_restart_nodes_re_register_and_gateways_recover(cluster: Cluster) -> None:
    gw0, gw1 = cluster.gateways
    sbx = Sandbox.create(template="base", timeout=300, **gw0.sdk())
    try:
        cluster.redis.restart()  # an empty Redis: no nodes, no bindings
        cluster.wait_nodes(dict.fromkeys(NODE_IDS, "ready"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the bindings come back with the next heartbeats
            with gw1.client() as c:
                if c.get(f"/sandboxes/{sbx.sandbox_id}").status_code == 200:
                    break
            time.sleep(0.1)
        again = Sandbox.connect(sbx.sandbox_id, **gw1.sdk())
        assert again.commands.run("echo after-redis").stdout.strip() == "after-redis"
        fresh = Sandbox.create(template="base", timeout=120, **gw1.sdk())
        fresh.kill()
    finally:
        Sandbox.kill(sbx.sandbox_id, **gw0.sdk())


def test_a_sigkilled_node_is_dead_after_its_ttl_and_its_running_sandboxes_are_lost(cluster: Cluster) -> None:
    gw0, gw1 = cluster.gateways
    ids = []
    with gw0.client() as c:
        for _ in range(3):
            r = c.post("/sandboxes", json={"templateID": "base", "timeout": 300})
            assert r.status_code == 201, r.text
            ids.append(r.json()["sandboxID"])
    placed = {i: node_of(cluster, i) for i in ids}
    victim_id = placed[ids[0]]
    victim = cluster.node(victim_id)
    try:
        victim.stop(signal.SIGKILL)
        started = time.monotonic()
        nodes = cluster.wait_nodes({victim_id: "dead"}, timeout=TTL_S + 10)
        assert time.monotonic() - started >= TTL_S - 1.5
        assert next(n for n in nodes if n["nodeID"] == victim_id)["status"] == "dead"
        with gw1.client() as c:
            lost = c.get(f"/nodes/{victim_id}").json()["lostSandboxes"]
            assert set(lost) >= {i for i in ids if placed[i] == victim_id}  # even one made just before
            r = c.get(f"/sandboxes/{ids[0]}")
            assert r.status_code == 410 and "lost" in r.json()["message"], r.text
            listed = c.get("/v2/sandboxes")
            assert listed.status_code == 200
            assert victim_id in listed.headers["x-warren-partial"]
            assert ids[0] not in {s["sandboxID"] for s in listed.json()}
            survivors = [i for i in ids if placed[i] != victim_id]
            assert {s["sandboxID"] for s in listed.json()} >= set(survivors)
            r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
            assert r.status_code == 201, r.text
            assert node_of(cluster, r.json()["sandboxID"]) != victim_id
            assert c.delete(f"/sandboxes/{ids[0]}").status_code == 204  # forgetting a lost sandbox
            assert c.get(f"/sandboxes/{ids[0]}").status_code == 404
    finally:
        victim.start()  # re-adopts (or reaps) what the SIGKILL left behind
        cluster.wait_nodes({victim_id: "ready"})
        kill_all(cluster)


def test_snapshot_fork_and_metrics_through_the_gateways(cluster: Cluster) -> None:
    gw0, gw1 = cluster.gateways
    sbx = Sandbox.create(template="base", timeout=300, **gw0.sdk())
    made: list[str] = []
    try:
        sbx.files.write("/home/user/snap.txt", "in-snapshot")
        info = sbx.create_snapshot()
        child = Sandbox.create(template=info.snapshot_id, timeout=120, **gw1.sdk())
        made.append(child.sandbox_id)
        assert child.files.read("/home/user/snap.txt") == "in-snapshot"
        assert node_of(cluster, child.sandbox_id) == node_of(cluster, sbx.sandbox_id)  # where the snapshot is
        forks = [b for b in sbx.fork(count=2) if isinstance(b, Sandbox)]
        made += [b.sandbox_id for b in forks]
        assert len(forks) == 2
        again = Sandbox.connect(forks[0].sandbox_id, **gw1.sdk())
        assert again.files.read("/home/user/snap.txt") == "in-snapshot"
        assert sbx.get_metrics() is not None
        with gw0.client() as c:  # batch metrics: each node asked for its own sandboxes
            r = c.get("/sandboxes/metrics", params={"sandbox_ids": f"{sbx.sandbox_id},{child.sandbox_id},nope"})
            assert r.status_code == 200 and set(r.json()["sandboxes"]) <= {sbx.sandbox_id, child.sandbox_id}
        assert any(s.snapshot_id == info.snapshot_id for s in Sandbox.list_snapshots(**gw1.sdk()).next_items())
        for box in made:
            Sandbox.kill(box, **gw1.sdk())
        made.clear()
        assert Sandbox.delete_snapshot(info.snapshot_id, **gw1.sdk()) is True
    finally:
        for box in made:
            Sandbox.kill(box, **gw0.sdk())
        Sandbox.kill(sbx.sandbox_id, **gw0.sdk())


def test_a_stopped_nodes_paused_sandboxes_wait_for_it(cluster: Cluster) -> None:
    gw0, gw1 = cluster.gateways
    sbx = Sandbox.create(template="base", timeout=300, **gw0.sdk())
    sbx.files.write("/home/user/kept.txt", "kept")
    node_id = node_of(cluster, sbx.sandbox_id)
    node = cluster.node(node_id)
    try:
        node.stop()  # graceful: pauses what runs, then leaves the cluster
        cluster.wait_nodes({node_id: "stopped"}, timeout=10)
        with gw1.client() as c:
            r = c.get(f"/sandboxes/{sbx.sandbox_id}")
            assert r.status_code == 503 and "paused" in r.json()["message"], r.text
            assert c.get(f"/nodes/{node_id}").json()["sandboxes"] == {sbx.sandbox_id: "paused"}
            r = c.post("/sandboxes", json={"templateID": "base", "timeout": 60})
            assert r.status_code == 201 and node_of(cluster, r.json()["sandboxID"]) != node_id
            c.delete(f"/sandboxes/{r.json()['sandboxID']}")
        node.start()
        cluster.wait_nodes({node_id: "ready"})
        back = Sandbox.connect(sbx.sandbox_id, **gw1.sdk())
        assert back.files.read("/home/user/kept.txt") == "kept"
    finally:
        if node.proc is None or node.proc.poll() is not None:
            node.start()
        Sandbox.kill(sbx.sandbox_id, **gw0.sdk())


def test_a_sandbox_made_on_a_node_directly_is_reachable_through_a_gateway_at_once(cluster: Cluster) -> None:
    node = cluster.node("node-b")
    with node.client() as c:
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
        assert r.status_code == 201, r.text
        sandbox_id = r.json()["sandboxID"]
    try:
        with cluster.gateways[0].client() as c:  # before any heartbeat could bind it
            assert c.get(f"/sandboxes/{sandbox_id}").status_code == 200
        box = Sandbox.connect(sandbox_id, **cluster.gateways[1].sdk())
        assert box.commands.run("echo direct").stdout.strip() == "direct"
    finally:
        Sandbox.kill(sandbox_id, **cluster.gateways[1].sdk())


# ----------------------------------------------------------------------------------------- templates


def _delete_template(cluster: Cluster, name: str) -> None:
    with cluster.gateways[0].client() as c:
        for box in c.get("/v2/sandboxes").json():
            if box.get("alias") == name or box.get("templateID") == name:
                c.delete(f"/sandboxes/{box['sandboxID']}")
        r = c.delete(f"/templates/{name}")
        assert r.status_code in (204, 404), r.text


def test_a_template_built_through_one_gateway_runs_through_the_other(cluster: Cluster, tmp_path: Path) -> None:
    """The unmodified SDK's build (request, upload link, PUT, start, status polls) through gateway 0: the
    build runs on one node; a create through gateway 1 at once (before any heartbeat has the template)
    lands there."""
    gw0, gw1 = cluster.gateways
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("from the context\n")
    name = f"gw-built-{uuid.uuid4().hex[:6]}"
    template = (
        Template(file_context_path=str(ctx))
        .from_template("base")
        .run_cmd("echo built-here > /etc/built", user="root")
        .copy("hello.txt", "/home/user/hello.txt")
    )
    logs: list[str] = []
    try:
        info = Template.build(template, name, on_build_logs=lambda e: logs.append(str(e.message)), **gw0.sdk())
        assert any(line.startswith("Uploaded 'hello.txt'") for line in logs), logs
        sbx = Sandbox.create(template=name, timeout=120, **gw1.sdk())
        try:
            out = sbx.commands.run("cat /etc/built /home/user/hello.txt").stdout
            assert out.splitlines() == ["built-here", "from the context"]
            builder = node_of(cluster, sbx.sandbox_id)
        finally:
            sbx.kill()
        holders = []
        for node in cluster.nodes:
            with node.client() as c:
                if c.get(f"/templates/{name}").status_code == 200:
                    holders.append(node.extra_env["WARREN_NODE_ID"])
        assert holders == [builder]  # built once, on one node
        assert Template.exists(name, **gw1.sdk())
        assert not Template.exists(f"no-such-{name}", **gw1.sdk())
        with gw1.client() as c:  # the status of a finished build, through the other gateway
            r = c.get(f"/templates/{info.template_id}/builds/{info.build_id}/status")
            assert r.status_code == 200 and r.json()["status"] == "ready", r.text
            assert c.get(f"/templates/{info.template_id}").json()["names"] == [name]
            r = c.get(f"/templates/{info.template_id}/files/{'ab' * 32}")  # the upload URL is the gateway's
            assert r.status_code == 201 and r.json()["url"].startswith(f"{gw1.url}/warren/uploads/"), r.text
            r = c.put(r.json()["url"].removeprefix(gw1.url), content=b"not a tar")
            assert r.status_code == 201 and r.json()["size"] == 9, r.text  # streamed to the build's node
    finally:
        _delete_template(cluster, name)


async def test_a_tag_assigned_through_a_gateway_is_resolved_at_create(cluster: Cluster) -> None:
    gw0, gw1 = cluster.gateways
    name = f"gw-tags-{uuid.uuid4().hex[:6]}"

    def marked(text: str) -> Template:
        return Template().from_template("base").run_cmd(f"echo {text} > /etc/tagged", user="root")

    async def marker(ref: str) -> str:
        box = await AsyncSandbox.create(template=ref, timeout=60, **gw1.sdk())
        try:
            return (await box.files.read("/etc/tagged")).strip()
        finally:
            await box.kill()

    try:
        await AsyncTemplate.build(marked("one"), name, **gw0.sdk())
        v2 = await AsyncTemplate.build(marked("two"), f"{name}:v2", **gw1.sdk())
        assigned = await AsyncTemplate.assign_tags(f"{name}:v2", "prod", **gw0.sdk())
        assert assigned.build_id == v2.build_id
        tags = {t.tag: t.build_id for t in await AsyncTemplate.get_tags(name, **gw1.sdk())}
        assert set(tags) == {"default", "v2", "prod"} and tags["prod"] == v2.build_id
        assert await marker(f"{name}:prod") == "two"
        assert await marker(name) == "one"
        await AsyncTemplate.remove_tags(name, "prod", **gw1.sdk())
        assert "prod" not in {t.tag for t in await AsyncTemplate.get_tags(name, **gw0.sdk())}
    finally:
        _delete_template(cluster, name)


def test_admin_routes_run_on_every_node(cluster: Cluster) -> None:
    """``/warren/templates/import`` through a gateway imports on every live node; a node that refuses makes
    the answer a 502 naming it; ``GET /runtimes`` lists each runtime with the nodes that have it."""
    name = f"gw-import-{uuid.uuid4().hex[:6]}"
    src = str(DEFAULT_CACHE / "templates" / "busybox" / "rootfs")
    try:
        with cluster.gateways[0].client() as c:
            r = c.post("/warren/templates/import", json={"path": src, "name": name})
            assert r.status_code == 201, r.text
            assert r.json()["names"] == [name]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # every node's next heartbeat shows it
                nodes = {n["nodeID"]: n for n in c.get("/nodes").json() if n["nodeID"] in NODE_IDS}
                if all(any(t["name"] == name for t in n["templates"]) for n in nodes.values()):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"{name} is not on every node: {nodes}")
            r = c.post("/warren/templates/import", json={"path": src, "name": name})
            assert r.status_code == 409, r.text  # every node says the same: that answer
            with cluster.node("node-b").client() as direct:
                assert direct.delete(f"/templates/{name}").status_code == 204
            r = c.post("/warren/templates/import", json={"path": src, "name": name})
            assert r.status_code == 502, r.text  # node-b imported it, the others refused
            message = r.json()["message"]
            assert "node-a" in message and "node-c" in message and "node-b" not in message, message
            r = c.post("/warren/templates/import", json={"path": "/nowhere", "name": "x"})
            assert r.status_code in (400, 403, 404), r.text

            runtimes = c.get("/runtimes").json()
            assert runtimes and all(set(NODE_IDS) <= set(rt["nodes"]) for rt in runtimes if rt["class"] == "runc")
            assert c.post("/warren/runtimes/reload").status_code == 200
            assert c.post(f"/warren/templates/{name}/pool", json={"size": 0}).status_code == 200

            r = c.post("/warren/images/pull", json={"image": "127.0.0.1:9/warren-test/nope:v1", "name": f"{name}-p"})
            assert r.status_code == 200, r.text
            *_, last = [json.loads(line) for line in r.text.splitlines()]
            assert last["event"] == "error" and all(n in last["message"] for n in NODE_IDS), last
    finally:
        _delete_template(cluster, name)


def test_openapi_and_unserved_routes(cluster: Cluster) -> None:
    gw = cluster.gateways[1]
    r = httpx.get(f"{gw.url}/openapi.json")
    assert r.status_code == 200 and "/v3/templates" in r.json()["paths"]
    with cluster.nodes[0].client() as c:
        assert r.json() == c.get("/openapi.json").json()
    with gw.client() as c:
        r = c.get("/secrets")
        assert r.status_code == 501, r.text
        assert "not part of warren's API" in r.json()["message"], r.text


def rewrite_parked_hash(shared: SharedStoreEnv, sandbox_id: str, runtime_hash: str) -> None:
    """Re-park the sandbox's copy with a runtime hash no node has (through the store's own client)."""
    import tempfile

    from warren.snapshots.shared import S3ObjectStore, SharedSnapshots

    async def rewrite() -> None:
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            bundles = SharedSnapshots(S3ObjectStore(shared.bucket, "warren", endpoint_url=shared.endpoint),
                                      Path(tmp) / "scratch")  # fmt: skip
            data = Path(tmp) / "data"
            data.mkdir()
            manifest = await bundles.pull(f"paused/{sandbox_id}", data)
            meta = dict(manifest.meta)
            record = dict(meta["record"])
            binding = json.loads(record["binding"])
            binding["runtime_hash"] = runtime_hash
            record["binding"] = json.dumps(binding)
            meta["record"] = record
            await bundles.push(f"paused/{sandbox_id}", data, meta)

    saved = {k: os.environ.get(k) for k in FAKE_CREDENTIALS}
    os.environ.update(FAKE_CREDENTIALS)
    try:
        asyncio.run(rewrite())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


GHOST = "ghost-node"


async def register_dead_ghost(redis_url: str, sandbox_id: str) -> None:
    """A node that registered once with ``sandbox_id`` paused on it and died at once."""
    from warren.cluster.records import NodeInfo
    from warren.cluster.store import ClusterStore

    store = ClusterStore.connect(redis_url)
    try:
        await store.unbind(sandbox_id, "node-b")
        info = NodeInfo(node_id=GHOST, url="http://127.0.0.1:9", max_sandboxes=4, active=0, running=0, paused=1,
                        draining=False, runtime_classes=("runc",), runtime_hashes=())  # fmt: skip
        await store.heartbeat(info, {sandbox_id: "paused"}, ttl_s=0.2, grace_s=600)
        await asyncio.sleep(0.4)
    finally:
        await store.aclose()


async def forget_ghost(redis_url: str, sandbox_id: str) -> None:
    from warren.cluster.store import DEFAULT_PREFIX, ClusterStore

    store = ClusterStore.connect(redis_url)
    try:
        await store.unbind(sandbox_id, GHOST)
        client = store._r  # the test's own cleanup of the ghost's keys
        await client.srem(f"{DEFAULT_PREFIX}nodes", GHOST)
        await client.delete(*(f"{DEFAULT_PREFIX}node:{GHOST}{s}" for s in ("", ":alive", ":roster", ":resv",
                                                                          ":resv-sid", ":bound", ":drain")))
    finally:
        await store.aclose()
