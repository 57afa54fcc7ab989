"""``MetricsSampler``: one task per node that samples every running sandbox each 5 s bucket.

Only running sandboxes are read: a paused one gets no samples (its series keeps what it had, and
goes on after a resume). A series goes when its sandbox leaves the table. A read of a running
sandbox whose current bucket has no sample yet takes one on the spot, so a sandbox created a moment
ago already has its first sample.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable, Iterable

from ..errors import WarrenError
from .metrics import BUCKET_S, SERIES_KEPT, CpuMeter, MetricSample, MetricSeries
from .runtimes import RuntimeSet
from .sandbox import Sandbox
from .states import SandboxState
from .table import SandboxTable

log = logging.getLogger(__name__)

_CONCURRENT_READS = 4
"""Counter reads in flight at once (each is a few cgroup files and the disk's usage, in a thread)."""


class MetricsSampler:
    def __init__(
        self,
        table: SandboxTable,
        runtimes: RuntimeSet,
        clock: Callable[[], float],
        *,
        kept: int = SERIES_KEPT,
    ) -> None:
        self._table = table
        self._runtimes = runtimes
        self._clock = clock
        self._kept = kept
        self._series: dict[str, MetricSeries] = {}
        self._cpu = CpuMeter()
        self._reads = asyncio.Semaphore(_CONCURRENT_READS)
        table.on_removed(self._cpu.forget)  # paused or gone: the next CPU reading starts afresh

    async def run(self) -> None:
        """Sample each bucket for the node's lifetime (one owned task; cancelled at shutdown)."""
        while True:
            try:
                await self.tick()
            except Exception:  # a measurement: never worth the node's other tasks (its TaskGroup)
                log.exception("metrics sampling failed; trying again next bucket")
            now = self._clock()
            await asyncio.sleep(BUCKET_S - now % BUCKET_S + 0.05)

    async def tick(self) -> None:
        """One sample of every running sandbox; series of sandboxes the table no longer holds go."""
        for gone in self._series.keys() - self._table.known_ids():
            del self._series[gone]
        running = [sb for sb in self._table if sb.state is SandboxState.RUNNING]
        await asyncio.gather(*(self._sample(sb) for sb in running))

    async def _sample(self, sandbox: Sandbox) -> MetricSample | None:
        """Read the sandbox's counters into its series (None if it stopped running meanwhile)."""
        async with self._reads:
            if sandbox.state is not SandboxState.RUNNING or not self._table.holds(sandbox):
                return None
            try:
                stats = await self._runtimes.of(sandbox.kind).stats(sandbox.id)
            except (WarrenError, OSError) as exc:
                log.debug("metrics of %s not read: %s", sandbox.id, exc)
                return None
            except Exception:
                log.exception("metrics of %s not read", sandbox.id)
                return None
            if sandbox.state is not SandboxState.RUNNING or not self._table.holds(sandbox):
                return None  # paused or killed while its counters were read
            sample = MetricSample.of(self._clock(), stats, self._cpu.percent(sandbox.id, stats))
            series = self._series.get(sandbox.id)
            if series is None:
                series = self._series[sandbox.id] = MetricSeries(self._kept)
            series.add(sample)
            return sample

    async def _current(self, sandbox: Sandbox) -> MetricSeries | None:
        series = self._series.get(sandbox.id)
        if sandbox.state is SandboxState.RUNNING and (series is None or not series.covers(self._clock())):
            await self._sample(sandbox)
            series = self._series.get(sandbox.id)
        return series

    async def series(self, sandbox_id: str, start: int | None, end: int | None) -> builtins.list[MetricSample]:
        """The sandbox's samples within ``[start, end]`` (Unix seconds); ``NotFoundError`` if unknown."""
        series = await self._current(self._table.get(sandbox_id))
        return series.between(start, end) if series is not None else []

    async def latest(self, sandbox_ids: Iterable[str]) -> dict[str, MetricSample]:
        """The newest sample of each known sandbox among ``sandbox_ids``; unknown ids are left out."""
        out: dict[str, MetricSample] = {}
        for sandbox_id in sandbox_ids:
            try:
                sandbox = self._table.get(sandbox_id)
            except WarrenError:
                continue
            series = await self._current(sandbox)
            if series is not None and (newest := series.newest()) is not None:
                out[sandbox_id] = newest
        return out
