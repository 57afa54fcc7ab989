"""start/stop/state/stats/recover, and that a start failing half-way leaves nothing behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.leaks import assert_no_leaks
from tests.framework.runtime import TEST_CGROUP_PARENT, SandboxFactory, host_snapshot, pid_alive, poll_until, read_pid
from warren.errors import ConflictError, InvalidRequestError, NotFoundError, RuntimeFailure
from warren.runtime.base import RuntimeKind, SandboxSpec
from warren.runtime.net.manager import NetworkManager
from warren.runtime.oci.runtime import OciRuntime

pytestmark = [pytest.mark.root]


async def test_stop_removes_everything_and_is_idempotent(sandboxes: SandboxFactory) -> None:
    runtime = sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    handle = await sandboxes.start()
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)
    during = host_snapshot(runtime.state_dir)
    leaked_while_running = before.diff(during)
    assert {"processes", "netns", "links", "cgroups", "mounts", "sandbox_dirs"} <= set(leaked_while_running)

    await runtime.stop(handle.sandbox_id)
    assert_no_leaks(before)
    assert await runtime.state(handle.sandbox_id) is None
    with pytest.raises(NotFoundError):
        await runtime.stats(handle.sandbox_id)
    await runtime.stop(handle.sandbox_id)  # again: a no-op
    await runtime.stop("never-existed")
    await runtime.stop("../../etc")  # not a valid id: cannot exist, nothing to do


async def test_bad_layer_fails_half_way_and_leaves_nothing(sandboxes: SandboxFactory, tmp_path: Path) -> None:
    before = host_snapshot(sandboxes.runtime.state_dir)
    with pytest.raises(RuntimeFailure, match="overlay"):
        await sandboxes.runtime.start(sandboxes.spec(layers=(tmp_path / "no-such-layer",)))
    assert_no_leaks(before)


async def test_missing_binary_fails_half_way_and_leaves_nothing(
    sandboxes: SandboxFactory, tmp_path: Path, test_network: NetworkManager
) -> None:
    good = sandboxes.runtime
    broken = OciRuntime(good.kind, tmp_path / "no-such-runtime", good.state_dir, good.agent_bundle, test_network,
                        cgroup_parent=TEST_CGROUP_PARENT)  # never set up: the probe would refuse it first
    before = host_snapshot(good.state_dir)
    with pytest.raises(RuntimeFailure, match="cannot execute"):
        await broken.start(sandboxes.spec(runtime=broken.kind))
    assert_no_leaks(before)


async def test_failing_runtime_reports_its_stderr_and_leaves_nothing(
    runc_sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    runtime = runc_sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    # A rootfs without the mount point /proc as a file: runc fails inside its init, after making cgroups.
    layer = tmp_path / "bad-rootfs"
    layer.mkdir()
    (layer / "proc").write_text("not a directory")
    with pytest.raises(RuntimeFailure) as err:
        await runtime.start(runc_sandboxes.spec(layers=(layer,)))
    assert "proc" in str(err.value)
    assert_no_leaks(before)


async def test_cancelled_start_is_undone(runc_sandboxes: SandboxFactory, tmp_path: Path,
                                         test_network: NetworkManager) -> None:
    """Cancelling start() while the runtime CLI runs kills the CLI (SIGTERM) and undoes everything."""
    marker = tmp_path / "cli-pid"
    fake = tmp_path / "slow-runc"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *' run '*) echo $$ > {marker}; exec sleep 60;; esac\nexit 0\n")
    fake.chmod(0o755)
    good = runc_sandboxes.runtime
    slow = OciRuntime(RuntimeKind.RUNC, fake, good.state_dir, good.agent_bundle, test_network,
                      cgroup_parent=TEST_CGROUP_PARENT)
    before = host_snapshot(good.state_dir)
    task = asyncio.create_task(slow.start(runc_sandboxes.spec()))
    async with asyncio.timeout(10):
        await poll_until(lambda: read_pid(marker) is not None)
    cli_pid = read_pid(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cli_pid is not None and not pid_alive(cli_pid)  # terminated and reaped
    assert_no_leaks(before)


async def test_duplicate_id_conflicts_and_keeps_the_first(runc_sandboxes: SandboxFactory) -> None:
    handle = await runc_sandboxes.start()
    spec = runc_sandboxes.spec(sandbox_id=handle.sandbox_id)
    with pytest.raises(ConflictError):
        await runc_sandboxes.runtime.start(spec)
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)


async def test_invalid_requests(runc_sandboxes: SandboxFactory) -> None:
    runtime = runc_sandboxes.runtime
    with pytest.raises(InvalidRequestError):
        await runtime.start(runc_sandboxes.spec(sandbox_id="bad/id"))
    with pytest.raises(InvalidRequestError):
        await runtime.start(runc_sandboxes.spec(runtime=RuntimeKind.GVISOR))
    assert await runtime.state("unknown-id") is None


async def test_no_layers_and_no_internet_still_start(runc_sandboxes: SandboxFactory) -> None:
    """An empty rootfs works (the agent brings its own libc); allow_internet=False keeps the agent reachable."""
    handle = await runc_sandboxes.start(layers=(), allow_internet=False)
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)


async def test_recover_after_restart(runc_sandboxes: SandboxFactory, test_network: NetworkManager) -> None:
    handle = await runc_sandboxes.start()
    old = runc_sandboxes.runtime
    # A new process would build a new NetworkManager; reuse the test one so the pool sees the slot.
    fresh = OciRuntime(old.kind, old.binary, old.state_dir, old.agent_bundle, test_network,
                       cgroup_parent=TEST_CGROUP_PARENT)
    assert await fresh.recover() == [handle.sandbox_id]
    assert await fresh.state(handle.sandbox_id) == "running"
    stats = await fresh.stats(handle.sandbox_id)
    assert stats.memory_used > 0
    await fresh.stop(handle.sandbox_id)
    assert await old.state(handle.sandbox_id) is None


async def test_gvisor_start_refused_when_probe_failed(
    system_runsc: Path, tmp_path: Path, agent_bundle: Path, test_network: NetworkManager
) -> None:
    runtime = OciRuntime(RuntimeKind.GVISOR, system_runsc, tmp_path / "state", agent_bundle, test_network,
                         cgroup_parent=TEST_CGROUP_PARENT)
    probe = await runtime.setup()
    if probe["available"]:
        pytest.skip("this host's runsc can run networked sandboxes (no B1)")
    before = host_snapshot(runtime.state_dir)
    spec = SandboxSpec("refused", RuntimeKind.GVISOR, layers=())
    with pytest.raises(Exception) as err:
        await runtime.start(spec)
    assert type(err.value).__name__ == "UnavailableError"
    assert "gvisor#10704" in str(err.value)
    assert_no_leaks(before)


async def test_concurrent_starts_get_distinct_addresses(runc_sandboxes: SandboxFactory) -> None:
    handles = await asyncio.gather(*(runc_sandboxes.start() for _ in range(4)))
    assert len({h.address for h in handles}) == 4
    async with asyncio.timeout(30):
        await asyncio.gather(*(wait_for_health(h.address, h.agent_port) for h in handles))
    await asyncio.gather(*(runc_sandboxes.runtime.stop(h.sandbox_id) for h in handles))


@pytest.mark.runsc
async def test_backends_sharing_a_state_dir_leave_each_other_alone(
    runc_runtime: OciRuntime, runsc_sandboxes: SandboxFactory
) -> None:
    assert runc_runtime.state_dir == runsc_sandboxes.runtime.state_dir
    handle = await runsc_sandboxes.start()
    await runc_runtime.stop(handle.sandbox_id)
    assert await runc_runtime.state(handle.sandbox_id) is None
    with pytest.raises(NotFoundError):
        await runc_runtime.stats(handle.sandbox_id)
    assert await runc_runtime.recover() == []
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)
