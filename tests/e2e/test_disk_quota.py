"""Per-sandbox disk size through the E2B SDK (issue 9, build item 7): writes past it fail with ENOSPC
inside the sandbox; the node and other sandboxes are unaffected; a kill leaves no loop device, mount or
image behind. The node runs with ``WARREN_SANDBOX_DISK_MB=64`` so that the test fills a disk quickly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox

from tests.framework import leaks
from tests.framework.node import DEFAULT_CACHE, Node, running_node
from warren.runtime.disk import loop_devices_backed_by

DISK_MB = 64
FILL = "dd if=/dev/zero of=/home/user/big bs=1M count=200"


@pytest.fixture(scope="module")
def disk_node(tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("end-to-end tests start real sandboxes and need root")
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip(f"no built-in templates in {DEFAULT_CACHE}: run `warren setup` first")
    state = tmp_path_factory.mktemp("disk-node") / "state"
    with running_node(state, runsc=patched_runsc, extra_env={"WARREN_SANDBOX_DISK_MB": str(DISK_MB)}) as node:
        with node.client() as c:
            src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
            r = c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
            assert r.status_code == 201, r.text
        yield node


@pytest.fixture(params=["runc", "gvisor"])
def template(request: pytest.FixtureRequest, disk_node: Node, monkeypatch: pytest.MonkeyPatch) -> str:
    for k, v in disk_node.env().items():
        monkeypatch.setenv(k, v)
    if request.param == "gvisor":
        with disk_node.client() as c:
            probe = c.get("/health").json()["runtimes"].get("gvisor", {})
        if not probe.get("available"):
            pytest.skip(f"gVisor unavailable on this node: {probe.get('reason')}")
        return "base-gvisor"
    return "base"


def _own_leaks(node: Node) -> leaks.HostSnapshot:
    """Only what this node can leave (its processes, mounts, loop devices, sandbox dirs): other nodes on
    the host share the cgroup, netns and nft names."""
    return leaks.snapshot(state_dirs=[node.state_dir], cgroup_parents=[], netns_prefixes=[], link_prefixes=[],
                          nft_tables=[])  # fmt: skip


def test_health_reports_enforced_disk_sizes(disk_node: Node) -> None:
    with disk_node.client() as c:
        health = c.get("/health").json()
    assert health["diskQuota"]["enforced"] is True, health["diskQuota"]
    assert health["diskQuota"]["size_override_mb"] == DISK_MB
    assert health["runtimes"]["runc"]["disk_quota"]["enforced"] is True


def test_writing_past_the_disk_fails_with_enospc_and_nothing_else_notices(disk_node: Node, template: str) -> None:
    before = _own_leaks(disk_node)
    full = Sandbox.create(template=template, timeout=120)
    other = Sandbox.create(template=template, timeout=120)
    try:
        with pytest.raises(CommandExitException) as failed:
            full.commands.run(FILL, timeout=60)
        assert "No space left on device" in failed.value.stderr
        df = full.commands.run("df -m --output=size / | tail -1").stdout
        assert int(df) <= DISK_MB

        # The full sandbox still answers and frees its space; its neighbour and the node still work.
        assert full.commands.run("rm /home/user/big && echo ok > /home/user/f && cat /home/user/f").stdout == "ok\n"
        wrote = other.commands.run("dd if=/dev/zero of=/home/user/half bs=1M count=32 2>&1 && echo done")
        assert wrote.stdout.strip().endswith("done")
        with disk_node.client() as c:
            assert c.get("/health").json()["status"] == "ok"
        third = Sandbox.create(template=template, timeout=60)
        assert third.commands.run("echo fine").stdout == "fine\n"
        third.kill()
        metrics = other.get_metrics()
        if metrics:
            assert metrics[-1].disk_total <= DISK_MB * 2**20
            assert metrics[-1].disk_used >= 32 * 2**20
    finally:
        full.kill()
        other.kill()
    leaks.assert_no_leaks(before, settle=20.0)  # gVisor sandboxes take ~1-2 s each to go away
    assert loop_devices_backed_by(disk_node.state_dir) == []
    assert not list((disk_node.state_dir / "sandboxes").glob("*/disk.img"))
