"""A gVisor memory pause answers once the checkpoint is written; the release of the container, cgroups,
mount and network runs after it in a task the backend owns, and resume, snapshot and stop wait for it.

Real runsc, netns and cgroups. The one fake is at the network seam: :class:`GatedNetwork` is the real
``NetworkManager`` whose ``destroy`` (the release's last step) first waits for a gate and can fail
once, so a test can hold a release open or make it fail. Order is proven with the backend's
``release_statistics()`` (who is waiting) and the network's call log, never with timings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.leaks import assert_no_leaks
from tests.framework.runtime import (
    TEST_CGROUP_PARENT,
    TEST_NET_CONFIG,
    SandboxFactory,
    exec_in,
    host_snapshot,
    poll_until,
)
from warren.errors import RuntimeFailure
from warren.runtime.base import PauseMode, RuntimeKind, SandboxHandle
from warren.runtime.net.manager import NetworkManager, SandboxNetwork
from warren.runtime.net.netns import netns_exists
from warren.runtime.oci.runtime import OciRuntime
from warren.store import EgressPolicy

pytestmark = [pytest.mark.root, pytest.mark.runsc]


class GatedNetwork(NetworkManager):
    """The real network manager; ``destroy`` waits for ``gate`` first and fails once if ``fail_next``."""

    def __init__(self) -> None:
        super().__init__(TEST_NET_CONFIG)
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False
        self.log: list[str] = []

    async def create(self, sandbox_id: str, *, allow_internet: bool = True,
                     egress: EgressPolicy | None = None) -> SandboxNetwork:
        self.log.append("create")
        return await super().create(sandbox_id, allow_internet=allow_internet, egress=egress)

    async def destroy(self, net: SandboxNetwork) -> None:
        self.log.append("destroy")
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            self.log.append("destroy failed")
            raise RuntimeFailure("injected: could not delete the veth")
        await super().destroy(net)
        self.log.append("destroyed")


@pytest.fixture
async def gated(patched_runsc: Path, tmp_path: Path, agent_bundle: Path, busybox_rootfs: Path,
                test_network: NetworkManager, test_cgroup_parent: str) -> AsyncIterator[SandboxFactory]:
    """gVisor sandboxes on a :class:`GatedNetwork` (``test_network`` owns the nft table); leak-checked."""
    network = GatedNetwork()
    runtime = OciRuntime(RuntimeKind.GVISOR, patched_runsc, tmp_path / "state", agent_bundle, network,
                         cgroup_parent=TEST_CGROUP_PARENT)
    probe = await runtime.setup()
    if not probe["available"]:
        pytest.fail(f"the patched runsc should be usable: {probe['reason']}")
    before = host_snapshot(runtime.state_dir)
    factory = SandboxFactory(runtime, [busybox_rootfs])
    try:
        yield factory
    finally:
        network.gate.set()
        await factory.stop_all()
        await runtime.aclose()
    assert_no_leaks(before)


def _network(factory: SandboxFactory) -> GatedNetwork:
    network = factory.runtime._network
    assert isinstance(network, GatedNetwork)
    return network


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        await poll_until(predicate)


async def _paused_with_release_held(factory: SandboxFactory) -> SandboxHandle:
    """A sandbox with a marker in memory, paused while its release waits at the network gate."""
    handle = await factory.start()
    async with asyncio.timeout(30):
        await wait_for_health(handle.address, handle.agent_port)
    await exec_in(factory.runtime, handle.sandbox_id, ["/bin/sh", "-c", "echo mem > /tmp/marker"])
    network = _network(factory)
    network.gate.clear()
    network.log.clear()
    async with asyncio.timeout(60):  # a deadline, not a measurement: a pause that waits for the gate hangs
        await factory.runtime.pause(handle.sandbox_id, PauseMode.MEMORY)
    return handle


async def test_pause_answers_before_the_release_ends(gated: SandboxFactory) -> None:
    runtime, network = gated.runtime, _network(gated)
    handle = await _paused_with_release_held(gated)
    # pause returned while the release is still held at its last step: the netns is still there
    assert runtime.release_statistics().running == 1
    await _until(lambda: network.log == ["destroy"])
    assert netns_exists(TEST_NET_CONFIG.netns_prefix + handle.sandbox_id)
    assert await runtime.state(handle.sandbox_id) == "paused"
    assert (runtime.sandbox_paths(handle.sandbox_id).checkpoint / "checkpoint.img").is_file()
    network.gate.set()
    await _until(lambda: runtime.release_statistics().running == 0)
    assert not netns_exists(TEST_NET_CONFIG.netns_prefix + handle.sandbox_id)


async def test_resume_waits_for_the_release(gated: SandboxFactory) -> None:
    runtime, network = gated.runtime, _network(gated)
    handle = await _paused_with_release_held(gated)
    resuming = asyncio.create_task(runtime.resume(gated.specs[handle.sandbox_id], PauseMode.MEMORY))
    await _until(lambda: runtime.release_statistics().waiting == 1)
    assert "create" not in network.log  # the resume has not made its new network yet
    network.gate.set()
    resumed = await resuming
    assert network.log == ["destroy", "destroyed", "create"]
    async with asyncio.timeout(30):
        await wait_for_health(resumed.address, resumed.agent_port)
    out = await exec_in(runtime, handle.sandbox_id, ["cat", "/tmp/marker"])
    assert out.stdout_text == "mem\n"


async def test_stop_waits_for_the_release_and_leaves_nothing(gated: SandboxFactory) -> None:
    runtime, network = gated.runtime, _network(gated)
    before = host_snapshot(runtime.state_dir)
    handle = await _paused_with_release_held(gated)
    stopping = asyncio.create_task(runtime.stop(handle.sandbox_id))
    await _until(lambda: runtime.release_statistics().waiting == 1)
    network.gate.set()
    await stopping
    assert network.log == ["destroy", "destroyed"]  # stop found the network released
    assert await runtime.state(handle.sandbox_id) is None
    assert_no_leaks(before)


async def test_snapshot_waits_for_the_release(gated: SandboxFactory, tmp_path: Path) -> None:
    runtime, network = gated.runtime, _network(gated)
    handle = await _paused_with_release_held(gated)
    dest = tmp_path / "snap"
    dest.mkdir()
    snapshotting = asyncio.create_task(runtime.snapshot(handle.sandbox_id, dest))
    await _until(lambda: runtime.release_statistics().waiting == 1)
    assert not any(dest.iterdir())
    network.gate.set()
    contents = await snapshotting
    assert contents.memory and contents.source is None
    assert network.log == ["destroy", "destroyed"]
    assert (dest / "checkpoint" / "checkpoint.img").is_file()


@pytest.mark.parametrize("then", ["resume", "stop"])
async def test_a_failed_release_is_reported_and_finished_by_the_next_operation(
    gated: SandboxFactory, then: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, network = gated.runtime, _network(gated)
    before = host_snapshot(runtime.state_dir)
    handle = await gated.start()
    async with asyncio.timeout(30):
        await wait_for_health(handle.address, handle.agent_port)
    network.fail_next = True
    with caplog.at_level(logging.ERROR, logger="warren.runtime.oci.releases"):
        await runtime.pause(handle.sandbox_id, PauseMode.MEMORY)
        await _until(lambda: runtime.release_statistics().running == 0)
    assert [r.levelno for r in caplog.records if handle.sandbox_id in r.getMessage()] == [logging.ERROR]
    assert network.log[-1] == "destroy failed"
    assert netns_exists(TEST_NET_CONFIG.netns_prefix + handle.sandbox_id)  # the record still names it
    assert await runtime.state(handle.sandbox_id) == "paused"
    if then == "resume":
        resumed = await runtime.resume(gated.specs[handle.sandbox_id], PauseMode.MEMORY)
        async with asyncio.timeout(30):
            await wait_for_health(resumed.address, resumed.agent_port)
        assert await runtime.state(handle.sandbox_id) == "running"
    else:
        await runtime.stop(handle.sandbox_id)
        assert await runtime.state(handle.sandbox_id) is None
        assert_no_leaks(before)


async def test_aclose_waits_for_the_release(gated: SandboxFactory) -> None:
    runtime, network = gated.runtime, _network(gated)
    handle = await _paused_with_release_held(gated)
    closing = asyncio.create_task(runtime.aclose())
    await _until(lambda: network.log == ["destroy"])
    assert not closing.done()
    network.gate.set()
    await closing
    assert runtime.release_statistics().running == 0
    assert not netns_exists(TEST_NET_CONFIG.netns_prefix + handle.sandbox_id)
