"""Prewarmer: once per hash, bounded retries with backoff, abandoned attempts, shared on-demand staging."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from warren.errors import HostError
from warren.runtime.index import RuntimeIndex, RuntimeMissError, register_configs
from warren.runtime.prewarm import Prewarmer, StagingTimeout
from warren.runtime.records import InvalidRuntimeRecord, RuntimeConfig, RuntimeRecord

from .helpers import record, until


class FakeSleep:
    """Records backoff delays; returns at once unless ``hold`` is set."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.hold = False

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.hold:
            await asyncio.Event().wait()
        await asyncio.sleep(0)


class Stage:
    """A scripted ``stage``: each call pops an outcome (None = success, an exception, or 'block')."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[str] = []
        self.cancelled = 0
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, rec: RuntimeRecord) -> None:
        self.calls.append(rec.hash())
        outcome = self.outcomes.pop(0) if self.outcomes else None
        self.entered.set()
        if outcome == "block":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        elif isinstance(outcome, BaseException):
            raise outcome


async def _index(tmp_path: Path, *records: RuntimeRecord) -> RuntimeIndex:
    index = RuntimeIndex(tmp_path / "index.json")
    index.load()
    for rec in records:
        await index.register(rec)
    return index


@asynccontextmanager
async def running(prewarmer: Prewarmer) -> AsyncIterator[None]:
    async with asyncio.TaskGroup() as group:
        task = group.create_task(prewarmer.run())
        try:
            yield
        finally:
            task.cancel()


def _configs(*defaults: RuntimeRecord) -> list[RuntimeConfig]:
    return [RuntimeConfig(f"c{i}", "1", rec, default=True) for i, rec in enumerate(defaults)]


async def test_once_per_hash_across_repeated_config_reloads(tmp_path: Path) -> None:
    gv, rc, old = record("gv"), record("rc", sandbox_class="runc"), record("old")
    index = await _index(tmp_path)
    configs = [*_configs(gv, rc), RuntimeConfig("gv", "0", old, default=False)]
    await register_configs(index, configs)
    stage = Stage("block")
    prewarmer = Prewarmer(index, stage, sleep=FakeSleep())
    async with running(prewarmer):
        prewarmer.on_config(configs)
        await stage.entered.wait()
        prewarmer.on_config(configs)  # one in flight, one pending: both no-ops
        assert {prewarmer.state(gv.hash()), prewarmer.state(rc.hash())} == {"prewarming", "pending"}
        stage.release.set()
        await until(lambda: prewarmer.state(gv.hash()) == prewarmer.state(rc.hash()) == "ready")
        prewarmer.on_config(configs)  # ready: no-op
        for _ in range(100):
            await asyncio.sleep(0)
    assert sorted(stage.calls) == sorted([gv.hash(), rc.hash()])
    assert prewarmer.state(old.hash()) is None  # only defaults are prewarmed


async def test_on_config_refuses_invalid_configs(tmp_path: Path) -> None:
    prewarmer = Prewarmer(await _index(tmp_path), Stage())
    with pytest.raises(InvalidRuntimeRecord, match="2 default runtimes"):
        prewarmer.on_config(_configs(record("a"), record("b")))


async def test_retries_with_backoff_until_the_cap_then_forgets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rec = record("a")
    index = await _index(tmp_path, rec)
    stage = Stage(*[HostError(f"download failed {i}") for i in range(16)])
    sleep = FakeSleep()
    prewarmer = Prewarmer(index, stage, sleep=sleep)
    with caplog.at_level(logging.WARNING, logger="warren.runtime.prewarm"):
        async with running(prewarmer):
            prewarmer.enqueue(rec.hash())
            await until(lambda: prewarmer.state(rec.hash()) == "failed")
            assert len(stage.calls) == 8
            assert sleep.delays == [1, 2, 4, 8, 16, 32, 60]
            assert "failed 8 times, giving up" in caplog.text

            prewarmer.enqueue(rec.hash())  # a later enqueue starts over
            assert prewarmer.state(rec.hash()) == "pending"
            await until(lambda: prewarmer.state(rec.hash()) == "failed")
    assert len(stage.calls) == 16


async def test_a_failure_then_success_is_ready_and_pending_during_backoff(tmp_path: Path) -> None:
    rec = record("a")
    stage = Stage(HostError("flaky"))
    sleep = FakeSleep()
    sleep.hold = True  # the backoff never ends on its own: run() must still cancel cleanly
    prewarmer = Prewarmer(await _index(tmp_path, rec), stage, sleep=sleep, base_backoff_s=0.5)
    async with running(prewarmer):
        prewarmer.enqueue(rec.hash())
        await until(lambda: sleep.delays == [0.5])
        assert prewarmer.state(rec.hash()) == "pending"
        prewarmer.enqueue(rec.hash())  # queued (in backoff): no-op
        await prewarmer.ensure_staged(rec.hash())  # a use doesn't wait for the backoff
        assert prewarmer.state(rec.hash()) == "ready"
    assert len(stage.calls) == 2


async def test_an_attempt_over_its_bound_is_abandoned_and_counted(tmp_path: Path) -> None:
    rec = record("a")
    stage = Stage("block", None)
    sleep = FakeSleep()
    prewarmer = Prewarmer(await _index(tmp_path, rec), stage, sleep=sleep, attempt_timeout_s=0.01)
    async with running(prewarmer):
        prewarmer.enqueue(rec.hash())
        await until(lambda: prewarmer.state(rec.hash()) == "ready", turns=1_000_000)
    assert stage.cancelled == 1
    assert len(stage.calls) == 2 and sleep.delays == [1.0]


async def test_ensure_staged_reports_an_overrun_as_a_host_error(tmp_path: Path) -> None:
    rec = record("a")
    prewarmer = Prewarmer(await _index(tmp_path, rec), Stage("block"), attempt_timeout_s=0.01)
    with pytest.raises(StagingTimeout, match=f"staging runtime {rec.hash()} did not finish within 0.01s") as info:
        await prewarmer.ensure_staged(rec.hash())
    assert isinstance(info.value, HostError)
    assert prewarmer.state(rec.hash()) is None


async def test_an_unknown_hash_is_dropped_with_an_error_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    known, unknown = record("known"), record("unknown")
    stage = Stage()
    prewarmer = Prewarmer(await _index(tmp_path, known), stage, sleep=FakeSleep())
    with caplog.at_level(logging.ERROR, logger="warren.runtime.prewarm"):
        async with running(prewarmer):
            prewarmer.enqueue(unknown.hash())
            prewarmer.enqueue(known.hash())
            await until(lambda: prewarmer.state(known.hash()) == "ready")
    assert prewarmer.state(unknown.hash()) is None
    assert stage.calls == [known.hash()]
    assert f"runtime {unknown.hash()} is not in the runtime index; dropped" in caplog.text


async def test_ensure_staged_shares_an_in_flight_prewarm(tmp_path: Path) -> None:
    rec = record("a")
    stage = Stage("block")
    prewarmer = Prewarmer(await _index(tmp_path, rec), stage, sleep=FakeSleep())
    async with running(prewarmer):
        prewarmer.enqueue(rec.hash())
        await stage.entered.wait()
        assert prewarmer.state(rec.hash()) == "prewarming"
        users = [asyncio.create_task(prewarmer.ensure_staged(rec.hash())) for _ in range(3)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert not any(u.done() for u in users)
        stage.release.set()
        await asyncio.gather(*users)
        assert prewarmer.state(rec.hash()) == "ready"
        await prewarmer.ensure_staged(rec.hash())  # ready: no stage call
    assert stage.calls == [rec.hash()]


async def test_a_prewarm_shares_an_on_demand_attempt_and_takes_over_if_it_is_cancelled(tmp_path: Path) -> None:
    rec = record("a")
    stage = Stage("block", "block")
    prewarmer = Prewarmer(await _index(tmp_path, rec), stage, sleep=FakeSleep())
    user = asyncio.create_task(prewarmer.ensure_staged(rec.hash()))
    await stage.entered.wait()
    async with running(prewarmer):
        prewarmer.enqueue(rec.hash())
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(stage.calls) == 1  # the prewarm waits on the user's attempt
        stage.entered.clear()
        user.cancel()  # the user's request goes away mid-stage
        await stage.entered.wait()  # ... so the prewarm stages it itself
        assert len(stage.calls) == 2 and stage.cancelled == 1
        stage.release.set()
        await until(lambda: prewarmer.state(rec.hash()) == "ready")
    with pytest.raises(asyncio.CancelledError):
        await user


async def test_ensure_staged_on_demand_concurrently_and_for_unknown_hashes(tmp_path: Path) -> None:
    rec = record("a")
    stage = Stage("block")
    prewarmer = Prewarmer(await _index(tmp_path, rec), stage)
    users = [asyncio.create_task(prewarmer.ensure_staged(rec.hash())) for _ in range(2)]
    await stage.entered.wait()
    stage.release.set()
    await asyncio.gather(*users)
    assert stage.calls == [rec.hash()] and prewarmer.state(rec.hash()) == "ready"
    with pytest.raises(RuntimeMissError, match=record("b").hash()):
        await prewarmer.ensure_staged(record("b").hash())


async def test_a_failed_on_demand_attempt_surfaces_to_every_sharer(tmp_path: Path) -> None:
    rec = record("a")
    calls = 0

    async def stage(_: RuntimeRecord) -> None:
        nonlocal calls
        calls += 1
        for _turn in range(10):
            await asyncio.sleep(0)
        raise ValueError("bad tarball")

    prewarmer = Prewarmer(await _index(tmp_path, rec), stage)
    results = await asyncio.gather(
        prewarmer.ensure_staged(rec.hash()), prewarmer.ensure_staged(rec.hash()), return_exceptions=True
    )
    assert all(isinstance(r, HostError) and "ValueError: bad tarball" in str(r) for r in results)
    assert calls == 1 and prewarmer.state(rec.hash()) is None


async def test_run_is_single(tmp_path: Path) -> None:
    prewarmer = Prewarmer(await _index(tmp_path), Stage())
    async with running(prewarmer):
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already running"):
            await prewarmer.run()
