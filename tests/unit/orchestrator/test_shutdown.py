"""Graceful shutdown pauses all running sandboxes concurrently (fake slow runtime, fake loop clock)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, SlowPauseRuntime
from warren.config import Settings
from warren.errors import UnavailableError
from warren.orchestrator import CreateRequest, SandboxManager, SandboxState
from warren.orchestrator.shutdown import preserve_all
from warren.runtime.base import Resources, RuntimeKind, SandboxSpec
from warren.store import Database, SandboxRecord, SandboxRepo, TemplateRecord, TemplateRepo

PAUSE_S = 10.0


async def _manager(tmp_path: Path, runtime: SlowPauseRuntime, n: int) -> tuple[SandboxManager, Database]:
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(
        TemplateRecord("t1", "base", "runc", ("/x",), {}, None, None, None, None, 1, 256, 1024, 0.0)
    )
    for i in range(n):
        sid = f"s{i}"
        await SandboxRepo(db).put(
            SandboxRecord(
                sid, "t1", "base", "runc", "running", {}, {}, 0.0, 1e12, 1, 256, 1024, None, "127.0.0.1", True
            )
        )
        runtime.running[sid] = SandboxSpec(sid, RuntimeKind.RUNC, (), Resources())
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
    )
    await manager.recover()
    assert len(manager.running_ids()) == n
    return manager, db


@pytest.mark.looptime
async def test_shutdown_pauses_concurrently_within_two_pause_durations(tmp_path: Path) -> None:
    runtime = SlowPauseRuntime(RuntimeKind.RUNC, FakeAgent(), PAUSE_S)
    manager, db = await _manager(tmp_path, runtime, 4)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    report = await preserve_all(manager, concurrency=8)
    elapsed = loop.time() - t0
    assert elapsed < 2 * PAUSE_S
    assert sorted(report.paused) == ["s0", "s1", "s2", "s3"] and not report.failed
    assert all(manager.get(f"s{i}").state == SandboxState.PAUSED for i in range(4))
    assert runtime.max_in_flight == 4
    db.close()


@pytest.mark.looptime
async def test_sequential_shutdown_would_take_n_pause_durations(tmp_path: Path) -> None:
    """The control: concurrency 1 is the sequential implementation, and it takes 4 pause durations."""
    runtime = SlowPauseRuntime(RuntimeKind.RUNC, FakeAgent(), PAUSE_S)
    manager, db = await _manager(tmp_path, runtime, 4)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await preserve_all(manager, concurrency=1)
    assert loop.time() - t0 >= 4 * PAUSE_S
    db.close()


@pytest.mark.looptime
async def test_failures_are_retried_and_new_work_refused(tmp_path: Path) -> None:
    runtime = SlowPauseRuntime(RuntimeKind.RUNC, FakeAgent(), PAUSE_S, fail_first=2)
    manager, db = await _manager(tmp_path, runtime, 3)
    report = await preserve_all(manager, concurrency=2)
    assert sorted(report.paused) == ["s0", "s1", "s2"] and report.passes == 2 and not report.failed
    with pytest.raises(UnavailableError):
        await manager.create(CreateRequest(template="base"))
    db.close()
