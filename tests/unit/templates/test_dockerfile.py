"""Dockerfile -> template build request, through the SDK's own converter."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b.template.utils import calculate_files_hash

from warren.errors import InvalidRequestError
from warren.templates.dockerfile import context_tar, translate
from warren.templates.steps import files_hash_of_tar, parse_build_request


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("six\n")
    (tmp_path / "secret.env").write_text("X=1\n")
    (tmp_path / ".dockerignore").write_text("secret.env\n")
    return tmp_path


def _types(steps: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(s["type"], s["args"]) for s in steps]


def test_translates_every_supported_instruction(ctx: Path) -> None:
    plan = translate(
        "FROM python:3.12-slim\n"
        "ARG VERSION=1\n"
        "ENV APP_HOME=/srv/app PATH=/opt/bin:$PATH\n"
        "RUN pip install -r requirements.txt \\\n    && echo ok\n"
        "WORKDIR $APP_HOME\n"
        "COPY requirements.txt .\n"
        "COPY --chown=app:app --chmod=0755 app/ ./app/\n"
        "USER app\n"
        "EXPOSE 8000\n"
        'ENTRYPOINT ["python"]\n'
        'CMD ["-m", "http.server", "8000"]\n',
        ctx,
    )
    assert plan.base_image == "python:3.12-slim"
    steps = _types(plan.steps)
    assert steps[0] == ("USER", ["root"]) and steps[1] == ("WORKDIR", ["/"])  # Docker's defaults first
    assert ("ENV", ["VERSION", "1"]) in steps
    assert ("ENV", ["APP_HOME", "/srv/app", "PATH", "/opt/bin:$PATH"]) in steps
    assert ("RUN", ["pip install -r requirements.txt     && echo ok"]) in steps
    assert ("WORKDIR", ["$APP_HOME"]) in steps
    assert ("COPY", ["requirements.txt", ".", "", ""]) in steps
    assert ("COPY", ["app/", "./app/", "app:app", "0755"]) in steps
    assert ("USER", ["app"]) in steps and ("USER", ["user"]) not in steps  # USER given: no E2B default
    assert plan.start_cmd == "python -m http.server 8000"
    copies = {c.src: c for c in plan.copies}
    assert copies["app/"].files_hash == calculate_files_hash("app/", "./app/", str(ctx), ["secret.env"], False, None)
    body = plan.request()
    assert body["fromImage"] == "python:3.12-slim" and body["startCmd"] == "python -m http.server 8000"
    assert "readyCmd" not in body
    parsed = parse_build_request(body)  # the server accepts what the CLI sends
    assert len(parsed.steps) == len(plan.steps)


def test_e2b_defaults_when_user_and_workdir_are_not_set(ctx: Path) -> None:
    plan = translate("FROM debian\nRUN true\nCMD sleep infinity\n", ctx)
    assert _types(plan.steps)[-2:] == [("USER", ["user"]), ("WORKDIR", ["/home/user"])]
    assert plan.start_cmd == "sleep infinity"
    assert plan.request(from_template="base", force=True) == {
        "steps": plan.steps, "force": True, "fromTemplate": "base", "startCmd": "sleep infinity",
    }  # fmt: skip


def test_unsupported_input_is_a_clear_error(ctx: Path) -> None:
    with pytest.raises(InvalidRequestError, match="Multi-stage"):
        translate("FROM a AS build\nRUN x\nFROM b\nCOPY --from=build /x /x\n", ctx)
    with pytest.raises(InvalidRequestError, match="FROM"):
        translate("RUN echo no base\n", ctx)
    with pytest.raises(InvalidRequestError, match="No files found"):
        translate("FROM a\nCOPY missing.txt /x\n", ctx)
    with pytest.raises(InvalidRequestError, match="inside the build context"):
        translate("FROM a\nCOPY ../outside /x\n", ctx)


def test_warnings_are_collected_not_printed(ctx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = translate("FROM a\nHEALTHCHECK CMD true\nRUN --mount=type=cache,target=/c true\n", ctx)
    assert capsys.readouterr().out == ""
    assert any("HEALTHCHECK" in w for w in plan.warnings) and any("mount" in w for w in plan.warnings)


def test_context_tar_verifies_against_the_hash(ctx: Path) -> None:
    plan = translate("FROM a\nCOPY app /srv/app\nCOPY *.txt /srv/\n", ctx)
    for copy in plan.copies:
        with context_tar(copy, ctx) as tar:
            assert files_hash_of_tar(tar, copy.src, copy.dest) == copy.files_hash
