"""The step runner (``warren.templates.runner.StepRunner``) at its agent seam.

The guest agent is ``ScriptedAgent`` (a real one needs a running build sandbox): it records each call
and answers from a script; helper calls (the agent bundle's Python) answer the helper's JSON line.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest

from warren.guestclient import AgentError, OutputCallback, ProcessResult
from warren.templates.buildlog import BuildLog
from warren.templates.model import BuildFailed
from warren.templates.runner import HELPER_ARGV, LineLogger, StepRunner
from warren.templates.steps import Metadata, Step, StepType
from warren.templates.uploads import UploadStore


class ScriptedAgent:
    def __init__(self, *, helper: Mapping[str, object] | None = None, result: ProcessResult | None = None,
                 output: Sequence[tuple[str, bytes]] = (), fail: bool = False) -> None:  # fmt: skip
        self.helper = dict(helper or {})
        self.result = result or ProcessResult(pid=1, exit_code=0, stdout=b"", stderr=b"")
        self.output = output
        self.fail = fail
        self.calls: list[dict[str, object]] = []

    async def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> ProcessResult:
        self.calls.append({"argv": list(argv), "user": user, "cwd": cwd, "envs": dict(envs or {})})
        if self.fail:
            raise AgentError("connection reset")
        if tuple(argv[: len(HELPER_ARGV)]) == HELPER_ARGV:
            return ProcessResult(pid=2, exit_code=0, stdout=json.dumps(self.helper).encode() + b"\n", stderr=b"")
        for stream, data in self.output:
            assert on_output is not None
            on_output(stream, data)
        return self.result

    async def write_file(self, path: str, data: bytes | AsyncIterator[bytes], *, user: str = "root") -> None:
        self.calls.append({"write": path})


def _runner(agent: ScriptedAgent, tmp_path: Path) -> tuple[StepRunner, BuildLog]:
    log = BuildLog()
    return StepRunner(agent, log, UploadStore(tmp_path / "uploads"), step_timeout_s=60.0), log


META = Metadata(env={"A": "1"}, workdir="/home/user", user="user")


async def test_prepare_finds_bash_and_makes_the_default_user(tmp_path: Path) -> None:
    agent = ScriptedAgent(helper={"bash": True, "created": True})
    runner, log = _runner(agent, tmp_path)
    assert await runner.prepare(provision=True) == "/bin/bash"
    ops = [c["argv"][len(HELPER_ARGV) + 1] for c in agent.calls]  # type: ignore[index]
    assert ops == ["prepare", "ensure_user"]
    assert any("Created the default user" in e.message for e in log.entries)


async def test_a_run_step_logs_its_output_lines_under_its_step(tmp_path: Path) -> None:
    agent = ScriptedAgent(output=[("stdout", b"one\ntw"), ("stdout", b"o\n"), ("stderr", b"warn")])
    runner, log = _runner(agent, tmp_path)
    await runner.run(Step(0, StepType.RUN, ("echo hi",)), META, "/bin/bash")
    assert agent.calls[0] == {"argv": ["/bin/bash", "-l", "-c", "echo hi"], "user": "user", "cwd": "/home/user",
                              "envs": {"A": "1"}}  # fmt: skip
    assert [(e.message, e.level, e.step) for e in log.entries] == [
        ("one", "info", "1"), ("two", "info", "1"), ("warn", "error", "1")]  # fmt: skip


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (ProcessResult(pid=1, exit_code=3, stdout=b"", stderr=b""), "failed: exit code 3"),
        (ProcessResult(pid=1, exit_code=-1, stdout=b"", stderr=b"", timed_out=True), "was killed after 60s"),
    ],
)
async def test_a_failing_run_step_fails_the_build_at_its_step(
    tmp_path: Path, result: ProcessResult, message: str
) -> None:
    runner, _ = _runner(ScriptedAgent(result=result), tmp_path)
    with pytest.raises(BuildFailed, match=message) as failed:
        await runner.run(Step(2, StepType.RUN, ("false", "root")), META, "/bin/sh")
    assert failed.value.step == "3"


async def test_an_agent_error_fails_the_step(tmp_path: Path) -> None:
    runner, _ = _runner(ScriptedAgent(fail=True), tmp_path)
    with pytest.raises(BuildFailed, match="could not run: connection reset"):
        await runner.run(Step(0, StepType.RUN, ("true",)), META, "/bin/sh")


async def test_a_copy_without_its_upload_fails_before_touching_the_sandbox(tmp_path: Path) -> None:
    agent = ScriptedAgent()
    runner, _ = _runner(agent, tmp_path)
    with pytest.raises(BuildFailed, match="never uploaded"):
        await runner.run(Step(0, StepType.COPY, ("app", "/app"), files_hash="a" * 64), META, "/bin/sh")
    assert agent.calls == []


async def test_workdir_and_user_steps_use_the_helper(tmp_path: Path) -> None:
    agent = ScriptedAgent(helper={"created": True, "uid": 1001})
    runner, log = _runner(agent, tmp_path)
    await runner.run(Step(0, StepType.WORKDIR, ("app",)), META, "/bin/sh")
    await runner.run(Step(1, StepType.USER, ("svc",)), META, "/bin/sh")
    args = [json.loads(c["argv"][-1]) for c in agent.calls]  # type: ignore[index]
    assert args == [{"path": "/home/user/app", "owner": "user"}, {"name": "svc"}]
    assert log.entries[-1].message == "Created user 'svc' (uid 1001)"


def test_line_logger_cuts_very_long_partial_lines() -> None:
    lines: list[tuple[str, str]] = []
    logger = LineLogger(lambda text, stream: lines.append((text, stream)))
    logger.feed("stdout", b"x" * 9000)
    logger.feed("stdout", b"tail")
    logger.flush()
    assert [len(t) for t, _ in lines] == [9000, 4]
