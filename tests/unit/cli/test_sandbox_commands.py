from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.unit.cli.conftest import API_KEY
from tests.unit.cli.fake_server import FakeServer, Reply, Request
from warren.cli import output, session
from warren.cli.main import app

LISTED = {
    "sandboxID": "isb1",
    "templateID": "base",
    "clientID": "warren",
    "startedAt": "2026-01-01T00:00:00Z",
    "endAt": "2026-01-01T00:05:00Z",
    "cpuCount": 2,
    "memoryMB": 512,
    "diskSizeMB": 2048,
    "state": "running",
    "envdVersion": "0.6.13",
}
CREATED = {"sandboxID": "isb9", "templateID": "base", "clientID": "warren", "envdVersion": "0.6.13"}


def test_ls_prints_json_when_piped(server: FakeServer, runner: CliRunner) -> None:
    server.route("GET", "/v2/sandboxes", Reply(200, [LISTED]))
    result = runner.invoke(app, ["ls"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [LISTED]
    (request,) = server.requests
    assert request.headers["x-api-key"] == API_KEY


def test_ls_prints_a_table_on_a_terminal(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("GET", "/v2/sandboxes", Reply(200, [LISTED]))
    result = runner.invoke(app, ["ls"])
    assert result.exit_code == 0, result.output
    assert "SANDBOX ID" in result.stdout
    assert "isb1" in result.stdout and "running" in result.stdout


def test_ls_json_flag_wins_on_a_terminal(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("GET", "/v2/sandboxes", Reply(200, []))
    result = runner.invoke(app, ["ls", "--json"])
    assert json.loads(result.stdout) == []


def test_ls_follows_next_tokens(server: FakeServer, runner: CliRunner) -> None:
    second = {**LISTED, "sandboxID": "isb2"}

    def pages(request: Request) -> Reply:
        if request.query.get("nextToken") == ["t1"]:
            return Reply(200, [second])
        return Reply(200, [LISTED], {"x-next-token": "t1"})

    server.route("GET", "/v2/sandboxes", pages)
    result = runner.invoke(app, ["ls"])
    assert [s["sandboxID"] for s in json.loads(result.stdout)] == ["isb1", "isb2"]


def test_flags_override_the_environment(server: FakeServer, runner: CliRunner) -> None:
    server.route("GET", "/v2/sandboxes", Reply(200, []))
    result = runner.invoke(app, ["ls", "--url", server.url + "/", "--api-key", "flag-key"])
    assert result.exit_code == 0, result.output
    assert server.requests[0].headers["x-api-key"] == "flag-key"


def test_server_errors_are_red_lines_with_a_nonzero_exit(server: FakeServer, runner: CliRunner) -> None:
    server.route("GET", "/v2/sandboxes", Reply(401, {"code": 401, "message": "invalid API key"}))
    result = runner.invoke(app, ["ls"])
    assert result.exit_code == 1
    assert "invalid API key" in result.stderr
    assert result.stdout == ""


def test_unreachable_server_is_reported(clean_env: Path, runner: CliRunner) -> None:
    result = runner.invoke(app, ["ls", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach the warren server" in result.stderr


def test_start_detached_posts_the_create_request(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/v2/sandboxes", Reply(201, CREATED))
    result = runner.invoke(app, ["start", "base", "--detach", "--timeout", "120", "--runtime", "gvisor"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == CREATED
    (request,) = server.requests_to("POST", "/v2/sandboxes")
    assert request.json() == {
        "templateID": "base",
        "timeout": 120,
        "runtime": "gvisor",
        "metadata": {},
        "envVars": {},
    }


def test_start_rejects_an_unknown_runtime(server: FakeServer, runner: CliRunner) -> None:
    result = runner.invoke(app, ["start", "base", "--detach", "--runtime", "kvm"])
    assert result.exit_code != 0
    assert server.requests == []


def test_start_without_a_terminal_refuses_before_creating(server: FakeServer, runner: CliRunner) -> None:
    result = runner.invoke(app, ["start", "base"])
    assert result.exit_code == 1
    assert "--detach" in result.stderr
    assert server.requests == []


def test_start_attaches_a_shell_and_removes_with_rm(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.route("POST", "/v2/sandboxes", Reply(201, CREATED))
    server.route("DELETE", "/sandboxes/isb9", Reply(204))
    attached: list[Any] = []
    monkeypatch.setattr(output, "stdin_is_tty", lambda: True)
    monkeypatch.setattr(session, "connect_sandbox", lambda cfg, sid: (cfg, sid))

    def attach_shell(sandbox: Any, user: str | None) -> int:
        attached.append(sandbox)
        return 7

    monkeypatch.setattr(session, "attach_shell", attach_shell)
    result = runner.invoke(app, ["start", "base", "--rm"])
    assert result.exit_code == 7, result.output
    ((cfg, sandbox_id),) = attached
    assert (cfg.url, cfg.api_key, sandbox_id) == (server.url, API_KEY, "isb9")
    assert len(server.requests_to("DELETE", "/sandboxes/isb9")) == 1


def test_rm_deletes_each_sandbox(server: FakeServer, runner: CliRunner) -> None:
    server.route("DELETE", "/sandboxes/a", Reply(204))
    server.route("DELETE", "/sandboxes/b", Reply(204))
    result = runner.invoke(app, ["rm", "a", "b"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"sandboxID": "a", "removed": True},
        {"sandboxID": "b", "removed": True},
    ]


def test_rm_of_an_unknown_sandbox_fails(server: FakeServer, runner: CliRunner) -> None:
    server.route("DELETE", "/sandboxes/nope", Reply(404, {"code": 404, "message": "sandbox nope not found"}))
    result = runner.invoke(app, ["rm", "nope"])
    assert result.exit_code == 1
    assert "sandbox nope not found" in result.stderr


def test_timeout_posts_seconds(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/sandboxes/isb1/timeout", Reply(204))
    result = runner.invoke(app, ["timeout", "isb1", "600"])
    assert result.exit_code == 0, result.output
    assert server.requests[0].json() == {"timeout": 600}


class _FakeCommands:
    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run(self, cmd: str, **kwargs: Any) -> Any:
        from e2b.sandbox.commands.command_handle import CommandExitException, CommandResult

        self.calls.append((cmd, kwargs))
        kwargs["on_stdout"]("out\n")
        kwargs["on_stderr"]("err\n")
        if self.exit_code:
            raise CommandExitException(stdout=None, stderr=None, exit_code=self.exit_code, error=None)
        return CommandResult(stdout=None, stderr=None, exit_code=0, error=None)


class _FakeSandbox:
    def __init__(self, exit_code: int) -> None:
        self.commands = _FakeCommands(exit_code)


@pytest.mark.parametrize(
    ("argv", "expected_cmd"),
    [
        (["--", "echo $HOME"], "echo $HOME"),
        (["--", "ls", "-la", "a b"], "ls -la 'a b'"),
        (["ls", "-la"], "ls -la"),
    ],
)
def test_exec_runs_the_command_line(
    server: FakeServer,
    runner: CliRunner,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    expected_cmd: str,
) -> None:
    fake = _FakeSandbox(0)
    monkeypatch.setattr(session, "connect_sandbox", lambda cfg, sid: fake)
    result = runner.invoke(app, ["exec", "isb1", *argv])
    assert result.exit_code == 0, result.output
    ((cmd, kwargs),) = fake.commands.calls
    assert cmd == expected_cmd
    assert kwargs["timeout"] == 0
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"


def test_exec_passes_the_exit_code_through(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "connect_sandbox", lambda cfg, sid: _FakeSandbox(3))
    result = runner.invoke(app, ["exec", "--user", "root", "isb1", "--", "false"])
    assert result.exit_code == 3


def test_shell_needs_a_terminal(server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "connect_sandbox", lambda cfg, sid: object())
    result = runner.invoke(app, ["shell", "isb1"])
    assert result.exit_code == 1
    assert "terminal" in result.stderr


def test_terminal_messages_escape_ids(server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("DELETE", "/sandboxes/%5Bred%5Dx", Reply(204))  # ids are percent-quoted
    result = runner.invoke(app, ["rm", "[red]x"])
    assert result.exit_code == 0, result.output
    assert "Removed sandbox [red]x." in result.stdout
