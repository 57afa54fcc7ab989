"""A node's heartbeat task against a real redis-server: it registers, survives Redis going away (and a
bug in its own snapshot), re-registers into an emptied Redis, and leaves cleanly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.framework.redis import running_redis
from warren.cluster.membership import Heartbeat, node_id_of
from warren.cluster.records import NodeInfo
from warren.cluster.store import ClusterStore
from warren.config import Settings


def _info(draining: bool) -> NodeInfo:
    return NodeInfo(node_id="n1", url="http://n1", max_sandboxes=4, active=1, running=1, paused=0,
                    draining=draining, runtime_classes=("runc",), runtime_hashes=("h",))  # fmt: skip


async def _until(predicate: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(5.0):
        for _ in range(1000):
            if await predicate():
                return
            await asyncio.sleep(0.05)


async def test_heartbeat_survives_redis_restarts_and_bugs_then_leaves(tmp_path: Path) -> None:
    calls = 0

    async def snapshot(draining: bool) -> tuple[NodeInfo, dict[str, str]]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("a bug in the snapshot")
        return _info(draining), {"s1": "running"}

    with running_redis(tmp_path / "redis") as server:
        store = ClusterStore.connect(server.url, timeout_s=0.5)
        beat = Heartbeat(store, "n1", snapshot, interval_s=0.1, ttl_s=1.0)
        task = asyncio.create_task(beat.run())
        try:

            async def registered() -> bool:
                with contextlib.suppress(Exception):
                    nodes = await store.nodes()
                    return bool(nodes) and nodes[0].alive and await store.binding("s1") == "n1"
                return False

            await _until(registered)
            server.restart()  # empty

            async def back_after_the_bug() -> bool:
                return calls > 3 and await registered()

            await _until(back_after_the_bug)
            assert not task.done()
            task.cancel()
            await beat.leave()
            [node] = await store.nodes()
            assert not node.alive and node.status == "stopped"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await store.aclose()


def test_a_node_id_is_generated_once_and_kept(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    first = node_id_of(settings)
    assert first.startswith("warren-") and node_id_of(settings) == first
    assert node_id_of(Settings(state_dir=tmp_path, node_id="mine")) == "mine"


@pytest.mark.parametrize("var", ["WARREN_CLUSTER_REDIS", "WARREN_NODE_ID"])
def test_cluster_settings_come_from_the_environment(var: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(var, "x")
    settings = Settings.from_env(tmp_path)
    assert (settings.cluster_redis if var == "WARREN_CLUSTER_REDIS" else settings.node_id) == "x"


def test_the_advertised_url(tmp_path: Path) -> None:
    from warren.cluster.membership import advertise_url

    assert advertise_url(Settings(state_dir=tmp_path, listen_host="10.0.0.5"), 3000) == "http://10.0.0.5:3000"
    assert advertise_url(Settings(state_dir=tmp_path, advertise_url="http://n1:9/"), 3000) == "http://n1:9"
    assert advertise_url(Settings(state_dir=tmp_path, listen_host="::1"), 3000) == "http://[::1]:3000"
    everywhere = advertise_url(Settings(state_dir=tmp_path, listen_host="0.0.0.0"), 3000)
    assert "0.0.0.0" not in everywhere and everywhere.endswith(":3000")
