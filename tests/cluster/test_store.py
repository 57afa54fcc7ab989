"""The cluster store against a real redis-server: membership with a TTL, rosters and bindings, and
capacity reservations that concurrent gateways cannot over-commit."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from tests.framework.redis import RedisServer
from warren.cluster.records import NodeInfo
from warren.cluster.store import ClusterStore, Reserved
from warren.errors import UnavailableError


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[ClusterStore]:
    s = ClusterStore.connect(redis_server.url, prefix=f"t{secrets.token_hex(4)}:")
    yield s
    await s.aclose()


def info(node_id: str, *, active: int = 0, cap: int = 4, draining: bool = False) -> NodeInfo:
    return NodeInfo(node_id=node_id, url=f"http://{node_id}", max_sandboxes=cap, active=active, running=active,
                    paused=0, draining=draining, runtime_classes=("runc",), runtime_hashes=("h",))  # fmt: skip


async def test_a_heartbeat_registers_and_its_ttl_makes_the_node_dead(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {"s1": "running", "s2": "paused"}, ttl_s=0.3, grace_s=5)
    [node] = await store.nodes()
    assert node.alive and node.status == "ready" and node.info.url == "http://a"
    assert await store.roster("a") == {"s1": "running", "s2": "paused"}
    assert await store.binding("s1") == "a"
    await asyncio.sleep(0.5)
    [node] = await store.nodes()
    assert not node.alive and node.status == "dead"
    assert node.body(await store.roster("a"))["lostSandboxes"] == ["s1"]


async def test_the_roster_is_replaced_each_heartbeat(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {"s1": "running"}, ttl_s=5, grace_s=5)
    await store.heartbeat(info("a"), {"s2": "running"}, ttl_s=5, grace_s=5)
    assert await store.roster("a") == {"s2": "running"}


async def test_leave_marks_the_node_not_live_but_keeps_its_record(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {"s1": "paused"}, ttl_s=5, grace_s=5)
    await store.leave("a")
    [node] = await store.nodes()
    assert not node.alive
    assert await store.binding("s1") == "a"


async def test_concurrent_reservations_never_exceed_the_cap(redis_server: RedisServer) -> None:
    prefix = f"t{secrets.token_hex(4)}:"
    gateways = [ClusterStore.connect(redis_server.url, prefix=prefix) for _ in range(2)]
    try:
        await gateways[0].heartbeat(info("a", active=1, cap=5), {}, ttl_s=5, grace_s=5)
        results = await asyncio.gather(*(gateways[i % 2].reserve("a", hold_s=30) for i in range(50)))
        held = [r for r in results if isinstance(r, Reserved)]
        assert len(held) == 4
        assert {r for r in results if isinstance(r, str)} == {"full"}
        assert (await gateways[1].nodes())[0].reserved == 4
        await gateways[0].release(held[0])
        assert isinstance(await gateways[1].reserve("a", hold_s=30), Reserved)
    finally:
        for g in gateways:
            await g.aclose()


async def test_a_dead_or_draining_node_takes_no_reservation(store: ClusterStore) -> None:
    assert await store.reserve("ghost", hold_s=5) == "dead"
    await store.heartbeat(info("a", draining=True), {}, ttl_s=5, grace_s=5)
    assert await store.reserve("a", hold_s=5) == "draining"


async def test_a_committed_reservation_holds_until_the_heartbeat_counts_the_sandbox(store: ClusterStore) -> None:
    await store.heartbeat(info("a", cap=2), {}, ttl_s=5, grace_s=30)
    held = await store.reserve("a", hold_s=30)
    assert isinstance(held, Reserved)
    await store.commit(held, "s1", hold_s=30)
    assert await store.binding("s1") == "a"
    await store.heartbeat(info("a", cap=2), {}, ttl_s=5, grace_s=30)  # taken before the create ended
    assert (await store.nodes())[0].reserved == 1
    await store.heartbeat(info("a", active=1, cap=2), {"s1": "running"}, ttl_s=5, grace_s=30)
    assert (await store.nodes())[0].reserved == 0


async def test_a_committed_reservation_whose_sandbox_never_shows_goes_after_the_grace(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {}, ttl_s=5, grace_s=0.2)
    held = await store.reserve("a", hold_s=30)
    assert isinstance(held, Reserved)
    await store.commit(held, "s1", hold_s=30)
    await asyncio.sleep(0.3)
    await store.heartbeat(info("a"), {}, ttl_s=5, grace_s=0.2)
    assert (await store.nodes())[0].reserved == 0


async def test_an_abandoned_reservation_expires(store: ClusterStore) -> None:
    await store.heartbeat(info("a", cap=1), {}, ttl_s=5, grace_s=5)
    assert isinstance(await store.reserve("a", hold_s=0.2), Reserved)
    assert await store.reserve("a", hold_s=0.2) == "full"
    await asyncio.sleep(0.3)
    assert isinstance(await store.reserve("a", hold_s=0.2), Reserved)


async def test_unbind_only_removes_a_binding_to_that_node(store: ClusterStore) -> None:
    await store.bind("s1", "b")
    await store.unbind("s1", "a")
    assert await store.binding("s1") == "b"
    await store.unbind("s1", "b")
    assert await store.binding("s1") is None


async def test_redis_down_is_unavailable_then_recovers(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.framework.redis import running_redis

    with running_redis(tmp_path_factory.mktemp("redis-restart")) as server:
        store = ClusterStore.connect(server.url, timeout_s=0.5)
        try:
            await store.heartbeat(info("a"), {"s1": "running"}, ttl_s=5, grace_s=5)
            server.stop()
            with pytest.raises(UnavailableError, match="Redis"):
                await store.nodes()
            server.start()
            assert await store.nodes() == []  # an empty Redis: the next heartbeat registers again
            await store.heartbeat(info("a"), {"s1": "running"}, ttl_s=5, grace_s=5)
            assert await store.binding("s1") == "a"
        finally:
            await store.aclose()


async def test_an_admin_drain_stops_reservations_until_lifted(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {}, ttl_s=5, grace_s=5)
    await store.set_drain("a", True)
    assert await store.reserve("a", hold_s=5) == "draining"
    [node] = await store.nodes()
    assert node.status == "draining" and node.alive
    await store.heartbeat(info("a"), {}, ttl_s=5, grace_s=5)  # the node's own beat does not lift it
    assert (await store.nodes())[0].status == "draining"
    await store.set_drain("a", False)
    assert isinstance(await store.reserve("a", hold_s=5), Reserved)


async def test_a_committed_sandbox_is_in_the_roster_before_any_heartbeat_has_it(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {}, ttl_s=0.3, grace_s=5)
    held = await store.reserve("a", hold_s=30)
    assert isinstance(held, Reserved)
    await store.commit(held, "s1", hold_s=30)
    await store.bind("s2", "a")  # a fork child
    await asyncio.sleep(0.5)  # the node died before its next heartbeat
    [node] = await store.nodes()
    assert node.body(await store.roster("a"))["lostSandboxes"] == ["s1", "s2"]
    assert node.roster_size == 2


async def test_bindings_of_sandboxes_gone_from_the_roster_are_collected_after_the_grace(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {"old": "running"}, ttl_s=5, grace_s=0.3)
    held = await store.reserve("a", hold_s=30)
    assert isinstance(held, Reserved)
    await store.commit(held, "new", hold_s=30)
    await store.bind("child", "a")
    await store.bind("elsewhere", "b")
    await store.heartbeat(info("a"), {}, ttl_s=5, grace_s=0.3)  # within the grace: all kept
    assert [await store.binding(s) for s in ("old", "new", "child")] == ["a", "a", "a"]
    await asyncio.sleep(0.4)
    await store.heartbeat(info("a"), {"child": "running"}, ttl_s=5, grace_s=0.3)
    assert [await store.binding(s) for s in ("old", "new", "child", "elsewhere")] == [None, None, "a", "b"]


async def test_a_heartbeat_does_not_bind_back_a_sandbox_that_moved_to_another_node(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {"s1": "paused"}, ttl_s=5, grace_s=5)
    await store.heartbeat(info("b"), {}, ttl_s=5, grace_s=5)
    held = await store.reserve("b", hold_s=5)
    assert isinstance(held, Reserved)
    await store.commit(held, "s1", hold_s=5)  # a gateway moved it to b
    await store.unbind("s1", "a")
    await store.heartbeat(info("a"), {"s1": "paused"}, ttl_s=5, grace_s=5)  # a still lists its old copy
    assert await store.binding("s1") == "b"
    assert await store.bindings(["s1", "nope"]) == {"s1": "b", "nope": None}


async def test_one_gateway_at_a_time_moves_a_sandbox(store: ClusterStore) -> None:
    token = await store.claim_move("s1", hold_s=5)
    assert token is not None
    assert await store.claim_move("s1", hold_s=5) is None
    await store.end_move("s1", "not-the-token")
    assert await store.claim_move("s1", hold_s=5) is None
    await store.end_move("s1", token)
    assert await store.claim_move("s1", hold_s=5) is not None


async def test_an_admin_drain_is_visible_to_the_node(store: ClusterStore) -> None:
    await store.heartbeat(info("a"), {}, ttl_s=5, grace_s=5)
    assert not await store.drained("a")
    await store.set_drain("a", True)
    assert await store.drained("a")


async def test_a_template_built_through_a_gateway_is_remembered_by_id_and_name(store: ClusterStore) -> None:
    assert await store.template_node("tpl-1") is None
    await store.set_template_node(["tpl-1", "web", ""], "a")
    assert await store.template_node("tpl-1") == "a" and await store.template_node("web") == "a"
    assert await store.template_node("") is None
    await store.set_template_node(["web"], "b")  # built again elsewhere: the last build wins
    await store.forget_template(["tpl-1", "web"], "a")  # a delete on a: only refs still naming a go
    assert await store.template_node("tpl-1") is None and await store.template_node("web") == "b"
    await store.set_template_node([], "a")  # nothing to remember: no error


async def test_template_nodes_are_per_prefix(redis_server: RedisServer) -> None:
    one, two = (ClusterStore.connect(redis_server.url, prefix=f"t{secrets.token_hex(4)}:") for _ in range(2))
    try:
        await one.set_template_node(["web"], "a")
        assert await two.template_node("web") is None
    finally:
        await one.aclose()
        await two.aclose()
