"""Orphan reaping at start-up: a sandbox under this node's markers but unknown to the store is stopped and
removed with its container, netns, veth, cgroups, mount and dir; nothing else is touched: not a known
sandbox, not a runc container under another ``--root`` (even one with the orphan's id), not a netns
without our prefix, and not another node's container that shares our cgroup parent and netns prefix."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.foreign import ForeignContainer, add_netns, delete_netns, start_foreign_runc
from tests.framework.leaks import HostSnapshot, assert_no_leaks, snapshot
from tests.framework.runtime import SandboxFactory, need_root, pid_alive, poll_until
from warren.runtime.base import PauseMode, RuntimeKind, SandboxHandle
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.net.manager import NetConfig, NetworkManager
from warren.runtime.net.netns import link_exists, netns_exists
from warren.runtime.oci.layout import SandboxRecord
from warren.runtime.oci.runtime import OciRuntime
from warren.runtime.reaper import ReapReport, reap_orphans, runtime_root
from warren.runtime.rootfs import mounts_under, unmount

pytestmark = [pytest.mark.root]

# Names of these tests' own: they create foreign things under the names on purpose, and other test
# sessions on this host (using wrt-/wt/warren-test) must neither disturb their leak checks nor be touched.
REAPER_NET = NetConfig(cidr="10.79.0.0/16", netns_prefix="wrr-", veth_prefix="wr", table="warren_reaper_test")
REAPER_CGROUP_PARENT = "warren-reaper-test"

GRACE_S = 2.0


def _host_snapshot(state_dir: Path) -> HostSnapshot:
    return snapshot(state_dirs=[state_dir], cgroup_parents=[REAPER_CGROUP_PARENT],
                    netns_prefixes=[REAPER_NET.netns_prefix], link_prefixes=[REAPER_NET.veth_prefix],
                    nft_tables=[REAPER_NET.table])


@pytest.fixture
async def reaper_network() -> AsyncIterator[NetworkManager]:
    need_root()
    network = NetworkManager(REAPER_NET)
    await network.setup()
    try:
        yield network
    finally:
        await network.teardown()


async def _factory(request: pytest.FixtureRequest, kind: RuntimeKind, tmp_path: Path, agent_bundle: Path,
                   network: NetworkManager, rootfs: Path) -> AsyncIterator[SandboxFactory]:
    """A backend on our names; every sandbox stopped at the end, then nothing of ours may be left."""
    binary: Path = request.getfixturevalue("runc_binary" if kind is RuntimeKind.RUNC else "patched_runsc")
    runtime = OciRuntime(kind, binary, tmp_path / "state", agent_bundle, network, cgroup_parent=REAPER_CGROUP_PARENT)
    probe = await runtime.setup()
    assert probe["available"], probe
    before = _host_snapshot(runtime.state_dir)
    factory = SandboxFactory(runtime, [rootfs])
    try:
        yield factory
    finally:
        await factory.stop_all()
        try:
            assert_no_leaks(before)
        finally:
            CgroupHierarchies.detect().remove(REAPER_CGROUP_PARENT)


@pytest.fixture(params=[pytest.param(RuntimeKind.RUNC, marks=pytest.mark.runc, id="runc"),
                        pytest.param(RuntimeKind.GVISOR, marks=pytest.mark.runsc, id="runsc")])
async def sandboxes(request: pytest.FixtureRequest, tmp_path: Path, agent_bundle: Path,
                    reaper_network: NetworkManager, busybox_rootfs: Path) -> AsyncIterator[SandboxFactory]:
    async for factory in _factory(request, request.param, tmp_path, agent_bundle, reaper_network, busybox_rootfs):
        yield factory


@pytest.fixture
async def runc_sandboxes(request: pytest.FixtureRequest, tmp_path: Path, agent_bundle: Path,
                         reaper_network: NetworkManager, busybox_rootfs: Path) -> AsyncIterator[SandboxFactory]:
    async for factory in _factory(request, RuntimeKind.RUNC, tmp_path, agent_bundle, reaper_network,
                                  busybox_rootfs):
        yield factory


async def _healthy(handle: SandboxHandle) -> None:
    async with asyncio.timeout(30):
        await wait_for_health(handle.address, handle.agent_port)


async def _reap(runtime: OciRuntime, network: NetworkManager, known: set[str]) -> ReapReport:
    return await reap_orphans(known=known, backends=[runtime], network=network, state_dir=runtime.state_dir,
                              cgroup_parent=REAPER_CGROUP_PARENT, grace_s=GRACE_S)


def _record(runtime: OciRuntime, sandbox_id: str) -> SandboxRecord:
    return SandboxRecord.from_json(runtime.sandbox_paths(sandbox_id).record.read_text())


def _running(pid: int) -> bool:
    """Alive and not a zombie (this host's init reaps orphans lazily)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _cgroup_pids(sandbox_id: str) -> set[int]:
    pids: set[int] = set()
    for d in CgroupHierarchies.detect().existing(f"{REAPER_CGROUP_PARENT}/{sandbox_id}"):
        pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return pids


class _Orphan:
    """What an orphan sandbox holds on the host, captured while it runs."""

    def __init__(self, runtime: OciRuntime, handle: SandboxHandle) -> None:
        sid = handle.sandbox_id
        self.sandbox_id = sid
        self.record = _record(runtime, sid)
        assert self.record.network is not None
        self.netns = self.record.network.netns
        self.veth = self.record.network.host_if
        self.cgroups = CgroupHierarchies.detect().existing(f"{REAPER_CGROUP_PARENT}/{sid}")
        self.dir = runtime.sandbox_paths(sid).root
        self.mounts = mounts_under(self.dir)
        self.pids = _cgroup_pids(sid)
        assert self.cgroups and self.mounts and self.pids and netns_exists(self.netns) and link_exists(self.veth)

    def assert_gone(self) -> None:
        assert not netns_exists(self.netns)
        assert not any(d.exists() for d in self.cgroups)
        assert not self.dir.exists()
        assert not any(m in mounts_under(m.parent) for m in self.mounts)
        assert not any(_running(p) for p in self.pids)

    def assert_reported(self, report: ReapReport, kind: RuntimeKind) -> None:
        assert self.sandbox_id in report.orphans
        assert self.netns in report.netns
        assert {str(d) for d in self.cgroups} <= set(report.cgroups)
        assert str(self.dir) in report.dirs
        assert {str(m) for m in self.mounts} <= set(report.mounts)
        assert self.pids <= set(report.processes)
        assert f"{kind.value}:{self.sandbox_id}" in report.containers


async def _wait_link_gone(name: str) -> None:
    async with asyncio.timeout(5):  # the kernel destroys a veth whose peer netns is gone asynchronously
        await poll_until(lambda: not link_exists(name))


def _cmdlines(pids: set[int]) -> list[bytes]:
    return [Path(f"/proc/{p}/cmdline").read_bytes() for p in pids]


@pytest.fixture
def foreign_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "foreign"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_orphan_removed_known_and_foreign_untouched(
    sandboxes: SandboxFactory, reaper_network: NetworkManager, runc_binary: Path, busybox_rootfs: Path,
    foreign_dir: Path,
) -> None:
    runtime = sandboxes.runtime
    known = await sandboxes.start()
    orphan_handle = await sandboxes.start()
    await _healthy(known)
    await _healthy(orphan_handle)
    orphan = _Orphan(runtime, orphan_handle)
    if runtime.kind is RuntimeKind.GVISOR:
        # gVisor: the runsc sandbox and gofer are host processes in the sandbox's cgroup (plus ptrace stubs).
        cmdlines = _cmdlines(orphan.pids)
        assert any(c.startswith(b"runsc-sandbox") for c in cmdlines)
        assert any(c.startswith(b"runsc-gofer") for c in cmdlines)

    tag = f"{os.getpid()}"
    foreign_netns = f"foreign-{tag}"  # no wrt- prefix
    shared_netns = f"{reaper_network.config.netns_prefix}other-node-{tag}"  # our prefix, another node's
    outside: ForeignContainer | None = None
    sharing: ForeignContainer | None = None
    try:
        add_netns(foreign_netns)
        # Same runc binary and the orphan's very id, but another --root and a cgroup outside our parent
        # ("warren-test-foreign" only shares a string prefix with "warren-test").
        outside = start_foreign_runc(runc_binary, foreign_dir, busybox_rootfs, orphan.sandbox_id,
                                     cgroups_path=f"/{REAPER_CGROUP_PARENT}-foreign/{orphan.sandbox_id}")
        # Another node on this host with default names: our cgroup parent and netns prefix, its own root.
        sharing = start_foreign_runc(runc_binary, foreign_dir, busybox_rootfs, f"other-node-{tag}",
                                     cgroups_path=f"/{REAPER_CGROUP_PARENT}/other-node-{tag}",
                                     netns=add_netns(shared_netns))
        outside_pid, sharing_pid = outside.pid(), sharing.pid()

        report = await _reap(runtime, reaper_network, {known.sandbox_id})

        assert report.orphans == (orphan.sandbox_id,)
        assert not report.failed
        orphan.assert_reported(report, runtime.kind)
        orphan.assert_gone()
        await _wait_link_gone(orphan.veth)
        assert await runtime.state(orphan.sandbox_id) is None
        # The known sandbox runs on.
        assert await runtime.state(known.sandbox_id) == "running"
        await _healthy(known)
        assert known.init_pid is not None and pid_alive(known.init_pid)
        # Nothing foreign was touched; what shares our names is reported, not reaped.
        assert outside.state() == "running" and pid_alive(outside_pid)
        assert sharing.state() == "running" and pid_alive(sharing_pid)
        assert netns_exists(foreign_netns) and netns_exists(shared_netns)
        assert shared_netns in report.unattributed
        assert any(u.endswith(f"/{REAPER_CGROUP_PARENT}/other-node-{tag}") for u in report.unattributed)
        assert foreign_netns not in report.unattributed  # not even looked at

        # Reaping again finds nothing more.
        again = await _reap(runtime, reaper_network, {known.sandbox_id})
        assert again.orphans == () and not again.failed
    finally:
        if outside is not None:
            outside.delete(remove_cgroup_parent=True)
        if sharing is not None:
            sharing.delete()
        delete_netns(foreign_netns)
        delete_netns(shared_netns)


@pytest.mark.parametrize("lost", ["record", "dir", "dir-and-runtime-state"])
async def test_orphan_found_from_what_is_left(
    runc_sandboxes: SandboxFactory, reaper_network: NetworkManager, lost: str
) -> None:
    """A crash can leave any subset of the markers; each one alone is enough to find the orphan and
    its veth (through its netns: the record naming it may be gone)."""
    runtime = runc_sandboxes.runtime
    handle = await runc_sandboxes.start()
    await _healthy(handle)
    orphan = _Orphan(runtime, handle)
    paths = runtime.sandbox_paths(orphan.sandbox_id)
    paths.record.unlink()
    if lost.startswith("dir"):
        unmount(paths.rootfs)  # the container keeps its own copy of the mount
        unmount(paths.disk)  # the overlay keeps the disk's filesystem (and its loop device) until it ends
        shutil.rmtree(paths.root)
    if lost == "dir-and-runtime-state":
        root = runtime_root(runtime)
        assert root is not None
        shutil.rmtree(root / orphan.sandbox_id)  # now only the processes name our state dir

    report = await _reap(runtime, reaper_network, set())

    assert report.orphans == (orphan.sandbox_id,)
    assert not report.failed
    assert orphan.veth in report.veths and orphan.netns in report.netns
    assert orphan.pids <= set(report.processes)
    orphan.assert_gone()
    assert not link_exists(orphan.veth)


async def test_frozen_orphan_is_thawed_and_killed(runc_sandboxes: SandboxFactory,
                                                 reaper_network: NetworkManager) -> None:
    runtime = runc_sandboxes.runtime
    handle = await runc_sandboxes.start()
    await _healthy(handle)
    await runtime.pause(handle.sandbox_id, PauseMode.MEMORY)  # runc freezer: FROZEN
    orphan = _Orphan(runtime, handle)

    report = await _reap(runtime, reaper_network, set())

    assert report.orphans == (handle.sandbox_id,) and not report.failed
    orphan.assert_reported(report, RuntimeKind.RUNC)
    orphan.assert_gone()
