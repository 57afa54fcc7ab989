"""run_command: output, errors with stderr, deadlines, and cancellation that always reaps."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.framework.runtime import pid_alive, poll_until, read_pid
from warren.errors import RuntimeFailure
from warren.runtime.oci.command import RuntimeCommandError, run_command


async def test_output_and_stdin() -> None:
    result = await run_command(["cat"], stdin=b"hello", timeout=10)
    assert result.stdout == b"hello"
    assert result.returncode == 0
    assert result.duration >= 0


async def test_failure_carries_stderr_and_status() -> None:
    with pytest.raises(RuntimeCommandError) as err:
        await run_command(["sh", "-c", "echo boom >&2; exit 3"], timeout=10)
    assert isinstance(err.value, RuntimeFailure)
    assert err.value.returncode == 3
    assert err.value.stderr == "boom"
    assert "boom" in str(err.value) and "exit status 3" in str(err.value)


async def test_check_false_returns_the_status() -> None:
    result = await run_command(["sh", "-c", "exit 4"], timeout=10, check=False)
    assert result.returncode == 4


async def test_missing_binary() -> None:
    with pytest.raises(RuntimeCommandError, match="cannot execute"):
        await run_command(["/nonexistent/tool"], timeout=10)


async def test_output_file_collects_both_streams(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("older run\n")
    with pytest.raises(RuntimeCommandError) as err:
        await run_command(["sh", "-c", "echo out; echo err >&2; exit 1"], timeout=10, output=log)
    assert err.value.stderr == "out\nerr"  # only this run's part
    assert log.read_text() == "older run\nout\nerr\n"


async def test_output_file_does_not_wait_for_a_detached_child(tmp_path: Path) -> None:
    """Like `runc run -d`: the tool exits while a child keeps its stdio open."""
    result = await run_command(["sh", "-c", "sleep 30 & echo $!"], timeout=5, output=tmp_path / "log")
    assert result.returncode == 0
    child = int((tmp_path / "log").read_text())
    os.kill(child, 9)


async def test_timeout_terminates_and_reaps(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(RuntimeCommandError, match="timed out"):
        await run_command(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"], timeout=0.5)
    pid = read_pid(pid_file)
    assert pid is not None and not pid_alive(pid)


async def test_cancellation_escalates_to_sigkill_and_reaps(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    task = asyncio.create_task(run_command([sys.executable, "-c", script], timeout=60, grace=0.3))
    async with asyncio.timeout(10):
        await poll_until(lambda: read_pid(pid_file) is not None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = read_pid(pid_file)
    assert pid is not None and not pid_alive(pid)


async def test_long_failure_output_keeps_the_reason_line() -> None:
    script = "{ printf 'x%.0s' $(seq 6000); echo ': save rejected: connected state'; seq 2000; } >&2; exit 1"
    with pytest.raises(RuntimeCommandError) as err:
        await run_command(["sh", "-c", script], timeout=10)
    assert len(err.value.stderr) < 5000
    assert "save rejected: connected state" in err.value.stderr
    assert err.value.stderr.endswith("2000")
