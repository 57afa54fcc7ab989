"""The code-interpreter template's host side: its build request, the wheel download, the setup cache, and
a create that outlasts the build's wait (the in-sandbox server is covered end to end by
tests/e2e/test_code_interpreter.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from warren.errors import UnavailableError
from warren.store import TemplateRecord
from warren.templates.codeinterp import cache, recipe, wheels
from warren.templates.codeinterp.provision import Job, Provisioner
from warren.templates.steps import StepType, files_hash_of_tar


def _fake_download(dest: Path, packages: Any, say: Any) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / "pip-99.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    return [wheel]


def test_the_build_request_copies_the_files_and_installs_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheels, "download", _fake_download)
    plan = recipe.plan(tmp_path, lambda _line: None)
    copy, run, env = plan.request.steps
    assert (copy.type, copy.args[:2], copy.files_hash) == (StepType.COPY, ("warren-ci", "/opt/warren-ci/"),
                                                           plan.files_hash)  # fmt: skip
    with plan.files_tar.open("rb") as fh:
        assert files_hash_of_tar(fh, "warren-ci", "/opt/warren-ci/") == plan.files_hash
    assert run.type is StepType.RUN and run.args[1] == "root"
    assert "ci_bootstrap.py /opt/warren-ci/venv /opt/warren-ci/wheels" in run.args[0]
    assert all(p in run.args[0] for p in recipe.PACKAGES)
    assert env.args == ("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    assert plan.request.from_template == "base"
    assert plan.request.start_cmd == recipe.START_CMD and "49999/health" in (plan.request.ready_cmd or "")


def test_wheels_are_binary_for_the_base_python() -> None:
    argv = wheels.download_argv(Path("/w"), ["numpy"])
    assert argv[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in argv and argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[-2:] == ["pip", "numpy"]


def _base(cache_dir: Path, built_at: str = "2026-01-01T00:00:00Z") -> None:
    base = cache_dir / "templates" / "base"
    (base / "rootfs").mkdir(parents=True, exist_ok=True)
    (base / "template.json").write_text(json.dumps({"name": "base", "built_at": built_at, "source": "x"}))


def test_the_cache_holds_a_layer_only_for_the_current_recipe_files_and_base(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    _base(cache_dir)
    layer = tmp_path / "layer"
    (layer / "opt" / "warren-ci").mkdir(parents=True)
    (layer / "opt" / "warren-ci" / "ci_server.py").write_text("server")
    assert cache.load(cache_dir) is None
    cache.store(cache_dir, layer, {"env": {"A": "b"}, "workdir": "/home/user", "user": "user", "built_at": "t"})
    found = cache.load(cache_dir)
    assert found is not None and found.env == {"A": "b"} and found.user == "user"
    assert (found.layer / "opt/warren-ci/ci_server.py").read_text() == "server"

    imported = cache.import_layer(found, tmp_path / "state")
    assert imported.parent == tmp_path / "state" / "layers"
    assert (imported / "opt/warren-ci/ci_server.py").read_text() == "server"

    meta = cache.entry_dir(cache_dir) / "template.json"
    raw = json.loads(meta.read_text())
    meta.write_text(json.dumps({**raw, "digest": "0" * 64}))  # built from other sandbox files
    assert cache.load(cache_dir) is None
    meta.write_text(json.dumps(raw))
    _base(cache_dir, built_at="2026-02-02T00:00:00Z")  # base rebuilt since
    assert cache.load(cache_dir) is None


class _NoTemplates:
    async def find(self, _name: str) -> TemplateRecord | None:
        return None


def test_a_create_that_outlasts_the_build_gets_503_and_the_build_goes_on(tmp_path: Path) -> None:
    asyncio.run(_outlasting(tmp_path))


async def _outlasting(tmp_path: Path) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    class SlowProvisioner(Provisioner):
        async def _make(self, job: Job) -> TemplateRecord:
            self._say(job, "downloading wheels")
            started.set()
            await release.wait()
            raise UnavailableError("stopped by the test")

    prov = SlowProvisioner(builds=None, templates=_NoTemplates(),  # type: ignore[arg-type]
                           cache_dir=tmp_path, state_dir=tmp_path)
    with pytest.raises(UnavailableError, match=r"is being built on this node .* last: downloading wheels"):
        await prov.ready(recipe.NAME, 0.05)
    assert started.is_set()
    job = prov.job(recipe.NAME)  # the same job, still running
    assert job.task is not None and not job.task.done()
    release.set()
    with pytest.raises(UnavailableError, match="stopped by the test"):
        await prov.ready(recipe.NAME, 5)
    await prov.aclose()
    assert not Provisioner.handles("base") and Provisioner.handles(recipe.GVISOR_NAME)
