"""The warm pool: a used template keeps N sandboxes started; a create claims one and /init's it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template

from tests.framework import leaks
from tests.framework.node import Node, running_node


@pytest.fixture
def pool_node(tmp_path: Path, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    with running_node(tmp_path / "state", runsc=patched_runsc, extra_env={"WARREN_WARM_POOL": "2"}) as node:
        for k, v in node.env().items():
            monkeypatch.setenv(k, v)
        yield node


def _pool(node: Node) -> dict[str, dict[str, int]]:
    with node.client() as c:
        stats: dict[str, dict[str, int]] = c.get("/health").json()["warmPool"]
    return stats


def _wait_ready(node: Node, n: int) -> dict[str, int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shelves = list(_pool(node).values())
        if shelves and shelves[0]["ready"] >= n:
            return shelves[0]
        time.sleep(0.1)
    raise AssertionError(f"the pool did not fill: {_pool(node)}")


def test_create_claims_a_warm_sandbox(pool_node: Node) -> None:
    first = Sandbox.create(template="busybox", envs={"WHO": "first"})
    assert _wait_ready(pool_node, 2)["misses"] == 1
    second = Sandbox.create(template="busybox", envs={"WHO": "second"}, metadata={"m": "1"})
    try:
        shelf = next(iter(_pool(pool_node).values()))
        assert shelf["hits"] == 1
        assert second.commands.run("echo $WHO").stdout.strip() == "second"
        assert second.commands.run("hostname").stdout.strip() == second.sandbox_id
        assert second.commands.run("whoami").stdout.strip() == "user"
        assert second.get_info().metadata == {"m": "1"}
        wrong = {"E2b-Sandbox-Id": second.sandbox_id, "X-Access-Token": first._envd_access_token or ""}
        stat = httpx.post(f"{pool_node.url}/filesystem.Filesystem/Stat", json={"path": "/"}, headers=wrong)
        assert stat.status_code == 401
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert listed == {first.sandbox_id, second.sandbox_id}  # pool sandboxes are not listed
    finally:
        first.kill()
        second.kill()


def test_pool_size_per_template(pool_node: Node) -> None:
    with pool_node.client() as c:
        r = c.post("/warren/templates/busybox/pool", json={"size": 1})
        assert r.status_code == 200, r.text
        assert c.post("/warren/templates/busybox/pool", json={"size": -1}).status_code == 400
        assert c.post("/warren/templates/nope/pool", json={"size": 1}).status_code == 404
    shelf = _wait_ready(pool_node, 1)
    assert shelf["target"] == 1


# ----- templates with a start command: the pool runs it before the user's sandbox exists (as E2B's
# snapshot taken after the start command does), with the template's env only ----------------------

SERVER_PORT = 8123
STARTED = (
    "mkdir -p /tmp/www && date +%s.%N > /tmp/www/started-at && "
    "printf '%s|%s' \"${TPL_VAR-unset}\" \"${USER_VAR-unset}\" > /tmp/www/env && "
    "echo pool-start-out && echo pool-start-err >&2 && sleep 1 && "
    f"exec python3 -m http.server {SERVER_PORT} --bind 127.0.0.1 --directory /tmp/www"
)
URL = f"http://127.0.0.1:{SERVER_PORT}"
STARTED_READY = f"python3 -c \"import urllib.request as u; u.urlopen('{URL}/env', timeout=1)\""


def _build(node: Node, name: str, start: str, ready: str) -> str:
    """A runc template on ``base`` with a start and a ready command and an env var of its own; its id."""
    Template.build(Template().from_template("base").set_envs({"TPL_VAR": "from-template"}).set_start_cmd(start, ready),
                   name)  # fmt: skip
    with node.client() as c:
        return str(c.get(f"/templates/{name}").json()["templateID"])


def _shelf(node: Node, template_id: str) -> dict[str, int]:
    return _pool(node).get(f"{template_id}/runc", {})


def _wait_shelf(node: Node, template_id: str, done: Callable[[dict[str, int]], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not done(_shelf(node, template_id)):
        if time.monotonic() > deadline:
            raise AssertionError(f"the pool of {template_id} did not get there: {_pool(node)}")
        time.sleep(0.1)


def _start_lines(node: Node, sandbox_id: str) -> list[str]:
    with node.client() as c:
        r = c.get(f"/v2/sandboxes/{sandbox_id}/logs")
    assert r.status_code == 200, r.text
    return [e["message"] for e in r.json()["logs"] if e["fields"]["source"] == "start"]


def test_a_claimed_sandbox_has_run_its_start_command_before_the_create(pool_node: Node) -> None:
    name = f"started-{uuid.uuid4().hex[:6]}"
    template_id = _build(pool_node, name, STARTED, STARTED_READY)
    before_cold = time.time()
    cold = Sandbox.create(template=name, timeout=120)  # the template's first create: a miss, started cold
    try:
        assert float(cold.files.read("/tmp/www/started-at")) > before_cold
        # Both spares: the second one's start came after the first one's output (the claim takes the first).
        _wait_shelf(pool_node, template_id, lambda s: s.get("ready", 0) >= 2)
        before = time.time()
        box = Sandbox.create(template=name, timeout=120, envs={"USER_VAR": "from-create"})
        try:
            assert _shelf(pool_node, template_id)["hits"] == 1
            # The start command ran in the spare, before this create was asked for, and its server answers.
            assert float(box.files.read("/tmp/www/started-at")) < before
            fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{URL}/env').read().decode())\""
            # It saw the template's env, never the user's; the server it became has no USER_VAR either.
            assert box.commands.run(fetch).stdout.strip() == "from-template|unset"
            environ = box.commands.run("tr '\\0' '\\n' < /proc/$(pgrep -f '^python3 -m http[.]server')/environ")
            assert "TPL_VAR=from-template" in environ.stdout.splitlines()
            assert not [v for v in environ.stdout.splitlines() if v.startswith("USER_VAR=")]
            # The user's commands see both.
            assert box.commands.run("echo $TPL_VAR $USER_VAR").stdout.strip() == "from-template from-create"
            # Its output, written while it was a spare, is in the logs of the sandbox it became.
            assert {"pool-start-out", "pool-start-err"} <= set(_start_lines(pool_node, box.sandbox_id))
        finally:
            box.kill()
    finally:
        cold.kill()


@pytest.fixture
def impatient_pool_node(tmp_path: Path, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    """A pool of 1, and ready commands that give up after 2 s."""
    env = {"WARREN_WARM_POOL": "1", "WARREN_START_READY_TIMEOUT_S": "2"}
    with running_node(tmp_path / "state", runsc=patched_runsc, extra_env=env) as node:
        for k, v in node.env().items():
            monkeypatch.setenv(k, v)
        yield node


def _own_leaks(node: Node) -> leaks.HostSnapshot:
    """What this node can leave (processes, mounts, loop devices, sandbox dirs under its state dir): other
    nodes on the host share the cgroup, netns and nft names."""
    return leaks.snapshot(state_dirs=[node.state_dir], cgroup_parents=[], netns_prefixes=[], link_prefixes=[],
                          nft_tables=[])  # fmt: skip


def test_a_start_command_that_never_gets_ready_leaks_no_spare_and_creates_report_it(
    impatient_pool_node: Node,
) -> None:
    node = impatient_pool_node
    template_id = _build(node, f"doomed-{uuid.uuid4().hex[:6]}", "echo doomed-start; exit 3", "test -e /nowhere")
    before = _own_leaks(node)

    def create() -> httpx.Response:
        with node.client() as c:
            return c.post("/v2/sandboxes", json={"templateID": template_id, "timeout": 60})

    first = create()  # a miss: the cold path runs the start command and says why it failed
    assert first.status_code >= 500 and "ready command" in first.json()["message"], first.text
    # The pool's spares fail the same way: each is stopped, and after a few the shelf gives up.
    _wait_shelf(node, template_id, lambda s: s.get("target", 1) == 0 and s.get("ready", 0) == 0)
    again = create()
    assert again.status_code >= 500 and "ready command" in again.json()["message"], again.text
    leaks.assert_no_leaks(before, settle=10.0)
    with node.client() as c:
        assert c.get("/v2/sandboxes").json() == []
    log = node.log_path.read_text()
    assert f"warm pool for {template_id}: start failed" in log and "ready command" in log
