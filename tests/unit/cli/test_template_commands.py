from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.cli.fake_server import FakeServer, Reply
from warren.cli import output
from warren.cli.main import app

TEMPLATE = {"templateID": "tbase", "names": ["base"], "buildStatus": "ready", "cpuCount": 2, "memoryMB": 512}


def test_templates_lists_as_json(server: FakeServer, runner: CliRunner) -> None:
    server.route("GET", "/templates", Reply(200, [TEMPLATE]))
    result = runner.invoke(app, ["templates"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [TEMPLATE]


def test_templates_table(server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    server.route("GET", "/templates", Reply(200, [TEMPLATE]))
    result = runner.invoke(app, ["templates"])
    assert "tbase" in result.stdout and "base" in result.stdout and "ready" in result.stdout


def test_template_import_posts_an_absolute_path(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    server.route("POST", "/warren/templates/import", Reply(201, {"templateID": "tmine", "name": "mine"}))
    result = runner.invoke(app, ["template", "import", "rootfs", "--name", "mine"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"templateID": "tmine", "name": "mine"}
    assert server.requests[0].json() == {"path": str(tmp_path / "rootfs"), "name": "mine"}


def test_template_import_passes_the_runtime(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/warren/templates/import", Reply(201, {"templateID": "t"}))
    result = runner.invoke(app, ["template", "import", "/srv/r", "--name", "g", "--runtime", "gvisor"])
    assert result.exit_code == 0, result.output
    assert server.requests[0].json() == {"path": "/srv/r", "name": "g", "runtime": "gvisor"}


def test_template_import_conflict_is_an_error(server: FakeServer, runner: CliRunner) -> None:
    server.route(
        "POST",
        "/warren/templates/import",
        Reply(409, {"code": 409, "message": "template 'mine' exists already"}),
    )
    result = runner.invoke(app, ["template", "import", "/srv/r", "--name", "mine"])
    assert result.exit_code == 1
    assert "exists already" in result.stderr
