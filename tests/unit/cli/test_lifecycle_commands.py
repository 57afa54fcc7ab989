"""pause, resume, fork, snapshot create/ls/rm, metrics and logs: what each sends and prints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner, Result

from tests.unit.cli.fake_server import FakeServer, Reply
from warren.cli import lifecycle_cmds, output
from warren.cli.main import app

SAMPLE = {"timestamp": "2026-01-01T00:00:00Z", "timestampUnix": 1767225600, "cpuCount": 2, "cpuUsedPct": 12.5,
          "memUsed": 64 * 2**20, "memTotal": 512 * 2**20, "memCache": 0, "diskUsed": 2**30,
          "diskTotal": 2**31}  # fmt: skip
SNAPSHOT = {"snapshotID": "snap1", "names": ["keep"], "sandboxID": "isb1", "templateID": "t1", "runtime": "runc",
            "memory": True, "createdAt": "2026-01-01T00:00:00Z"}  # fmt: skip


def _ok(result: Result) -> None:
    assert result.exit_code == 0, result.output


def test_pause_and_resume(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/sandboxes/isb1/pause", Reply(204))
    server.route("POST", "/sandboxes/isb1/resume", Reply(201, {"sandboxID": "isb1"}))
    _ok(runner.invoke(app, ["pause", "isb1"]))
    _ok(runner.invoke(app, ["pause", "isb1", "--no-memory"]))
    result = runner.invoke(app, ["resume", "isb1", "--timeout", "90"])
    _ok(result)
    assert json.loads(result.stdout) == {"sandboxID": "isb1"}
    first, second = server.requests_to("POST", "/sandboxes/isb1/pause")
    assert first.json() == {} and second.json() == {"memory": False}
    assert server.requests_to("POST", "/sandboxes/isb1/resume")[0].json() == {"timeout": 90}


def test_pause_errors_are_one_line(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/sandboxes/gone/pause", Reply(404, {"code": 404, "message": "sandbox gone not found"}))
    result = runner.invoke(app, ["pause", "gone"])
    assert result.exit_code == 1 and "sandbox gone not found" in result.output


def test_fork(server: FakeServer, runner: CliRunner) -> None:
    children = [{"sandbox": {"sandboxID": "ic1"}}, {"sandbox": {"sandboxID": "ic2"}}]
    server.route("POST", "/sandboxes/isb1/fork", Reply(201, children))
    result = runner.invoke(app, ["fork", "isb1", "-n", "2"])
    _ok(result)
    assert json.loads(result.stdout) == children
    assert server.requests_to("POST", "/sandboxes/isb1/fork")[0].json() == {"count": 2}


def test_fork_with_a_failed_child_exits_1(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("POST", "/sandboxes/isb1/fork", Reply(201, [{"sandbox": {"sandboxID": "ic1"}},
                                                             {"error": {"code": 429, "message": "node full"}}]))
    result = runner.invoke(app, ["fork", "isb1", "--count", "2"])
    assert result.exit_code == 1
    assert "ic1" in result.stdout and "node full" in result.stdout


def test_snapshot_create_ls_rm(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/sandboxes/isb1/snapshots", Reply(201, {"snapshotID": "snap1", "names": ["keep"]}))
    server.route("GET", "/snapshots", Reply(200, [SNAPSHOT]))
    server.route("DELETE", "/snapshots/snap1", Reply(204))
    _ok(runner.invoke(app, ["snapshot", "create", "isb1", "--name", "keep"]))
    assert server.requests_to("POST", "/sandboxes/isb1/snapshots")[0].json() == {"name": "keep"}
    result = runner.invoke(app, ["snapshot", "ls", "--sandbox", "isb1"])
    _ok(result)
    assert json.loads(result.stdout) == [SNAPSHOT]
    assert server.requests_to("GET", "/snapshots")[0].query == {"sandboxID": ["isb1"]}
    _ok(runner.invoke(app, ["snapshot", "rm", "snap1"]))
    assert len(server.requests_to("DELETE", "/snapshots/snap1")) == 1


def test_snapshot_ls_table(server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("GET", "/snapshots", Reply(200, [SNAPSHOT]))
    result = runner.invoke(app, ["snapshot", "ls"])
    _ok(result)
    assert "SNAPSHOT ID" in result.stdout and "snap1" in result.stdout


def test_metrics_once(server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("GET", "/sandboxes/isb1/metrics", Reply(200, [SAMPLE]))
    result = runner.invoke(app, ["metrics", "isb1", "--once"])
    _ok(result)
    assert "CPU %" in result.stdout and "12.5" in result.stdout and "64.0" in result.stdout
    assert len(server.requests) == 1


def test_metrics_follows_until_interrupted(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.route("GET", "/sandboxes/isb1/metrics", Reply(200, [SAMPLE]))
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle_cmds.time, "sleep", sleep)
    result = runner.invoke(app, ["metrics", "isb1", "--interval", "0.5"])
    _ok(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(json.loads(line) == SAMPLE for line in lines)
    assert naps == [0.5, 0.5, 0.5]


def test_metrics_of_an_unknown_sandbox(server: FakeServer, runner: CliRunner) -> None:
    server.route("GET", "/sandboxes/x/metrics", Reply(404, {"code": 404, "message": "sandbox x not found"}))
    result = runner.invoke(app, ["metrics", "x", "--no-follow"])
    assert result.exit_code == 1 and "sandbox x not found" in result.output


def test_logs(server: FakeServer, runner: CliRunner) -> None:
    entries = [{"timestamp": "2026-01-01T00:00:00Z", "level": "info", "message": "serving on 8000",
                "fields": {"source": "start"}}]  # fmt: skip
    server.route("GET", "/v2/sandboxes/isb1/logs", Reply(200, {"logs": entries}))
    result = runner.invoke(app, ["logs", "isb1"])
    _ok(result)
    assert json.loads(result.stdout) == entries
    _ok(runner.invoke(app, ["logs", "isb1", "--limit", "5"]))
    assert server.requests_to("GET", "/v2/sandboxes/isb1/logs")[-1].query == {"limit": ["5"]}
