"""Memory lifecycle through the unmodified SDK: pause/connect, filesystem pause, snapshots, forks, auto-resume."""

from __future__ import annotations

import time

import httpx
from e2b import Sandbox

from tests.framework.node import Node

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done"


def _counter(box: Sandbox) -> int:
    return int(box.commands.run("cat /tmp/counter").stdout.strip())


def test_pause_then_connect_keeps_processes_and_memory(sbx: Sandbox) -> None:
    sbx.commands.run(COUNTER, background=True)
    time.sleep(1)
    assert sbx.pause() is True
    assert sbx.get_info().state.value == "paused"
    assert Sandbox.pause(sbx.sandbox_id) is False  # already paused: 409
    resumed = Sandbox.connect(sbx.sandbox_id)
    first = _counter(resumed)
    assert first >= 2  # kept counting from where it was, not from 0 (tmpfs: sandbox memory)
    time.sleep(0.8)
    assert _counter(resumed) > first
    assert any("while true" in " ".join([p.cmd, *p.args]) for p in resumed.commands.list())


def test_filesystem_pause_keeps_files(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/keep.txt", "kept")
    sbx.commands.run("sleep 600", background=True)
    assert sbx.pause(mode="filesystem") is True
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.files.read("/home/user/keep.txt") == "kept"
    assert not any("sleep 600" in " ".join([p.cmd, *p.args]) for p in resumed.commands.list())


def test_snapshot_then_create_and_delete_source(sbx: Sandbox, runtime: str) -> None:
    sbx.files.write("/home/user/snap.txt", "in-snapshot")
    if runtime == "gvisor":
        sbx.commands.run(COUNTER, background=True)
        time.sleep(1)
    info = sbx.create_snapshot()
    assert sbx.commands.run("echo still-running").stdout.strip() == "still-running"
    Sandbox.kill(sbx.sandbox_id)
    child = Sandbox.create(template=info.snapshot_id)
    try:
        assert child.files.read("/home/user/snap.txt") == "in-snapshot"
        if runtime == "gvisor":
            assert _counter(child) >= 2  # the snapshot's processes run on in the new sandbox
        assert any(s.snapshot_id == info.snapshot_id for s in Sandbox.list_snapshots().next_items())
    finally:
        child.kill()
        Sandbox.delete_snapshot(info.snapshot_id)
    assert Sandbox.delete_snapshot(info.snapshot_id) is False


def test_fork_three_children_are_independent(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/base.txt", "base")
    children = sbx.fork(count=3)
    try:
        boxes = [c for c in children if isinstance(c, Sandbox)]
        assert len(boxes) == 3, children
        randoms = {b.commands.run("head -c 16 /dev/urandom | od -An -tx1").stdout for b in boxes}
        assert len(randoms) == 3
        for i, b in enumerate(boxes):
            assert b.files.read("/home/user/base.txt") == "base"
            b.files.write("/home/user/mine.txt", str(i))
        assert [b.files.read("/home/user/mine.txt") for b in boxes] == ["0", "1", "2"]
        assert not sbx.files.exists("/home/user/mine.txt")
        assert sbx.commands.run("echo source-alive").stdout.strip() == "source-alive"
    finally:
        for b in children:
            if isinstance(b, Sandbox):
                b.kill()


def test_auto_pause_at_timeout_then_traffic_resumes(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        box.files.write("/home/user/a.txt", "awake")
        deadline = time.monotonic() + 60
        while box.get_info().state.value != "paused" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert box.get_info().state.value == "paused"
        assert box.files.read("/home/user/a.txt") == "awake"  # proxied request resumes it
        assert box.get_info().state.value == "running"
    finally:
        box.kill()


def test_paused_without_auto_resume_answers_502(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=60)
    try:
        box.pause()
        r = httpx.get(f"{node.url}/health", headers={"E2b-Sandbox-Id": box.sandbox_id})
        assert r.status_code == 502 and "paused" in r.json()["message"]
    finally:
        box.kill()


def test_bad_lifecycle_input(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=60)
    try:
        with node.client() as c:
            for count in (0, 101):
                r = c.post(f"/sandboxes/{box.sandbox_id}/fork", json={"count": count})
                assert r.status_code == 400 and r.json()["code"] == 400
            assert c.post("/sandboxes/inope/resume", json={}).status_code == 404
            assert c.post(f"/sandboxes/{box.sandbox_id}/resume", json={}).status_code == 409
            box.files.write("/home/user/p.txt", "paused-snap")
            box.pause()
            # Documented: a paused sandbox can be snapshotted as it is, and stays paused.
            snap = c.post(f"/sandboxes/{box.sandbox_id}/snapshots", json={"name": f"p-{box.sandbox_id}"})
            assert snap.status_code == 201, snap.text
            assert c.get(f"/sandboxes/{box.sandbox_id}").json()["state"] == "paused"
            child = Sandbox.create(template=snap.json()["snapshotID"])
            try:
                assert child.files.read("/home/user/p.txt") == "paused-snap"
            finally:
                child.kill()
                c.delete(f"/snapshots/{snap.json()['snapshotID']}")
    finally:
        box.kill()
