"""E2B semantics the SDK relies on (issue 11), sync and async, on runc and gVisor:

- a paused or killed sandbox behind the proxy answers 502 (the SDK's "not running") saying which;
- list: newest first, ``order``, ``startedAfter``, ``template``, pages stable under concurrent creates;
- metrics: a 5 s series for the sandbox's life, ``start``/``end``, nothing while paused, the batch route;
- fork: 1-100 children, 409 for a paused source;
- get_info: what the create asked for.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery
from e2b.api.client.api.sandboxes import get_sandboxes_metrics, post_sandboxes_sandbox_id_fork
from e2b.api.client.models import SandboxForkRequest
from e2b.api.client_async import get_api_client as get_async_api_client
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import SandboxException

from tests.framework.node import Node

# ----- paused or killed behind the proxy ---------------------------------------------------------


def _proxy_answer(node: Node, sandbox_id: str) -> httpx.Response:
    return httpx.get(f"{node.url}/health", headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"})


def _assert_not_running_answer(node: Node, sandbox_id: str, word: str) -> None:
    r = _proxy_answer(node, sandbox_id)
    assert r.status_code == 502, r.text
    body = r.json()
    assert body["code"] == 502 and body["sandboxId"] == sandbox_id
    assert word in body["message"] and "was not found" in body["message"], body


def test_paused_and_killed_are_not_running(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=120)
    try:
        assert box.is_running() is True
        assert box.pause() is True
        assert box.is_running() is False
        _assert_not_running_answer(node, box.sandbox_id, "paused")
        Sandbox.connect(box.sandbox_id)
        assert box.is_running() is True
        assert Sandbox.pause(box.sandbox_id) is True  # by id, then the instance asks
        assert box.is_running() is False
    finally:
        box.kill()
    assert box.is_running() is False
    _assert_not_running_answer(node, box.sandbox_id, "killed")


async def test_paused_and_killed_are_not_running_async(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        assert await box.is_running() is True
        assert await box.pause() is True
        assert await box.is_running() is False
        await AsyncSandbox.connect(box.sandbox_id)
        assert await box.is_running() is True
        assert await AsyncSandbox.pause(box.sandbox_id) is True
        assert await box.is_running() is False
    finally:
        await box.kill()
    assert await box.is_running() is False


def test_auto_resume_still_wakes_on_traffic(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        box.files.write("/home/user/a.txt", "awake")
        assert box.pause() is True
        assert box.get_info().state.value == "paused"
        assert box.is_running() is True  # the health check is traffic: it resumes the sandbox
        assert box.files.read("/home/user/a.txt") == "awake"
        assert box.get_info().state.value == "running"
    finally:
        box.kill()


# ----- list --------------------------------------------------------------------------------------


def _create_three(template: str, tag: str) -> list[Sandbox]:
    boxes = []
    for i in range(3):
        boxes.append(Sandbox.create(template=template, timeout=120, metadata={"tag": tag, "n": str(i)}))
        time.sleep(0.01)
    return boxes


def test_list_order_started_after_template_and_stable_pages(node: Node, template: str) -> None:
    tag = uuid.uuid4().hex
    boxes = _create_three(template, tag)
    extra: list[Sandbox] = []
    try:
        ids = [b.sandbox_id for b in boxes]
        query = SandboxQuery(metadata={"tag": tag})
        assert [s.sandbox_id for s in Sandbox.list(query=query).next_items()] == ids[::-1]  # newest first
        assert [s.sandbox_id for s in Sandbox.list(query=query, order="desc").next_items()] == ids[::-1]
        assert [s.sandbox_id for s in Sandbox.list(query=query, order="asc").next_items()] == ids

        second = Sandbox.get_info(ids[1])
        after = SandboxQuery(metadata={"tag": tag}, started_after=second.started_at)
        assert [s.sandbox_id for s in Sandbox.list(query=after, order="asc").next_items()] == ids[1:]

        template_id = second.template_id
        for ref in (template, template_id):
            found = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template=ref)).next_items()
            assert [s.sandbox_id for s in found] == ids[::-1], ref
        other = "base-gvisor" if template == "base" else "base"
        assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template=other)).next_items() == []

        # Pages under concurrent creates: nothing skipped, nothing repeated, in either order.
        for order in ("desc", "asc"):
            paginator = Sandbox.list(query=query, limit=1, order=order)
            seen = [s.sandbox_id for s in paginator.next_items()]
            extra.append(Sandbox.create(template=template, timeout=120, metadata={"tag": tag}))
            while paginator.has_next:
                seen += [s.sandbox_id for s in paginator.next_items()]
            assert len(seen) == len(set(seen)), seen
            assert set(ids) <= set(seen), (order, seen)
            assert set(seen) <= set(ids) | {b.sandbox_id for b in extra}
        with node.client() as c:
            assert c.get("/v2/sandboxes", params={"order": "sideways"}).status_code == 400
            assert int(c.get("/v2/sandboxes", params={"limit": 1}).headers["x-total-running"]) >= len(ids)
            assert c.get("/v2/sandboxes", params={"startedAfter": "yesterday"}).status_code == 400
            v1 = c.get("/sandboxes", params={"metadata": f"tag={tag}"}).json()
            listed = [s["sandboxID"] for s in v1]
            assert listed == sorted(listed, key=lambda i: -(ids + [b.sandbox_id for b in extra]).index(i))
    finally:
        for b in [*boxes, *extra]:
            b.kill()


async def test_list_order_and_filters_async(node: Node, template: str) -> None:
    tag = uuid.uuid4().hex
    boxes = []
    try:
        for i in range(3):
            boxes.append(await AsyncSandbox.create(template=template, timeout=120, metadata={"tag": tag, "n": str(i)}))
        ids = [b.sandbox_id for b in boxes]
        query = SandboxQuery(metadata={"tag": tag})
        assert [s.sandbox_id for s in await AsyncSandbox.list(query=query).next_items()] == ids[::-1]
        assert [s.sandbox_id for s in await AsyncSandbox.list(query=query, order="asc").next_items()] == ids
        third = await AsyncSandbox.get_info(ids[2])
        after = SandboxQuery(metadata={"tag": tag}, started_after=third.started_at, template=template)
        assert [s.sandbox_id for s in await AsyncSandbox.list(query=after).next_items()] == ids[2:]
        paginator = AsyncSandbox.list(query=query, limit=2)
        seen = [s.sandbox_id for s in await paginator.next_items()]
        boxes.append(await AsyncSandbox.create(template=template, timeout=120, metadata={"tag": tag}))
        while paginator.has_next:
            seen += [s.sandbox_id for s in await paginator.next_items()]
        assert seen == ids[::-1]
    finally:
        for b in boxes:
            await b.kill()


# ----- metrics -----------------------------------------------------------------------------------


def _stamps(metrics: list) -> list[float]:  # type: ignore[type-arg]
    return [m.timestamp.timestamp() for m in metrics]


def test_metrics_series_range_pause_and_batch(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=180)
    try:
        time.sleep(11)
        series = box.get_metrics()
        stamps = _stamps(series)
        assert len(series) >= 2, series
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        assert all(s % 5 == 0 for s in stamps)  # 5 s buckets
        assert all(m.mem_total > 0 and m.cpu_count >= 1 for m in series)
        first = series[0].timestamp
        assert _stamps(box.get_metrics(end=first)) == [stamps[0]]
        later = box.get_metrics(start=series[1].timestamp)
        assert _stamps(later)[0] == stamps[1] and stamps[0] not in _stamps(later)

        box.pause()
        paused_at = time.time()
        time.sleep(11)
        during = [s for s in _stamps(box.get_metrics()) if paused_at + 5 < s < time.time()]
        assert during == []  # no samples while paused
        Sandbox.connect(box.sandbox_id)

        config = ConnectionConfig()
        res = get_sandboxes_metrics.sync_detailed(client=get_api_client(config), sandbox_ids=[box.sandbox_id, "inope"])
        assert res.status_code == 200, res.content
        assert res.parsed is not None
        metrics = res.parsed.sandboxes  # the SDK's model leaves this map as parsed JSON
        assert set(metrics) == {box.sandbox_id}
        assert metrics[box.sandbox_id]["memTotal"] > 0 and metrics[box.sandbox_id]["timestampUnix"] % 5 == 0
        with node.client() as c:
            assert c.get("/sandboxes/metrics").status_code == 400
            too_many = ",".join(f"i{n}" for n in range(101))
            assert c.get("/sandboxes/metrics", params={"sandbox_ids": too_many}).status_code == 400
    finally:
        box.kill()


async def test_metrics_series_async(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=180)
    try:
        await asyncio.sleep(11)
        series = await box.get_metrics()
        assert len(series) >= 2, series
        stamps = _stamps(series)
        assert all(s % 5 == 0 for s in stamps)
        end = datetime.datetime.fromtimestamp(stamps[0], tz=datetime.UTC)
        assert _stamps(await box.get_metrics(end=end)) == [stamps[0]]
        res = await get_sandboxes_metrics.asyncio_detailed(
            client=get_async_api_client(ConnectionConfig()), sandbox_ids=[box.sandbox_id]
        )
        assert res.status_code == 200 and res.parsed is not None
        assert set(res.parsed.sandboxes) == {box.sandbox_id}
    finally:
        await box.kill()


# ----- fork --------------------------------------------------------------------------------------
# E2B's spec takes 1-100 children; SDK 2.63's fork() checks 1-20 itself (MAX_FORK_COUNT), so larger
# counts go through the SDK's generated API client, which sends what it is given.


def _fork_status(sandbox_id: str, count: int) -> int:
    res = post_sandboxes_sandbox_id_fork.sync_detailed(
        sandbox_id, client=get_api_client(ConnectionConfig()), body=SandboxForkRequest(count=count)
    )
    return res.status_code


def test_fork_limit_is_100_and_paused_source_conflicts(sbx: Sandbox) -> None:
    assert _fork_status(sbx.sandbox_id, 101) == 400
    assert _fork_status(sbx.sandbox_id, 0) == 400
    sbx.pause()
    assert _fork_status(sbx.sandbox_id, 100) == 409  # a valid count: the paused source is what is refused
    assert _fork_status(sbx.sandbox_id, 21) == 409
    with pytest.raises(SandboxException) as paused:
        sbx.fork(count=2)
    assert paused.value.status_code == 409
    with pytest.raises(SandboxException) as paused_one:
        Sandbox.fork(sbx.sandbox_id)
    assert paused_one.value.status_code == 409


async def test_fork_limit_and_paused_source_async(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        client = get_async_api_client(ConnectionConfig())
        res = await post_sandboxes_sandbox_id_fork.asyncio_detailed(
            box.sandbox_id, client=client, body=SandboxForkRequest(count=101)
        )
        assert res.status_code == 400
        await box.pause()
        res = await post_sandboxes_sandbox_id_fork.asyncio_detailed(
            box.sandbox_id, client=client, body=SandboxForkRequest(count=50)
        )
        assert res.status_code == 409
        with pytest.raises(SandboxException) as paused:
            await box.fork(count=3)
        assert paused.value.status_code == 409
    finally:
        await box.kill()


# ----- get_info ----------------------------------------------------------------------------------


def _template_size(node: Node, template: str) -> tuple[int, int]:
    with node.client() as c:
        body = c.get(f"/templates/{template}").json()
    return int(body["cpuCount"]), int(body["memoryMB"])


def test_info_has_what_the_create_asked_for(node: Node, template: str) -> None:
    box = Sandbox.create(
        template=template,
        timeout=120,
        allow_internet_access=False,
        network={"deny_out": ["0.0.0.0/0"], "allow_public_traffic": True},
        lifecycle={"on_timeout": "pause", "auto_resume": True},
    )
    plain = Sandbox.create(template=template, timeout=120)
    try:
        info = box.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
        assert info.allow_internet_access is False
        assert info.network == {"deny_out": ["0.0.0.0/0"], "allow_public_traffic": True}
        assert (info.cpu_count, info.memory_mb) == _template_size(node, template)
        assert info.template_id and info.name == template

        bare = plain.get_info()
        assert bare.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert bare.allow_internet_access is None  # not set at create
        assert bare.network is None
        with node.client() as c:
            detail = c.get(f"/sandboxes/{box.sandbox_id}").json()
            assert "domain" in detail and detail["allowInternetAccess"] is False
            assert detail["network"] == {"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": True}
            bad = {"templateID": template, "network": {"denyOut": ["example.com"]}}
            r = c.post("/v2/sandboxes", json=bad)
            assert r.status_code == 400 and "denyOut" in r.json()["message"]
    finally:
        box.kill()
        plain.kill()


async def test_info_has_what_the_create_asked_for_async(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(
        template=template, timeout=120, lifecycle={"on_timeout": "pause"}, network={"allow_public_traffic": True}
    )
    try:
        info = await box.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": False}
        assert info.allow_internet_access is None  # not set at create
        assert info.network == {"allow_public_traffic": True}
        assert (info.cpu_count, info.memory_mb) == _template_size(node, template)
    finally:
        await box.kill()
