"""A node restarted (SIGTERM) or killed (SIGKILL) with sandboxes: nothing lost, nothing leaked."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.framework import leaks
from tests.framework.foreign import add_netns, delete_netns, start_foreign_runc
from tests.framework.node import DEFAULT_CACHE, Node, free_port
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.rootfs import mounts_under


@pytest.fixture
def own_node(tmp_path: Path, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    """A node of this test's own, which the test stops and starts."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip("run `warren setup` first")
    before = leaks.snapshot(state_dirs=[tmp_path / "state"])
    node = Node(state_dir=tmp_path / "state", port=free_port(), api_key="wrn_restart_" + os.urandom(6).hex(),
                runsc=patched_runsc)
    node.start()
    for k, v in node.env().items():
        monkeypatch.setenv(k, v)
    try:
        yield node
    finally:
        if node.proc is None or node.proc.poll() is not None:
            node.start()
        node.kill_all_sandboxes()
        node.stop()
        leaks.assert_no_leaks(before, settle=20.0)  # gVisor sandboxes take ~1-2 s each to go away


def _counter(box: Sandbox) -> int:
    return int(box.commands.run("cat /tmp/counter").stdout.strip())


COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done"


def test_restart_with_running_sandboxes_readopts_them(own_node: Node) -> None:
    """SIGTERM pauses the running sandboxes (seed 000); after the restart they resume with their state."""
    boxes = [Sandbox.create(template="base", timeout=600) for _ in range(5)]
    for b in boxes:
        b.commands.run(COUNTER, background=True)
        b.files.write("/home/user/f.txt", b.sandbox_id)
    time.sleep(0.6)
    assert own_node.stop() == 0
    own_node.start()
    for b in boxes:
        assert Sandbox.get_info(b.sandbox_id).state.value == "paused"
        resumed = Sandbox.connect(b.sandbox_id)
        assert resumed.files.read("/home/user/f.txt") == b.sandbox_id
        assert _counter(resumed) >= 2


def test_paused_sandboxes_survive_restart(own_node: Node) -> None:
    boxes = [Sandbox.create(template="base", timeout=600) for _ in range(3)]
    for b in boxes:
        b.commands.run(COUNTER, background=True)
    time.sleep(0.6)
    for b in boxes:
        b.pause()
    own_node.stop()
    own_node.start()
    for b in boxes:
        resumed = Sandbox.connect(b.sandbox_id)
        first = _counter(resumed)
        assert first >= 2
        time.sleep(0.5)
        assert _counter(resumed) > first


def test_sigkill_readopts_running_and_paused(own_node: Node, busybox_rootfs: Path, tmp_path: Path) -> None:
    """After SIGKILL the 3 running sandboxes are re-adopted and answer; the 2 paused ones resume.

    Two more (runc and gVisor) lose their store rows while the node is down, as after a crash between
    starting a sandbox and recording it: at restart they are orphans and are reaped with everything
    they hold. A runc container under another --root (with an orphan's very id) and a netns without
    our prefix are untouched.
    """
    _import_gvisor_template(own_node)
    running = [Sandbox.create(template="base", timeout=600) for _ in range(3)]
    paused = [Sandbox.create(template="base", timeout=600) for _ in range(2)]
    orphans = [Sandbox.create(template=t, timeout=600) for t in ("base", "base-gvisor")]
    for b in paused:
        b.files.write("/home/user/p.txt", "p")
        b.pause()
    orphan_ids = [b.sandbox_id for b in orphans]
    orphan_pids = {sid: _cgroup_pids(sid) for sid in orphan_ids}
    assert all(orphan_pids.values())
    runc = shutil.which("runc")
    assert runc is not None
    foreign_netns = f"foreign-e2e-{os.getpid()}"
    foreign = None
    try:
        add_netns(foreign_netns)
        foreign = start_foreign_runc(Path(runc), tmp_path / "foreign", busybox_rootfs, orphan_ids[0],
                                     cgroups_path=f"/{NODE_CGROUP_PARENT}-e2e-foreign/{orphan_ids[0]}")
        foreign_pid = foreign.pid()

        own_node.stop(signal.SIGKILL)
        with sqlite3.connect(own_node.state_dir / "warren.db") as db:
            db.executemany("DELETE FROM sandboxes WHERE id = ?", [(sid,) for sid in orphan_ids])
        db.close()
        own_node.start()

        for b in running:
            again = Sandbox.connect(b.sandbox_id)
            assert again.commands.run("echo back").stdout.strip() == "back"
        for b in paused:
            again = Sandbox.connect(b.sandbox_id)
            assert again.files.read("/home/user/p.txt") == "p"
        for sid in orphan_ids:
            _assert_reaped(own_node.state_dir, sid, orphan_pids[sid])
        assert foreign.state() == "running" and Path(f"/proc/{foreign_pid}").exists()
        assert os.path.exists(f"/run/netns/{foreign_netns}")
        assert "reaped 2 orphaned sandboxes" in own_node.log_tail(400)
    finally:
        if foreign is not None:
            foreign.delete(remove_cgroup_parent=True)
        delete_netns(foreign_netns)


NODE_CGROUP_PARENT = "warren"
"""The node's cgroup parent (``Settings.node_name``'s default)."""


def _import_gvisor_template(node: Node) -> None:
    with node.client() as c:
        src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
        r = c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
        assert r.status_code == 201, r.text


def _cgroup_pids(sandbox_id: str) -> set[int]:
    pids: set[int] = set()
    for d in CgroupHierarchies.detect().existing(f"{NODE_CGROUP_PARENT}/{sandbox_id}"):
        pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return pids


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _assert_reaped(state_dir: Path, sandbox_id: str, pids: set[int]) -> None:
    """Nothing of the sandbox is left: processes, runtime state, netns, cgroups, mounts, dir."""
    assert not any(_running(p) for p in pids)
    assert not (state_dir / "runtime" / "runc" / sandbox_id).exists()
    assert not list((state_dir / "runtime" / "runsc").glob(f"{sandbox_id}_sandbox:*"))
    assert not os.path.exists(f"/run/netns/wrn-{sandbox_id}")
    assert not CgroupHierarchies.detect().existing(f"{NODE_CGROUP_PARENT}/{sandbox_id}")
    assert not mounts_under(state_dir / "sandboxes" / sandbox_id)
    assert not (state_dir / "sandboxes" / sandbox_id).exists()


def test_second_server_on_the_same_state_dir_is_refused(own_node: Node) -> None:
    env = {**os.environ, "WARREN_LOCK_BUDGET_S": "1", "WARREN_API_KEY": own_node.api_key}
    proc = subprocess.run(
        [sys.executable, "-m", "warren.cli.main", "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--state-dir", str(own_node.state_dir)],
        env=env, capture_output=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert proc.returncode != 0
    flat = "".join((proc.stdout + proc.stderr).decode().split())  # Rich wraps long lines
    assert "instance.lock" in flat and f"pid{own_node.proc.pid if own_node.proc else ''}" in flat.replace(" ", "")
