"""Signals only reach the process first seen: real short-lived processes, and a fake /proc that mirrors
one of them to simulate a reused pid or a process that left its cgroup between SIGTERM and SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Callable
from dataclasses import replace

from tests.unit.runtime_reaper.conftest import FakeProc
from warren.runtime.processes import ProcessIdentity, read_identity, signal_if_same, terminate_group

Spawn = Callable[..., subprocess.Popen[bytes]]


def _identity(proc: subprocess.Popen[bytes]) -> ProcessIdentity:
    identity = read_identity(proc.pid)
    assert identity is not None
    return identity


def _exited(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_signal_reaches_the_same_process(spawn: Spawn) -> None:
    proc = spawn()
    assert signal_if_same(_identity(proc), signal.SIGTERM)
    assert _exited(proc) and proc.returncode == -signal.SIGTERM


def test_reused_pid_is_never_signalled(spawn: Spawn) -> None:
    proc = spawn()
    recorded = replace(_identity(proc), start_time=_identity(proc).start_time - 1)  # "an earlier process"
    assert not signal_if_same(recorded, signal.SIGKILL)
    assert not _exited(proc, 0.3)


def test_process_outside_the_recorded_cgroup_is_never_signalled(spawn: Spawn) -> None:
    proc = spawn()
    elsewhere = replace(_identity(proc), cgroup="/warren/some-orphan")
    assert not signal_if_same(elsewhere, signal.SIGKILL)
    assert not _exited(proc, 0.3)


def test_exited_process_is_not_signalled(spawn: Spawn) -> None:
    proc = spawn()
    identity = _identity(proc)
    proc.kill()
    proc.wait()
    assert not signal_if_same(identity, signal.SIGKILL)


async def test_terminate_group_escalates_only_when_needed(spawn: Spawn) -> None:
    polite, stubborn = spawn(), spawn(ignore_term=True)
    result = await terminate_group([_identity(polite), _identity(stubborn)], grace_s=0.5)
    assert [i.pid for i in result.terminated] == [polite.pid]
    assert [i.pid for i in result.killed] == [stubborn.pid]
    assert not result.spared and not result.survivors
    assert _exited(polite) and polite.returncode == -signal.SIGTERM
    assert _exited(stubborn) and stubborn.returncode == -signal.SIGKILL


async def test_terminate_group_spares_a_stale_identity(spawn: Spawn) -> None:
    proc = spawn()
    stale = replace(_identity(proc), start_time=_identity(proc).start_time + 1)
    result = await terminate_group([stale], grace_s=0.2)
    assert result.spared == (stale,) and not result.killed
    assert not _exited(proc, 0.3)


async def _escalation_with_change(spawn: Spawn, fake_proc: FakeProc, change: Callable[[int], None]) -> None:
    """A SIGTERM-ignoring process whose identity changes during the grace period: no SIGKILL."""
    proc = spawn(ignore_term=True)
    fake_proc.mirror(proc.pid, ["/warren/orphan", "/"])
    identity = read_identity(proc.pid, "/warren/orphan", proc=fake_proc.root)
    assert identity is not None
    task = asyncio.create_task(terminate_group([identity], grace_s=1.0, proc=fake_proc.root))
    await asyncio.sleep(0.3)  # SIGTERM was sent (and ignored)
    change(proc.pid)
    result = await task
    assert result.spared == (identity,) and not result.killed and not result.terminated
    assert not _exited(proc, 0.3)  # never got SIGKILL


async def test_left_the_cgroup_before_escalation_is_spared(spawn: Spawn, fake_proc: FakeProc) -> None:
    await _escalation_with_change(spawn, fake_proc, lambda pid: fake_proc.set_cgroups(pid, ["/user.slice", "/"]))


async def test_reused_pid_before_escalation_is_spared(spawn: Spawn, fake_proc: FakeProc) -> None:
    await _escalation_with_change(spawn, fake_proc, lambda pid: fake_proc.set_start_time(pid, 1))


async def test_terminate_group_of_nothing() -> None:
    result = await terminate_group([], grace_s=5.0)
    assert result == type(result)((), (), (), ())
