"""A gVisor template with a start command is sealed as a memory snapshot at build time: creates
restore it, so the start command's process is already running and was not started again."""

from __future__ import annotations

import pytest
from e2b import Sandbox, Template

from tests.framework.node import Node

START = "sh -c 'head -c 8 /dev/urandom | od -An -tx1 | tr -d \" \" > /tmp/started; exec sleep 100000'"
READY = "test -s /tmp/started"


def test_gvisor_template_is_restored_with_its_start_process(node: Node) -> None:
    with node.client() as c:
        probe = c.get("/health").json()["runtimes"].get("gvisor", {})
    if not probe.get("available"):
        pytest.skip(f"gVisor unavailable: {probe.get('reason')}")
    template = Template().from_template("base-gvisor").set_start_cmd(START, READY)
    Template.build(template, "g-started")
    with node.client() as c:
        seal_name = f"template:{c.get('/templates/g-started').json()['templateID']}"
    boxes = [Sandbox.create(template="g-started") for _ in range(2)]
    try:
        marks = [b.commands.run("cat /tmp/started").stdout.strip() for b in boxes]
        # The same random mark in both: both were restored from one checkpoint, not started anew.
        assert marks[0] and marks[0] == marks[1]
        for b in boxes:
            assert b.commands.run("pgrep -f 'sleep 100000'").stdout.strip()
        with node.client() as c:
            listed = c.get("/snapshots").json()
        assert not any(n.startswith("template:") for s in listed for n in s["names"])
    finally:
        for b in boxes:
            b.kill()
        with node.client() as c:
            assert c.delete("/templates/g-started").status_code == 204
    # Its seal went with it (other templates of the session node, code-interpreter-v1-gvisor, keep theirs).
    sealed = [p for p in (node.state_dir / "snapshots").iterdir() if not p.name.startswith(".")]
    assert not any(seal_name in (p / "manifest.json").read_text() for p in sealed)
