"""Section "cluster": what a gateway adds, and creates/s with three nodes vs one.

One redis-server on loopback, nodes started with ``--cluster-redis``, one ``warren gateway``:

* create-to-first-command and ``commands.run("true")`` p50/p99, direct to the node vs through the
  gateway, interleaved (same node, same sandbox for the round trips);
* ``GET /sandboxes/{id}`` (a control-plane call: a binding lookup in Redis, then the node);
* creates/s through the gateway at 6 concurrent clients with 1 node and with 3 nodes (on one host
  the nodes share its CPUs: this measures the gateway's spreading, not more hardware);
* moves (two nodes sharing a snapshot store on a directory, each with its own network): how long a
  paused sandbox takes to be parked, and a connect through the gateway that resumes it on its own node
  vs one that moves it to the other node (its node drained), runc and gVisor.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.stats import summary_ms, timed
from tests.framework.cluster import Gateway, cluster_node, own_network, own_table, running_cluster
from tests.framework.node import Node, free_port
from tests.framework.redis import REDIS_SERVER, RedisServer


@contextlib.contextmanager
def _cluster(
    work: Path, runsc: Path | None, n_nodes: int, cap: int, shared: Path | None = None
) -> Iterator[tuple[list[Node], Gateway]]:
    redis = RedisServer(work / "redis", free_port())
    redis.start()
    key = "wrn_bench_" + os.urandom(8).hex()
    store = {"WARREN_SHARED_STORE": str(shared)} if shared else None

    def network(i: int) -> dict[str, str] | None:
        return own_network(i) if shared else None

    nodes = [
        cluster_node(work / f"n{i}" / "state", f"bench-{i}", redis.url, key, runsc, cap, store, network(i))
        for i in range(n_nodes)
    ]
    gateway = Gateway(work / "gw", redis.url, key)
    tables = tuple(own_table(i) for i in range(n_nodes)) if shared else ()
    try:
        with running_cluster(redis, nodes, [gateway], key, gvisor_template=shared is not None, tables=tables):
            yield nodes, gateway
    finally:
        redis.stop()


def _opts(url: str, key: str) -> dict[str, str]:
    return {"api_url": url, "sandbox_url": url, "api_key": key}


def _create_to_first_command(opts: dict[str, str]) -> float:
    from e2b import Sandbox

    t0 = time.perf_counter()
    sbx = Sandbox.create(template="base", timeout=120, **opts)
    try:
        sbx.commands.run("true")
        return time.perf_counter() - t0
    finally:
        sbx.kill()


def _added(direct: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    return {"direct": direct, "gateway": gateway, "added_p50_ms": round(gateway["p50_ms"] - direct["p50_ms"], 2),
            "added_p99_ms": round(gateway["p99_ms"] - direct["p99_ms"], 2)}  # fmt: skip


def _overhead(work: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    from e2b import Sandbox

    with _cluster(work / "one", runsc, 1, 0) as (nodes, gw):
        node = nodes[0]
        direct, through = _opts(node.url, node.api_key), _opts(gw.url, gw.api_key)
        creates: dict[str, list[float]] = {"direct": [], "gateway": []}
        for _ in range(max(3, int(20 * scale))):
            creates["direct"].append(_create_to_first_command(direct))
            creates["gateway"].append(_create_to_first_command(through))
        sbx = Sandbox.create(template="base", timeout=300, **through)
        try:
            via_node = Sandbox.connect(sbx.sandbox_id, **direct)
            for _ in range(5):
                sbx.commands.run("true")
                via_node.commands.run("true")
            runs: dict[str, list[float]] = {"direct": [], "gateway": []}
            gets: dict[str, list[float]] = {"direct": [], "gateway": []}
            with node.client() as dc, gw.client() as gc:
                for _ in range(max(20, int(200 * scale))):
                    runs["direct"].append(timed(lambda: via_node.commands.run("true")))
                    runs["gateway"].append(timed(lambda: sbx.commands.run("true")))
                    gets["direct"].append(timed(lambda: dc.get(f"/sandboxes/{sbx.sandbox_id}")))
                    gets["gateway"].append(timed(lambda: gc.get(f"/sandboxes/{sbx.sandbox_id}")))
        finally:
            sbx.kill()
    return {
        "create_to_first_command": _added(summary_ms(creates["direct"]), summary_ms(creates["gateway"])),
        "commands_run": _added(summary_ms(runs["direct"]), summary_ms(runs["gateway"])),
        "get_sandbox": _added(summary_ms(gets["direct"]), summary_ms(gets["gateway"])),
    }


def _creates_per_s(work: Path, runsc: Path | None, n_nodes: int, total: int) -> dict[str, Any]:
    with _cluster(work / f"x{n_nodes}", runsc, n_nodes, 0) as (_, gw):
        client = httpx.Client(base_url=gw.url, headers={"X-API-Key": gw.api_key}, timeout=300)

        def one(_: int) -> int:
            r = client.post("/sandboxes", json={"templateID": "base", "timeout": 120})
            if r.status_code == 201:
                client.delete(f"/sandboxes/{r.json()['sandboxID']}")
            return r.status_code

        try:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(6) as pool:
                statuses = list(pool.map(one, range(total)))
            wall = time.perf_counter() - t0
        finally:
            client.close()
    return {"nodes": n_nodes, "creates": total, "ok": statuses.count(201), "wall_s": round(wall, 2),
            "creates_per_s": round(statuses.count(201) / wall, 2)}  # fmt: skip


_GATEWAY_VIEW_S = 0.6


def _wait_parked(store: Path, sandbox_id: str, timeout: float = 120.0) -> float:
    t0 = time.perf_counter()
    while not (store / "paused" / sandbox_id / "manifest.json").exists():
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"{sandbox_id} was not parked in {timeout}s")
        time.sleep(0.005)
    return time.perf_counter() - t0


def _check_on(node: Node, sandbox_id: str) -> None:
    with node.client() as c:
        if c.get(f"/sandboxes/{sandbox_id}").status_code != 200:
            raise RuntimeError(f"{sandbox_id} is not on node {node.extra_env['WARREN_NODE_ID']}")


def _connect(sandbox_id: str, opts: dict[str, str]) -> float:
    from e2b import Sandbox

    return timed(lambda: Sandbox.connect(sandbox_id, **opts))


def _moves(work: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    from e2b import Sandbox

    store = work / "moves-store"
    store.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    with _cluster(work / "moves", runsc, 2, 0, shared=store) as (nodes, gw):
        opts = _opts(gw.url, gw.api_key)
        with nodes[0].client() as c:
            gvisor = c.get("/health").json()["runtimes"].get("gvisor", {}).get("available")
        for template in ["base", "base-gvisor"] if gvisor else ["base"]:
            parked, local, moved = [], [], []
            for _ in range(max(2, int(8 * scale))):
                with nodes[0].client() as c:
                    sandbox_id = c.post("/sandboxes", json={"templateID": template, "timeout": 300}).json()["sandboxID"]
                try:
                    box = Sandbox.connect(sandbox_id, **opts)
                    box.files.write("/home/user/f.txt", "x")
                    box.pause()
                    parked.append(_wait_parked(store, sandbox_id))
                    local.append(_connect(sandbox_id, opts))
                    _check_on(nodes[0], sandbox_id)
                    box.pause()
                    _wait_parked(store, sandbox_id)
                    with gw.client() as c:
                        c.post("/nodes/bench-0", json={"status": "draining"})
                    time.sleep(_GATEWAY_VIEW_S)  # the gateway re-reads node records this often
                    moved.append(_connect(sandbox_id, opts))
                    _check_on(nodes[1], sandbox_id)
                finally:
                    with gw.client() as c:
                        c.post("/nodes/bench-0", json={"status": "ready"})
                        c.delete(f"/sandboxes/{sandbox_id}")
                    time.sleep(_GATEWAY_VIEW_S)  # so the next round's node 0 is ready again to the gateway
            out[template] = {"parked_after_pause": summary_ms(parked), "resume_on_its_node": summary_ms(local),
                             "resume_moved": summary_ms(moved)}  # fmt: skip
    return out


def run_cluster(work: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    if REDIS_SERVER is None:
        return {"skipped": "redis-server is not installed"}
    total = max(6, int(24 * scale))
    return {
        "overhead": _overhead(work, runsc, scale),
        "creates_per_s": [_creates_per_s(work, runsc, n, total) for n in (1, 3)],
        "moves": _moves(work, runsc, scale),
    }
