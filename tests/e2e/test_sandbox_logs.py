"""A sandbox's logs (``GET /v2/sandboxes/{id}/logs``, E2B's v1 shape at ``/sandboxes/{id}/logs``, and
``warren logs``): its start command's stdout and stderr as they are written, and its agent's log; and
the CLI's lifecycle verbs against a real node (pause, resume, snapshot create/ls/rm, fork, metrics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox, Template

from tests.framework.node import Node


@pytest.fixture(scope="module")
def chatty(node: Node) -> Iterator[str]:
    """A runc template whose start command writes to stdout and stderr, then keeps running."""
    name = f"chatty-{uuid.uuid4().hex[:6]}"
    start = "echo hello-start; echo oops-start >&2; printf no-newline; sleep 600"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in node.env().items():
            mp.setenv(k, v)
        Template.build(Template().from_template("base").set_start_cmd(start, "true"), name)
    try:
        yield name
    finally:
        with node.client() as c:
            for box in c.get("/v2/sandboxes").json():
                if box.get("alias") == name:
                    c.delete(f"/sandboxes/{box['sandboxID']}")
            c.delete(f"/templates/{name}")


def _logs(node: Node, sandbox_id: str, **params: str) -> list[dict[str, Any]]:
    with node.client() as c:
        r = c.get(f"/v2/sandboxes/{sandbox_id}/logs", params=params)
    assert r.status_code == 200, r.text
    return list(r.json()["logs"])


def _start_lines(node: Node, sandbox_id: str, want: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        lines = [e for e in _logs(node, sandbox_id) if e["fields"]["source"] == "start"]
        if len(lines) >= want or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def _cli(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WARREN_URL": node.url, "WARREN_API_KEY": node.api_key}
    return subprocess.run([sys.executable, "-m", "warren.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)  # fmt: skip


def test_start_command_output_is_in_the_logs(node: Node, chatty: str) -> None:
    box = Sandbox.create(template=chatty, timeout=120)
    try:
        lines = _start_lines(node, box.sandbox_id, 2)
        by_text = {e["message"]: e for e in lines}
        assert by_text["hello-start"]["level"] == "info" and by_text["hello-start"]["fields"]["stream"] == "stdout"
        assert by_text["oops-start"]["level"] == "error" and by_text["oops-start"]["fields"]["stream"] == "stderr"
        assert all(e["timestamp"].endswith("Z") for e in lines)
        assert [e["message"] for e in _logs(node, box.sandbox_id, level="error")] == ["oops-start"]
        assert [e["message"] for e in _logs(node, box.sandbox_id, search="hello")] == ["hello-start"]
        assert len(_logs(node, box.sandbox_id, limit="1")) == 1
        everything = _logs(node, box.sandbox_id)
        assert _logs(node, box.sandbox_id, direction="backward") == everything[::-1]
        with node.client() as c:
            v1 = c.get(f"/sandboxes/{box.sandbox_id}/logs").json()
            assert {e["line"] for e in v1["logs"]} >= {"hello-start", "oops-start"}
            assert len(v1["logEntries"]) == len(v1["logs"])
            assert c.get(f"/v2/sandboxes/{box.sandbox_id}/logs", params={"direction": "up"}).status_code == 400
            assert c.get(f"/v2/sandboxes/{box.sandbox_id}/logs", params={"limit": "1001"}).status_code == 400
            assert c.get("/v2/sandboxes/inope/logs").status_code == 404
        out = _cli(node, "logs", box.sandbox_id)
        assert out.returncode == 0, out.stderr
        assert "hello-start" in {e["message"] for e in json.loads(out.stdout)}
    finally:
        box.kill()


def test_cli_lifecycle_verbs_on_a_real_node(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=120)
    snap = f"cli-snap-{uuid.uuid4().hex[:6]}"
    try:
        box.files.write("/home/user/mark.txt", "marked")
        assert _cli(node, "pause", box.sandbox_id).returncode == 0
        assert box.get_info().state.value == "paused"
        resumed = _cli(node, "resume", box.sandbox_id, "--timeout", "120")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["sandboxID"] == box.sandbox_id
        assert box.files.read("/home/user/mark.txt") == "marked"

        metrics = _cli(node, "metrics", box.sandbox_id, "--once")
        assert metrics.returncode == 0, metrics.stderr
        assert json.loads(metrics.stdout)["memTotal"] > 0

        made = _cli(node, "snapshot", "create", box.sandbox_id, "--name", snap)
        assert made.returncode == 0, made.stderr
        snapshot_id = json.loads(made.stdout)["snapshotID"]
        listed = json.loads(_cli(node, "snapshot", "ls", "--sandbox", box.sandbox_id).stdout)
        assert [s["snapshotID"] for s in listed] == [snapshot_id]
        assert _cli(node, "snapshot", "rm", snapshot_id).returncode == 0
        assert json.loads(_cli(node, "snapshot", "ls", "--sandbox", box.sandbox_id).stdout) == []

        forked = _cli(node, "fork", box.sandbox_id, "-n", "2")
        assert forked.returncode == 0, forked.stderr
        children = [r["sandbox"]["sandboxID"] for r in json.loads(forked.stdout)]
        assert len(children) == 2
        for child in children:
            assert Sandbox.connect(child).files.read("/home/user/mark.txt") == "marked"
            Sandbox.kill(child)
        gone = _cli(node, "pause", "inope")
        assert gone.returncode == 1 and "not found" in gone.stderr + gone.stdout
    finally:
        box.kill()
