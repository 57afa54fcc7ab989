"""PendingReleases: the owner of releases that finish after their pause answered. Releases here are
coroutines gated by events (no runtime, no timing); the real ones are in
tests/integration/runtime/test_pause_release.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from tests.framework.runtime import poll_until
from warren.runtime.oci.releases import PendingReleases, ReleaseStatistics


class Gated:
    """A release that waits for ``gate``, then fails when ``error`` is set; ``ran`` when it ended."""

    def __init__(self, error: Exception | None = None) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.ran = False
        self.cancelled = False
        self.error = error

    async def __call__(self) -> None:
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.ran = True
        if self.error is not None:
            raise self.error


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        await poll_until(predicate, interval=0)


async def test_start_returns_before_the_release_ends_and_wait_waits_for_it() -> None:
    releases, release = PendingReleases(), Gated()
    await releases.start("a", release)
    await release.started.wait()
    assert releases.statistics() == ReleaseStatistics(running=1, waiting=0)
    waiter = asyncio.create_task(releases.wait("a"))
    await _until(lambda: releases.statistics().waiting == 1)
    assert not waiter.done()
    release.gate.set()
    await waiter
    assert release.ran
    assert releases.statistics() == ReleaseStatistics(running=0, waiting=0)
    await releases.wait("a")  # nothing pending: returns at once
    await releases.wait("other")


async def test_a_second_release_of_the_same_sandbox_is_refused() -> None:
    releases, release = PendingReleases(), Gated()
    await releases.start("a", release)
    with pytest.raises(RuntimeError, match="already running"):
        await releases.start("a", Gated())
    release.gate.set()
    await releases.aclose()


async def test_a_failed_release_is_logged_and_not_raised_to_waiters(caplog: pytest.LogCaptureFixture) -> None:
    releases, release = PendingReleases(), Gated(error=OSError("netns busy"))
    release.gate.set()
    with caplog.at_level(logging.ERROR, logger="warren.runtime.oci.releases"):
        await releases.start("sbx-7", release)
        await releases.wait("sbx-7")
    assert release.ran
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "sbx-7" in record.getMessage()
    assert record.exc_info is not None and "netns busy" in str(record.exc_info[1])
    assert releases.statistics().running == 0


async def test_a_cancelled_waiter_leaves_the_release_running() -> None:
    releases, release = PendingReleases(), Gated()
    await releases.start("a", release)
    waiter = asyncio.create_task(releases.wait("a"))
    await _until(lambda: releases.statistics().waiting == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert releases.statistics() == ReleaseStatistics(running=1, waiting=0)
    release.gate.set()
    await releases.wait("a")
    assert release.ran


async def test_aclose_waits_for_running_releases_then_runs_new_ones_inline() -> None:
    releases, first = PendingReleases(), Gated()
    await releases.start("a", first)
    closing = asyncio.create_task(releases.aclose())
    await first.started.wait()
    await asyncio.sleep(0)
    assert not closing.done()
    first.gate.set()
    await closing
    assert first.ran
    late = Gated()
    late.gate.set()
    await releases.start("b", late)  # after close: done before start returns
    assert late.ran
    assert releases.statistics().running == 0


async def test_a_cancelled_aclose_cancels_the_releases() -> None:
    releases, release = PendingReleases(), Gated()
    await releases.start("a", release)
    await release.started.wait()
    closing = asyncio.create_task(releases.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert release.cancelled and not release.ran
    assert releases.statistics().running == 0
