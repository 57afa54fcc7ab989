"""``warren pull``, ``warren build`` and ``warren templates ls|inspect|rm`` against a scripted server."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.cli.fake_server import FakeServer, Reply, Request
from warren.cli import output
from warren.cli.main import app
from warren.templates.dockerfile import translate

TEMPLATE = {"templateID": "t1", "names": ["web"], "buildStatus": "ready", "startCmd": "sleep 1"}


def _ndjson(*docs: dict[str, object]) -> bytes:
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


def test_pull_streams_progress_and_prints_the_template(server: FakeServer, runner: CliRunner) -> None:
    events = _ndjson(
        {"event": "resolved", "digest": "sha256:aa"},
        {"event": "download", "digest": "sha256:bb", "current": 0, "total": 10},
        {"event": "downloaded", "digest": "sha256:bb", "current": 10, "total": 10},
        {"event": "exists", "digest": "sha256:cc"},
        {"event": "template", "template": TEMPLATE},
    )
    server.route("POST", "/warren/images/pull", Reply(200, events, {"Content-Type": "application/x-ndjson"}))
    result = runner.invoke(app, ["pull", "debian:bookworm", "--name", "web"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == TEMPLATE
    assert server.requests[0].json() == {"image": "debian:bookworm", "name": "web"}


def test_pull_error_event_fails(server: FakeServer, runner: CliRunner) -> None:
    events = _ndjson({"event": "resolved", "digest": "sha256:aa"}, {"event": "error", "message": "image x not found"})
    server.route("POST", "/warren/images/pull", Reply(200, events))
    result = runner.invoke(app, ["pull", "x"])
    assert result.exit_code == 1 and "image x not found" in result.stderr


def test_pull_refused_before_streaming(server: FakeServer, runner: CliRunner) -> None:
    server.route("POST", "/warren/images/pull", Reply(409, {"code": 409, "message": "template 'x' exists already"}))
    result = runner.invoke(app, ["pull", "x"])
    assert result.exit_code == 1 and "exists already" in result.stderr


def test_build_makes_the_sdk_calls(server: FakeServer, runner: CliRunner, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "app.py").write_text("print(1)\n")
    (ctx / "Dockerfile").write_text("FROM base\nCOPY app.py /srv/app.py\nRUN echo hi\nCMD python3 /srv/app.py\n")
    files_hash = translate((ctx / "Dockerfile").read_text(), ctx).copies[0].files_hash
    uploads: list[bytes] = []

    def upload(req: Request) -> Reply:
        uploads.append(req.body)
        return Reply(201, {})

    statuses = itertools.chain(
        [
            {"status": "building", "logEntries": [{"message": "[1/5] USER root", "level": "info"}]},
            {"status": "ready", "logEntries": [{"message": "done", "level": "info"}]},
        ],
        itertools.repeat({"status": "ready", "logEntries": []}),
    )
    server.route("GET", "/templates/aliases/base", Reply(200, {"templateID": "tbase", "public": False}))
    server.route("POST", "/v3/templates", Reply(202, {"templateID": "t1", "buildID": "b1", "public": False,
                                                      "names": ["web"], "tags": [], "aliases": ["web"]}))  # fmt: skip
    server.route("GET", f"/templates/t1/files/{files_hash}",
                 Reply(201, {"present": False, "url": f"{server.url}/up", "headers": {"X-Up": "1"}}))  # fmt: skip
    server.route("PUT", "/up", upload)
    server.route("POST", "/v2/templates/t1/builds/b1", Reply(202, None))
    server.route("GET", "/templates/t1/builds/b1/status", lambda _: Reply(200, next(statuses)))
    server.route("GET", "/templates/t1", Reply(200, TEMPLATE))

    result = runner.invoke(app, ["build", "-f", str(ctx / "Dockerfile"), "--name", "web", "--cpu", "1", str(ctx)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == TEMPLATE
    assert server.requests_to("POST", "/v3/templates")[0].json() == {"name": "web", "cpuCount": 1}
    assert server.requests_to("PUT", "/up")[0].headers["x-up"] == "1"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(uploads[0]))) as tar:
        assert tar.getnames() == ["app.py"]
    body = server.requests_to("POST", "/v2/templates/t1/builds/b1")[0].json()
    assert body["fromTemplate"] == "base" and "fromImage" not in body  # FROM names a template of the server
    assert body["startCmd"] == "python3 /srv/app.py"
    assert [s["type"] for s in body["steps"]] == ["USER", "WORKDIR", "COPY", "RUN", "USER", "WORKDIR"]
    assert "[1/5] USER root" in result.stderr


def test_build_failure_shows_the_reason(server: FakeServer, runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM docker.io/library/debian\nRUN false\n")
    server.route("POST", "/v3/templates", Reply(202, {"templateID": "t1", "buildID": "b1", "public": False,
                                                      "names": ["x"], "tags": [], "aliases": ["x"]}))  # fmt: skip
    server.route("POST", "/v2/templates/t1/builds/b1", Reply(202, None))
    server.route("GET", "/templates/t1/builds/b1/status",
                 Reply(200, {"status": "error", "logEntries": [], "reason": {"message": "step 3 failed: exit 1"}}))
    result = runner.invoke(app, ["build", "--name", "x", str(tmp_path)])
    assert result.exit_code == 1 and "step 3 failed: exit 1" in result.stderr
    assert server.requests_to("POST", "/v2/templates/t1/builds/b1")[0].json()["fromImage"] == "docker.io/library/debian"


def test_templates_ls_inspect_rm(server: FakeServer, runner: CliRunner) -> None:
    server.route("GET", "/templates", Reply(200, [TEMPLATE]))
    server.route("GET", "/templates/web", Reply(200, TEMPLATE))
    server.route("DELETE", "/templates/web", Reply(204, None))
    server.route("DELETE", "/templates/busy", Reply(409, {"code": 409, "message": "used by a sandbox"}))
    assert json.loads(runner.invoke(app, ["templates", "ls"]).stdout) == [TEMPLATE]
    assert json.loads(runner.invoke(app, ["templates"]).stdout) == [TEMPLATE]
    assert json.loads(runner.invoke(app, ["templates", "inspect", "web"]).stdout) == TEMPLATE
    assert runner.invoke(app, ["templates", "rm", "web"]).exit_code == 0
    result = runner.invoke(app, ["templates", "rm", "busy", "web"])
    assert result.exit_code == 1 and "used by a sandbox" in result.stderr
    assert len(server.requests_to("DELETE", "/templates/web")) == 2  # a failure does not stop the others


def test_pull_on_a_terminal_draws_progress(
    server: FakeServer, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    events = _ndjson(
        {"event": "resolved", "digest": "sha256:aa"},
        {"event": "log", "message": "Resolved x"},
        {"event": "download", "digest": "sha256:bb", "current": 0, "total": 8 << 20},
        {"event": "progress", "digest": "sha256:bb", "current": 4 << 20, "total": 8 << 20},
        {"event": "downloaded", "digest": "sha256:bb", "current": 8 << 20, "total": 8 << 20},
        {"event": "unpacked", "digest": "sha256:dd"},
        {"event": "template", "template": TEMPLATE},
    )
    server.route("POST", "/warren/images/pull", Reply(200, events))
    result = runner.invoke(app, ["pull", "debian", "--name", "web"])
    assert result.exit_code == 0, result.output
    assert "Pulled debian as template web (t1)" in result.stdout
