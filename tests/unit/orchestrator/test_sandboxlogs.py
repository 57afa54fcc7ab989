"""The start-command log book and the agent log reader: lines split across chunks, bounded, pruned; the
agent's log read from its end without following a link."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from warren.orchestrator.sandboxlogs import MAX_LINE, MAX_LINES, SandboxLogs, agent_lines


def test_lines_split_across_chunks_and_streams() -> None:
    logs = SandboxLogs(clock=lambda: 5.0)
    logs.add("i1", "stdout", b"hel")
    logs.add("i1", "stderr", b"bad\n")
    logs.add("i1", "stdout", b"lo\nwor")
    assert [(ln.stream, ln.text, ln.level) for ln in logs.lines("i1")] == [("stderr", "bad", "error"),
                                                                        ("stdout", "hello", "info")]  # fmt: skip
    logs.flush("i1")
    assert logs.lines("i1")[-1].text == "wor"
    assert logs.lines("i2") == []


def test_bounded_and_pruned() -> None:
    logs = SandboxLogs()
    logs.add("i1", "stdout", b"x\n" * (MAX_LINES + 10) + b"y" * (3 * MAX_LINE))
    assert len(logs.lines("i1")) == MAX_LINES
    assert all(len(ln.text) <= MAX_LINE for ln in logs.lines("i1"))
    logs.add("i2", "stdout", b"kept\n")
    logs.prune(["i2"])
    assert logs.lines("i1") == [] and [ln.text for ln in logs.lines("i2")] == ["kept"]


async def test_followers_are_owned_and_flushed() -> None:
    logs = SandboxLogs()

    async def follower() -> None:
        logs.add("i1", "stdout", b"last words")
        raise OSError("the stream broke")

    task = logs.follow("i1", follower())
    await asyncio.gather(task, return_exceptions=True)
    assert [ln.text for ln in logs.lines("i1")] == ["last words"]
    forever = logs.follow("i1", asyncio.sleep(3600))
    await logs.aclose()
    assert forever.cancelled()


def test_agent_lines_tail_levels_and_no_symlink(tmp_path: Path) -> None:
    log = tmp_path / "runtime.log"
    log.write_text("first\n" + "warren-guest WARNING disk nearly full\n" + "warren-guest ERROR boom\n")
    lines = agent_lines(log)
    assert [(ln.level, ln.text) for ln in lines] == [
        ("info", "first"), ("warn", "warren-guest WARNING disk nearly full"), ("error", "warren-guest ERROR boom")
    ]
    assert lines[0].at == os.stat(log).st_mtime and lines[0].source == "agent"
    assert [ln.text for ln in agent_lines(log, max_bytes=30)] == ["warren-guest ERROR boom"]  # the cut line dropped
    link = tmp_path / "link.log"
    link.symlink_to(log)
    assert agent_lines(link) == []
    assert agent_lines(tmp_path / "missing.log") == []
