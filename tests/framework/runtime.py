"""Fixtures that run real sandboxes: a test network, runc/runsc backends, and helpers.

Tests use their own names so they never collide with a warren node on the same host: netns ``wrt-*``,
veths ``wt*``, pool 10.78.0.0/16, nft table ``warren_test``, cgroup parent ``warren-test``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest

from warren.runtime.base import RuntimeKind, SandboxHandle, SandboxSpec
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.net.manager import NetConfig, NetworkManager
from warren.runtime.oci.command import CommandResult, run_command
from warren.runtime.oci.runtime import OciRuntime

from .leaks import HostSnapshot, assert_no_leaks, snapshot

__all__ = [
    "TEST_CGROUP_PARENT",
    "TEST_NET_CONFIG",
    "SandboxFactory",
    "exec_in",
    "host_snapshot",
    "need_root",
    "pid_alive",
    "poll_until",
    "read_pid",
    "runc_binary",
    "runc_runtime",
    "runc_sandboxes",
    "runsc_runtime",
    "runsc_sandboxes",
    "test_cgroup_parent",
    "test_network",
]

TEST_NET_CONFIG = NetConfig(cidr="10.78.0.0/16", netns_prefix="wrt-", veth_prefix="wt", table="warren_test")
TEST_CGROUP_PARENT = "warren-test"


def host_snapshot(*state_dirs: Path) -> HostSnapshot:
    """A leak snapshot limited to the names tests use, so a warren node on the same host cannot
    make a test fail (or hide a leak behind its own resources)."""
    return snapshot(
        state_dirs=state_dirs, cgroup_parents=[TEST_CGROUP_PARENT], netns_prefixes=[TEST_NET_CONFIG.netns_prefix],
        link_prefixes=[TEST_NET_CONFIG.veth_prefix], nft_tables=[TEST_NET_CONFIG.table],
    )


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces, cgroups, mounts, nftables)")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} on PATH")


@pytest.fixture
def runc_binary() -> Path:
    found = shutil.which("runc")
    if found is None:
        pytest.skip("needs runc on PATH")
    return Path(found)


@pytest.fixture
async def test_network() -> AsyncIterator[NetworkManager]:
    """A NetworkManager with the test names; its nft table is removed afterwards."""
    need_root()
    network = NetworkManager(TEST_NET_CONFIG)
    await network.setup()
    try:
        yield network
    finally:
        await network.teardown()


EXEC_SECONDS = 60.0


async def poll_until(predicate: Callable[[], bool], interval: float = 0.01) -> None:
    """Re-check ``predicate`` every ``interval`` s; the caller bounds it with ``asyncio.timeout``."""
    while True:
        if predicate():
            return
        await asyncio.sleep(interval)


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


async def exec_in(runtime: OciRuntime, sandbox_id: str, argv: Sequence[str], *, check: bool = True) -> CommandResult:
    """``runc exec`` / ``runsc exec`` a command in a running sandbox (until the agent can do it)."""
    return await run_command(runtime.cli_argv("exec", sandbox_id, *argv), timeout=EXEC_SECONDS, check=check)


class SandboxFactory:
    """Starts sandboxes on one backend, stops every one at teardown, then asserts nothing leaked."""

    def __init__(self, runtime: OciRuntime, layers: Sequence[Path]) -> None:
        self.runtime = runtime
        self.layers = tuple(layers)
        self.started: list[str] = []
        self.specs: dict[str, SandboxSpec] = {}
        self._counter = 0

    def spec(self, **overrides: object) -> SandboxSpec:
        self._counter += 1
        base: dict[str, object] = {
            "sandbox_id": f"t{os.getpid()}-{self._counter}",
            "runtime": self.runtime.kind,
            "layers": self.layers,
        }
        base.update(overrides)
        return SandboxSpec(**base)  # type: ignore[arg-type]

    async def start(self, **overrides: object) -> SandboxHandle:
        spec = self.spec(**overrides)
        self.started.append(spec.sandbox_id)
        self.specs[spec.sandbox_id] = spec
        return await self.runtime.start(spec)

    async def stop_all(self) -> None:
        for sid in reversed(self.started):
            await self.runtime.stop(sid)
        self.started.clear()


async def _factory(runtime: OciRuntime, layers: Sequence[Path], state_dir: Path) -> AsyncIterator[SandboxFactory]:
    """Leak-checked around the whole test: every sandbox stopped, then nothing of ours left."""
    before = host_snapshot(state_dir)
    factory = SandboxFactory(runtime, layers)
    try:
        yield factory
    finally:
        await factory.stop_all()
    assert_no_leaks(before)


def _runtime(kind: RuntimeKind, binary: Path, tmp_path: Path, agent_bundle: Path,
             network: NetworkManager) -> OciRuntime:
    return OciRuntime(kind, binary, tmp_path / "state", agent_bundle, network, cgroup_parent=TEST_CGROUP_PARENT)


@pytest.fixture(scope="session")
def test_cgroup_parent() -> Iterator[str]:
    """The cgroup parent of test sandboxes; its (then empty) directories are removed after the session."""
    yield TEST_CGROUP_PARENT
    CgroupHierarchies.detect().remove(TEST_CGROUP_PARENT)


@pytest.fixture
async def runc_runtime(runc_binary: Path, tmp_path: Path, agent_bundle: Path,
                       test_network: NetworkManager, test_cgroup_parent: str) -> OciRuntime:
    runtime = _runtime(RuntimeKind.RUNC, runc_binary, tmp_path, agent_bundle, test_network)
    await runtime.setup()
    return runtime


@pytest.fixture
async def runsc_runtime(patched_runsc: Path, tmp_path: Path, agent_bundle: Path,
                        test_network: NetworkManager, test_cgroup_parent: str) -> OciRuntime:
    runtime = _runtime(RuntimeKind.GVISOR, patched_runsc, tmp_path, agent_bundle, test_network)
    probe = await runtime.setup()
    if not probe["available"]:
        pytest.fail(f"the patched runsc should be usable: {probe['reason']}")
    return runtime


@pytest.fixture
async def runc_sandboxes(runc_runtime: OciRuntime, busybox_rootfs: Path) -> AsyncIterator[SandboxFactory]:
    async for factory in _factory(runc_runtime, [busybox_rootfs], runc_runtime.state_dir):
        yield factory


@pytest.fixture
async def runsc_sandboxes(runsc_runtime: OciRuntime, busybox_rootfs: Path) -> AsyncIterator[SandboxFactory]:
    async for factory in _factory(runsc_runtime, [busybox_rootfs], runsc_runtime.state_dir):
        yield factory
