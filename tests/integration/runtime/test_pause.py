"""pause/resume: MEMORY keeps processes and memory (runc freezer, gVisor checkpoint/restore);
FILESYSTEM ends the processes and keeps the disk; a paused sandbox can be stopped cleanly."""

from __future__ import annotations

import asyncio

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.leaks import assert_no_leaks
from tests.framework.runtime import SandboxFactory, exec_in, host_snapshot
from warren.errors import InvalidStateError, NotFoundError
from warren.runtime.base import PauseMode, RuntimeKind, SandboxHandle

pytestmark = [pytest.mark.root]


async def _healthy(handle: SandboxHandle) -> None:
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)


async def _sh(sandboxes: SandboxFactory, sandbox_id: str, script: str) -> str:
    return (await exec_in(sandboxes.runtime, sandbox_id, ["/bin/sh", "-c", script])).stdout_text


async def _started_with_markers(sandboxes: SandboxFactory) -> SandboxHandle:
    handle = await sandboxes.start()
    await _healthy(handle)
    # /dev/shm is a tmpfs: its content lives in the sandbox's memory. /root and /tmp are on its disk.
    await _sh(sandboxes, handle.sandbox_id,
              "echo mem > /dev/shm/marker; echo disk > /root/marker; echo tmp > /tmp/marker")
    return handle


async def test_memory_pause_keeps_memory(sandboxes: SandboxFactory) -> None:
    runtime = sandboxes.runtime
    handle = await _started_with_markers(sandboxes)
    await runtime.pause(handle.sandbox_id, PauseMode.MEMORY)
    assert await runtime.state(handle.sandbox_id) == "paused"
    if runtime.kind is RuntimeKind.GVISOR:
        assert (runtime.sandbox_paths(handle.sandbox_id).checkpoint / "checkpoint.img").is_file()
    resumed = await runtime.resume(sandboxes.specs[handle.sandbox_id], PauseMode.MEMORY)
    await _healthy(resumed)
    if runtime.kind is RuntimeKind.RUNC:
        assert resumed.address == handle.address
    assert await runtime.state(handle.sandbox_id) == "running"
    assert await _sh(sandboxes, handle.sandbox_id, "cat /dev/shm/marker /root/marker /tmp/marker") == "mem\ndisk\ntmp\n"
    assert not runtime.sandbox_paths(handle.sandbox_id).checkpoint.exists()


async def test_filesystem_pause_keeps_only_the_disk(sandboxes: SandboxFactory) -> None:
    runtime = sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    handle = await _started_with_markers(sandboxes)
    await runtime.pause(handle.sandbox_id, PauseMode.FILESYSTEM)
    assert await runtime.state(handle.sandbox_id) == "paused"
    # No process, netns, veth, overlay or cgroup is left while paused; only the sandbox dir and its disk.
    left = before.diff(host_snapshot(runtime.state_dir))
    assert set(left) <= {"sandbox_dirs", "mounts", "loop_devices"}
    disk = runtime.sandbox_paths(handle.sandbox_id).disk
    assert left.get("mounts", []) == ([str(disk)] if runtime.disks.enforced else [])
    assert len(left.get("loop_devices", [])) == (1 if runtime.disks.enforced else 0)
    resumed = await runtime.resume(sandboxes.specs[handle.sandbox_id], PauseMode.FILESYSTEM)
    await _healthy(resumed)
    out = await _sh(sandboxes, handle.sandbox_id,
                    "cat /root/marker /tmp/marker; cat /dev/shm/marker 2>/dev/null || echo gone")
    assert out == "disk\ntmp\ngone\n"


@pytest.mark.parametrize("mode", list(PauseMode))
async def test_stop_while_paused_removes_everything(sandboxes: SandboxFactory, mode: PauseMode) -> None:
    runtime = sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    handle = await _started_with_markers(sandboxes)
    await runtime.pause(handle.sandbox_id, mode)
    await runtime.stop(handle.sandbox_id)
    assert await runtime.state(handle.sandbox_id) is None
    assert_no_leaks(before)


async def test_pause_and_resume_refuse_wrong_states(runc_sandboxes: SandboxFactory) -> None:
    runtime = runc_sandboxes.runtime
    handle = await runc_sandboxes.start()
    spec = runc_sandboxes.specs[handle.sandbox_id]
    with pytest.raises(NotFoundError):
        await runtime.pause("nope", PauseMode.MEMORY)
    with pytest.raises(InvalidStateError):
        await runtime.resume(spec, PauseMode.MEMORY)
    await runtime.pause(handle.sandbox_id, PauseMode.MEMORY)
    with pytest.raises(InvalidStateError):
        await runtime.pause(handle.sandbox_id, PauseMode.FILESYSTEM)
    await runtime.resume(spec, PauseMode.MEMORY)
    await _healthy(handle)
