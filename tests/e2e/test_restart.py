"""A node restarted (SIGTERM) or killed (SIGKILL) with sandboxes: nothing lost, nothing leaked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.framework import leaks
from tests.framework.node import DEFAULT_CACHE, Node, free_port


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
        leaks.assert_no_leaks(before)


def _counter(box: Sandbox) -> int:
    return int(box.commands.run("cat /tmp/counter").stdout.strip())


COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done"


def test_restart_with_running_sandboxes_readopts_them(own_node: Node) -> None:
    """SIGTERM pauses the running sandboxes (seed 000); after the restart they resume with their state."""
    boxes = [Sandbox.create(template="base", timeout=600) for _ in range(3)]
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


def test_sigkill_readopts_running_and_paused(own_node: Node) -> None:
    """After SIGKILL the 3 running sandboxes are re-adopted and answer; the 2 paused ones resume."""
    running = [Sandbox.create(template="base", timeout=600) for _ in range(3)]
    paused = [Sandbox.create(template="base", timeout=600) for _ in range(2)]
    for b in paused:
        b.files.write("/home/user/p.txt", "p")
        b.pause()
    own_node.stop(signal.SIGKILL)
    own_node.start()
    for b in running:
        again = Sandbox.connect(b.sandbox_id)
        assert again.commands.run("echo back").stdout.strip() == "back"
    for b in paused:
        again = Sandbox.connect(b.sandbox_id)
        assert again.files.read("/home/user/p.txt") == "p"


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
