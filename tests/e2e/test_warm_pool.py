"""The warm pool: a used template keeps N sandboxes started; a create claims one and /init's it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.framework.node import Node, running_node


@pytest.fixture
def pool_node(tmp_path: Path, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    with running_node(tmp_path / "state", runsc=patched_runsc, extra_env={"WARREN_WARM_POOL": "2"}) as node:
        for k, v in node.env().items():
            monkeypatch.setenv(k, v)
        yield node


def _pool(node: Node) -> dict[str, dict[str, int]]:
    with node.client() as c:
        stats: dict[str, dict[str, int]] = c.get("/health").json()["warmPool"]
    return stats


def _wait_ready(node: Node, n: int) -> dict[str, int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shelves = list(_pool(node).values())
        if shelves and shelves[0]["ready"] >= n:
            return shelves[0]
        time.sleep(0.1)
    raise AssertionError(f"the pool did not fill: {_pool(node)}")


def test_create_claims_a_warm_sandbox(pool_node: Node) -> None:
    first = Sandbox.create(template="busybox", envs={"WHO": "first"})
    assert _wait_ready(pool_node, 2)["misses"] == 1
    second = Sandbox.create(template="busybox", envs={"WHO": "second"}, metadata={"m": "1"})
    try:
        shelf = next(iter(_pool(pool_node).values()))
        assert shelf["hits"] == 1
        assert second.commands.run("echo $WHO").stdout.strip() == "second"
        assert second.commands.run("hostname").stdout.strip() == second.sandbox_id
        assert second.commands.run("whoami").stdout.strip() == "user"
        assert second.get_info().metadata == {"m": "1"}
        wrong = {"E2b-Sandbox-Id": second.sandbox_id, "X-Access-Token": first._envd_access_token or ""}
        stat = httpx.post(f"{pool_node.url}/filesystem.Filesystem/Stat", json={"path": "/"}, headers=wrong)
        assert stat.status_code == 401
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert listed == {first.sandbox_id, second.sandbox_id}  # pool sandboxes are not listed
    finally:
        first.kill()
        second.kill()


def test_pool_size_per_template(pool_node: Node) -> None:
    with pool_node.client() as c:
        r = c.post("/warren/templates/busybox/pool", json={"size": 1})
        assert r.status_code == 200, r.text
        assert c.post("/warren/templates/busybox/pool", json={"size": -1}).status_code == 400
        assert c.post("/warren/templates/nope/pool", json={"size": 1}).status_code == 404
    shelf = _wait_ready(pool_node, 1)
    assert shelf["target"] == 1
