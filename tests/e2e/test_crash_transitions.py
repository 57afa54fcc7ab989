"""SIGKILL of the node in the middle of a pause or a resume (a test hook stalls it there): after the
restart the sandbox is in a defined state, usable, and nothing it owned is orphaned."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.framework import leaks
from tests.framework.node import DEFAULT_CACHE, Node, free_port

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done"


@pytest.fixture
def crash_node(tmp_path: Path, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    if os.geteuid() != 0 or not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip("needs root and `warren setup`")
    before = leaks.snapshot(state_dirs=[tmp_path / "state"])
    node = Node(state_dir=tmp_path / "state", port=free_port(), api_key="wrn_crash_" + os.urandom(6).hex(),
                runsc=patched_runsc)  # fmt: skip
    node.start()
    for k, v in node.env().items():
        monkeypatch.setenv(k, v)
    try:
        yield node
    finally:
        node.extra_env.pop("WARREN_TEST_STALL", None)
        if node.proc is None or node.proc.poll() is not None:
            node.start()
        node.kill_all_sandboxes()
        node.stop()
        leaks.assert_no_leaks(before, settle=20.0)  # gVisor sandboxes take ~1-2 s each to go away


def _restart_stalling(node: Node, point: str | None) -> None:
    node.stop()
    if point is None:
        node.extra_env.pop("WARREN_TEST_STALL", None)
    else:
        node.extra_env["WARREN_TEST_STALL"] = point
    node.start()


def _kill_when_stalled(node: Node, call: threading.Thread) -> None:
    call.start()
    deadline = time.monotonic() + 60
    while "test hook: stalling" not in node.log_tail(200) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "test hook: stalling" in node.log_tail(200)
    node.stop(signal.SIGKILL)
    call.join(timeout=30)


def _counter(box: Sandbox) -> int:
    return int(box.commands.run("cat /tmp/counter").stdout.strip())


@pytest.mark.parametrize("template", ["base", "base-gvisor"])
def test_sigkill_mid_pause_ends_paused(crash_node: Node, template: str) -> None:
    _import_gvisor(crash_node)
    _restart_stalling(crash_node, "pause")  # (a SIGTERM pauses running sandboxes: restart first)
    box = Sandbox.create(template=template, timeout=600)
    box.commands.run(COUNTER, background=True)
    time.sleep(0.6)
    _kill_when_stalled(crash_node, threading.Thread(target=lambda: _quietly(box.pause)))
    _restart_stalling(crash_node, None)
    assert Sandbox.get_info(box.sandbox_id).state.value == "paused"
    resumed = Sandbox.connect(box.sandbox_id)
    assert _counter(resumed) >= 2


@pytest.mark.parametrize("template", ["base", "base-gvisor"])
def test_sigkill_mid_resume_ends_running(crash_node: Node, template: str) -> None:
    _import_gvisor(crash_node)
    box = Sandbox.create(template=template, timeout=600)
    box.commands.run(COUNTER, background=True)
    time.sleep(0.6)
    box.pause()
    _restart_stalling(crash_node, "resume")
    _kill_when_stalled(crash_node, threading.Thread(target=lambda: _quietly(lambda: Sandbox.connect(box.sandbox_id))))
    _restart_stalling(crash_node, None)
    assert Sandbox.get_info(box.sandbox_id).state.value == "running"
    again = Sandbox.connect(box.sandbox_id)
    assert _counter(again) >= 2


def _quietly(fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except Exception:
        pass  # the node is killed under this call


def _import_gvisor(node: Node) -> None:
    with node.client() as c:
        if c.get("/health").json()["runtimes"].get("gvisor", {}).get("available") is not True:
            pytest.skip("gVisor unavailable")
        if c.get("/templates/base-gvisor").status_code == 404:
            src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
            c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
