"""Per-sandbox disk size (issue 9, build item 7): a size-capped ext4 image per sandbox, loop-mounted.

Real runc/runsc sandboxes on busybox; the factory's leak check (mounts, loop devices, dirs, ...) runs
after every test. Writes past the size fail with ENOSPC inside the sandbox; neighbours keep writing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.leaks import assert_no_leaks
from tests.framework.runtime import SandboxFactory, exec_in, host_snapshot
from warren.runtime.base import PauseMode, Resources, RuntimeKind
from warren.runtime.disk import DISK_IMAGE, SandboxDisks, loop_devices_backed_by
from warren.runtime.net.manager import NetworkManager
from warren.runtime.oci.runtime import OciRuntime
from warren.runtime.rootfs import is_mountpoint

pytestmark = [pytest.mark.root]

DD_200M = ["/bin/sh", "-c", "dd if=/dev/zero of=/big bs=1M count=200 2>&1; echo rc=$?"]


def _need_disks(runtime: OciRuntime) -> None:
    if not Path("/dev/loop-control").exists():
        pytest.skip("no loop devices on this host")
    status = runtime.disks.status()
    assert status["enforced"], f"sandbox disks should work on this host: {status}"


async def _healthy(factory: SandboxFactory, sandbox_id: str) -> None:
    handle = await factory.runtime.locate(sandbox_id)
    assert handle is not None
    async with asyncio.timeout(30):
        await wait_for_health(handle.address, handle.agent_port)


async def test_writes_past_the_disk_size_get_enospc_and_neighbours_still_write(sandboxes: SandboxFactory) -> None:
    rt = sandboxes.runtime
    _need_disks(rt)
    small = await sandboxes.start(resources=Resources(disk_mb=64))
    other = await sandboxes.start(resources=Resources(disk_mb=256))
    await _healthy(sandboxes, small.sandbox_id)

    full = await exec_in(rt, small.sandbox_id, DD_200M, check=False)
    assert "No space left on device" in full.stdout_text, full.stdout_text
    assert "rc=0" not in full.stdout_text
    paths = rt.sandbox_paths(small.sandbox_id)
    assert is_mountpoint(paths.root / "disk")
    assert paths.upper.is_relative_to(paths.root / "disk")
    image = os.stat(paths.root / DISK_IMAGE)
    assert image.st_size == 64 * 2**20
    assert image.st_blocks * 512 <= 64 * 2**20  # the host gave it no more than its size

    # The full sandbox still works; its neighbour writes what the small one could not.
    again = await exec_in(rt, small.sandbox_id, ["/bin/sh", "-c", "rm /big && echo ok > /f && cat /f"])
    assert again.stdout_text == "ok\n"
    wrote = await exec_in(rt, other.sandbox_id, DD_200M)
    assert "rc=0" in wrote.stdout_text, wrote.stdout_text
    stats = await rt.stats(other.sandbox_id)
    assert stats.disk_used >= 200 * 2**20
    assert 200 * 2**20 < stats.disk_total <= 256 * 2**20
    await _healthy(sandboxes, small.sandbox_id)

    await sandboxes.stop_all()
    assert loop_devices_backed_by(rt.state_dir) == []
    assert not paths.root.exists()


async def test_pause_keeps_the_disk_and_a_restart_after_reboot_mounts_it_again(
    runc_sandboxes: SandboxFactory, test_network: NetworkManager
) -> None:
    rt = runc_sandboxes.runtime
    _need_disks(rt)
    handle = await runc_sandboxes.start(resources=Resources(disk_mb=32))
    await exec_in(rt, handle.sandbox_id, ["/bin/sh", "-c", "echo kept > /kept"])
    await rt.pause(handle.sandbox_id, PauseMode.FILESYSTEM)
    paths = rt.sandbox_paths(handle.sandbox_id)
    assert rt.disks.is_attached(paths.root)

    # A host reboot: every mount and loop device is gone, the image stays. A new process recovers.
    await asyncio.to_thread(rt.disks.release, paths.root)
    assert loop_devices_backed_by(rt.state_dir) == []
    fresh = OciRuntime(rt.kind, rt.binary, rt.state_dir, rt.agent_bundle, test_network,
                       cgroup_parent=rt.cgroup_parent)  # fmt: skip
    await fresh.setup()
    assert handle.sandbox_id in await fresh.recover()
    assert fresh.disks.is_attached(paths.root)
    runc_sandboxes.runtime = fresh  # the factory stops it through the new instance
    await fresh.resume(runc_sandboxes.specs[handle.sandbox_id], PauseMode.FILESYSTEM)
    assert (await exec_in(fresh, handle.sandbox_id, ["cat", "/kept"])).stdout_text == "kept\n"
    full = await exec_in(fresh, handle.sandbox_id, DD_200M, check=False)
    assert "No space left on device" in full.stdout_text


async def test_snapshot_restore_lands_on_a_capped_disk(runc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    rt = runc_sandboxes.runtime
    _need_disks(rt)
    source = await runc_sandboxes.start(resources=Resources(disk_mb=64))
    await exec_in(rt, source.sandbox_id, ["/bin/sh", "-c", "dd if=/dev/zero of=/ten bs=1M count=10 2>/dev/null"])
    snap = tmp_path / "snap"
    snap.mkdir()
    await rt.snapshot(source.sandbox_id, snap)
    spec = runc_sandboxes.spec(resources=Resources(disk_mb=32))
    runc_sandboxes.started.append(spec.sandbox_id)
    await rt.restore(spec, snap)
    size = await exec_in(rt, spec.sandbox_id, ["/bin/sh", "-c", "wc -c < /ten"])
    assert size.stdout_text.strip() == str(10 * 2**20)
    full = await exec_in(rt, spec.sandbox_id, DD_200M, check=False)
    assert "No space left on device" in full.stdout_text


async def test_concurrent_starts_get_their_own_loop_devices(runc_sandboxes: SandboxFactory) -> None:
    rt = runc_sandboxes.runtime
    _need_disks(rt)
    handles = await asyncio.gather(*(runc_sandboxes.start(resources=Resources(disk_mb=32)) for _ in range(4)))
    bound = loop_devices_backed_by(rt.state_dir)
    assert len(bound) == 4
    assert len({line.split(":")[0] for line in bound}) == 4
    for h in handles:
        assert rt.disks.is_attached(rt.sandbox_paths(h.sandbox_id).root)


async def test_quotas_off_keep_the_upper_on_the_host_filesystem(
    runc_binary: Path, tmp_path: Path, agent_bundle: Path, test_network: NetworkManager, test_cgroup_parent: str,
    busybox_rootfs: Path,
) -> None:
    """``WARREN_DISK_QUOTA=0`` (or a host without loop devices): the node works as before, unenforced."""
    disks = SandboxDisks(tmp_path / "state", enabled=False)
    rt = OciRuntime(RuntimeKind.RUNC, runc_binary, tmp_path / "state", agent_bundle, test_network,
                    cgroup_parent=test_cgroup_parent, disks=disks)
    await rt.setup()
    status = rt.disks.status()
    assert status["enforced"] is False and "WARREN_DISK_QUOTA" in status["reason"]
    before = host_snapshot(rt.state_dir)
    factory = SandboxFactory(rt, [busybox_rootfs])
    try:
        handle = await factory.start(resources=Resources(disk_mb=16))
        paths = rt.sandbox_paths(handle.sandbox_id)
        assert paths.upper.is_dir() and not is_mountpoint(paths.root / "disk")
        dd = ["/bin/sh", "-c", "dd if=/dev/zero of=/big bs=1M count=40 2>&1; echo rc=$?"]
        assert "rc=0" in (await exec_in(rt, handle.sandbox_id, dd)).stdout_text
        assert not (paths.root / DISK_IMAGE).exists()
    finally:
        await factory.stop_all()
    assert_no_leaks(before)


def test_probe_without_mkfs_reports_not_enforced_and_falls_back(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without e2fsprogs: the probe says why, and a disk is a plain directory."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    disks = SandboxDisks(tmp_path / "state")
    status = disks.probe()
    assert status["enforced"] is False and "mkfs.ext4" in status["reason"]
    root = tmp_path / "state" / "sandboxes" / "x"
    root.mkdir(parents=True)
    disks.create(root, 64)
    assert (root / "disk").is_dir() and not is_mountpoint(root / "disk")
    assert not (root / DISK_IMAGE).exists()


def test_node_override_and_minimum_size(tmp_path: Path) -> None:
    """``WARREN_SANDBOX_DISK_MB`` sizes every disk; tiny sizes are rounded up to what ext4 needs."""
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.skip("needs root and loop devices")
    disks = SandboxDisks(tmp_path / "state", size_mb=40)
    assert disks.probe()["enforced"]
    roots = [tmp_path / "state" / "sandboxes" / n for n in ("a", "b")]
    try:
        for root in roots:
            root.mkdir(parents=True)
        disks.create(roots[0], 2048)
        assert os.stat(roots[0] / DISK_IMAGE).st_size == 40 * 2**20
        tiny = SandboxDisks(tmp_path / "state")
        tiny.probe()
        tiny.create(roots[1], 1)
        assert os.stat(roots[1] / DISK_IMAGE).st_size == 16 * 2**20
        assert disks.usage(roots[1]) is not None
    finally:
        for root in roots:
            disks.release(root)
    assert loop_devices_backed_by(tmp_path / "state") == []


async def test_a_stopped_sandbox_frees_its_loop_device_while_others_run(sandboxes: SandboxFactory) -> None:
    """Other sandboxes' mount namespaces (runc's init, runsc's gofer) must not pin a neighbour's disk."""
    rt = sandboxes.runtime
    _need_disks(rt)
    first = await sandboxes.start(resources=Resources(disk_mb=32))
    second = await sandboxes.start(resources=Resources(disk_mb=32))
    third = await sandboxes.start(resources=Resources(disk_mb=32))
    await _healthy(sandboxes, third.sandbox_id)
    for gone in (second, first):
        image = rt.sandbox_paths(gone.sandbox_id).root / DISK_IMAGE
        await rt.stop(gone.sandbox_id)
        sandboxes.started.remove(gone.sandbox_id)
        assert loop_devices_backed_by(image, exact=True) == []
    assert len(loop_devices_backed_by(rt.state_dir)) == 1
    await _healthy(sandboxes, third.sandbox_id)


NO_LOOP_NODES = """
import os, subprocess, sys
from pathlib import Path
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/dev"], check=True)  # a container's /dev: no loopN nodes
os.mknod("/dev/loop-control", 0o600 | 0o020000, os.makedev(10, 237))
from warren.runtime.disk import SandboxDisks
status = SandboxDisks(Path(sys.argv[1])).probe()
print(status["enforced"], status["reason"], sorted(n for n in os.listdir("/dev") if n != "loop-control"))
"""


def test_a_dev_without_loop_nodes_gets_them_made(tmp_path: Path) -> None:
    """In a container whose /dev is a tmpfs, the loop device node the kernel hands out is made with
    mknod (in a private mount namespace here: the host's /dev is not touched)."""
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        pytest.skip("needs root and loop devices")
    import subprocess
    import sys

    out = subprocess.run(["unshare", "-m", sys.executable, "-c", NO_LOOP_NODES, str(tmp_path / "state")],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    enforced, reason, nodes = out.stdout.split(" ", 2)
    assert (enforced, reason) == ("True", "None"), out.stdout + out.stderr
    assert nodes.strip().startswith("['loop")
    assert loop_devices_backed_by(tmp_path / "state") == []
