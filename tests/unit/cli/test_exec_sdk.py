"""``warren exec`` through the unmodified E2B SDK, against a fake control plane + envd on loopback."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.unit.cli.conftest import API_KEY
from tests.unit.cli.fake_server import FakeServer, Reply, process_events
from warren.cli.main import app

CONNECTED = {"sandboxID": "isb1", "templateID": "base", "clientID": "warren", "envdVersion": "0.6.13"}
STREAM = {"Content-Type": "application/connect+json"}


def test_exec_uses_the_sdk_on_both_planes_and_passes_the_exit_code(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/v2/sandboxes/isb1/connect", Reply(200, CONNECTED))
    server.route("POST", "/process.Process/Start", Reply(200, process_events(b"hello\n", 4), STREAM))
    result = runner.invoke(app, ["exec", "isb1", "--", "echo hello; exit 4"])
    assert result.exit_code == 4, result.output
    assert result.stdout == "hello\n"

    (connect,) = server.requests_to("POST", "/v2/sandboxes/isb1/connect")
    assert connect.headers["x-api-key"] == API_KEY
    (start,) = server.requests_to("POST", "/process.Process/Start")
    assert start.headers["e2b-sandbox-id"] == "isb1"
    envelope = json.loads(start.body[5:])
    assert envelope["process"]["cmd"] == "/bin/bash"
    assert envelope["process"]["args"] == ["-l", "-c", "echo hello; exit 4"]


def test_exec_success_exits_zero(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/v2/sandboxes/isb1/connect", Reply(200, CONNECTED))
    server.route("POST", "/process.Process/Start", Reply(200, process_events(b"ok", 0), STREAM))
    result = runner.invoke(app, ["exec", "isb1", "true"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "ok"


def test_exec_on_an_unknown_sandbox_is_a_red_error(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/v2/sandboxes/gone/connect", Reply(404, {"code": 404, "message": "sandbox gone not found"}))
    result = runner.invoke(app, ["exec", "gone", "--", "true"])
    assert result.exit_code == 1
    assert "gone" in result.stderr
