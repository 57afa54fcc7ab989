"""Issue 9, hostile trees: a 100000-deep directory tree made inside a runc sandbox goes through a
snapshot, a create from it, a fork, kills and a node restart; the node ends working and with nothing
left behind. Garbage planted in the node's own dirs before the restart (a half-written snapshot, a
sandbox dir with an unreadable record, temp dirs of crashed copies, all holding deep trees) is moved
aside into ``state_dir/quarantine`` or removed, never fatal.

The node's state dir is private (not under pytest's basetemp): pytest's own cleanup uses a recursive
``shutil.rmtree`` and would die on a deep tree that a failing run left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.framework import leaks
from tests.framework.deep import make_deep, private_dir
from tests.framework.node import DEFAULT_CACHE, Node, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
"""Every copy and removal of the 100000-deep tree is ~100000 mkdir/rmdir in the kernel: minutes in all."""

DEPTH = 100_000
HOSTILE_DEPTH = 5_000
"""Deep enough for any recursive walk in Python (the default recursion limit is 1000), quick to make."""

MAKE_DEEP = f"""
import os
fd = os.open("/home/user", os.O_RDONLY | os.O_DIRECTORY)
for _ in range({DEPTH}):
    os.mkdir("d", dir_fd=fd)
    nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nxt
out = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
os.write(out, b"deep")
print("made")
"""

READ_DEEP = f"""
import os
fd = os.open("/home/user", os.O_RDONLY | os.O_DIRECTORY)
for _ in range({DEPTH}):
    nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nxt
print(os.read(os.open("bottom", os.O_RDONLY, dir_fd=fd), 10).decode())
"""


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip("run `warren setup` first")
    with private_dir("/var/tmp") as top:
        try:
            yield top / "state"
        finally:
            log = top / "state-node.log"
            if log.exists():
                shutil.copy(log, tmp_path / log.name)  # kept for a post-mortem, the deep trees are not


@pytest.fixture
def made() -> list[str]:
    """Ids of the sandboxes the test made: the leak check looks at their resources only (other
    engineers' tests may be starting and stopping sandboxes on this host at the same time)."""
    return []


@pytest.fixture
def deep_node(state_dir: Path, made: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    before = leaks.snapshot(state_dirs=[state_dir])
    node = Node(state_dir=state_dir, port=free_port(), api_key="wrn_deep_" + os.urandom(6).hex())
    node.start()
    for k, v in node.env().items():
        monkeypatch.setenv(k, v)
    try:
        yield node
    finally:
        if node.proc is None or node.proc.poll() is not None:
            with contextlib.suppress(Exception):
                node.start()
        with contextlib.suppress(Exception):
            node.kill_all_sandboxes()
        node.stop()
        _assert_nothing_left(before, made)


def _assert_nothing_left(before: leaks.HostSnapshot, ids: list[str], settle: float = 20.0) -> None:
    """No process, mount or sandbox dir under the state dir, and no netns or cgroup of ``ids``."""
    deadline = time.monotonic() + settle
    while True:
        after = leaks.snapshot(state_dirs=[Path(d) for d in before.state_dirs])
        leaked = {kind: items for kind, items in before.diff(after).items()
                  if kind in ("processes", "mounts", "sandbox_dirs") or any(i in x for x in items for i in ids)}
        if not leaked or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    assert not leaked, f"left behind: {leaked}"


def _plant_garbage(state: Path) -> dict[str, Path]:
    """What a crash or a failed copy could have left, each holding a deep tree. The unpublished snapshot
    and the unreadable sandbox record are moved aside; temp dirs and the record-less sandbox dir (the
    orphan reaper's) are removed."""
    garbage = {
        "staging": state / "snapshots" / ".tmp" / "scrashed-0badc0de",
        "half": state / "snapshots" / "shalfwritten",
        "bogus": state / "sandboxes" / "ibogusrecord",
        "norecord": state / "sandboxes" / "inorecord",
        "layer_tmp": state / "images" / "tmp" / "layer-deadbeef-0badc0de",
        "build_tmp": state / "layers" / ".tmp-build-0123456789abcdef-0badc0de",
    }
    for key in ("staging", "half"):
        make_deep(garbage[key] / "data" / "upper", HOSTILE_DEPTH)  # "half": no manifest.json, never published
    make_deep(garbage["bogus"] / "upper", HOSTILE_DEPTH)
    (garbage["bogus"] / "sandbox.json").write_text("{this is not json")
    make_deep(garbage["norecord"] / "upper", HOSTILE_DEPTH)  # a crash between mkdir and the record
    make_deep(garbage["layer_tmp"], HOSTILE_DEPTH)
    make_deep(garbage["build_tmp"], HOSTILE_DEPTH)
    return garbage


def test_deep_tree_snapshot_fork_kill_restart(deep_node: Node, made: list[str]) -> None:
    state = deep_node.state_dir
    sbx = Sandbox.create(template="base", timeout=900)
    made.append(sbx.sandbox_id)
    result = sbx.commands.run(f"python3 -c '{MAKE_DEEP}'", timeout=600)
    assert result.stdout.strip() == "made", result

    snap = sbx.create_snapshot()
    child = Sandbox.create(template=snap.snapshot_id, timeout=900)
    made.append(child.sandbox_id)
    assert child.commands.run(f"python3 -c '{READ_DEEP}'", timeout=600).stdout.strip() == "deep"
    forks = sbx.fork(count=1)
    assert len(forks) == 1 and isinstance(forks[0], Sandbox), forks
    fork = forks[0]
    made.append(fork.sandbox_id)
    assert fork.commands.run(f"python3 -c '{READ_DEEP}'", timeout=600).stdout.strip() == "deep"

    for box in (child, fork, sbx):
        box.kill()
    assert not list((state / "snapshots" / ".tmp").iterdir())  # the fork's private snapshot is gone
    assert not list((state / "sandboxes").iterdir())

    assert deep_node.stop() == 0
    garbage = _plant_garbage(state)
    deep_node.start()

    with httpx.Client(base_url=deep_node.url, timeout=30) as c:
        assert c.get("/health").status_code == 200
    box = Sandbox.create(template=snap.snapshot_id, timeout=300)
    made.append(box.sandbox_id)
    try:
        assert box.commands.run("echo alive").stdout.strip() == "alive"
    finally:
        box.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True

    quarantined = sorted(p.name for p in (state / "quarantine").iterdir())
    for key in ("half", "bogus"):
        assert any(name.endswith("-" + garbage[key].name) for name in quarantined), (key, quarantined)
    for path in garbage.values():
        assert not os.path.lexists(path), path
    assert not list((state / "snapshots" / ".tmp").iterdir())
    assert not [p for p in (state / "snapshots").iterdir() if p.name != ".tmp"]
    assert not list((state / "sandboxes").iterdir())
    assert not list((state / "images" / "tmp").iterdir())
    log = deep_node.log_tail(400)
    assert "moved" in log and "aside" in log
    assert "Traceback" not in log, log
