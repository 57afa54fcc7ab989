"""Sandbox metrics as data: CPU use between two counter reads, and a bounded series of 5 s samples.

No I/O: :class:`~.sampler.MetricsSampler` reads the counters and feeds these.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..runtime.base import SandboxStats

BUCKET_S = 5
"""E2B's metrics resolution: one sample per 5 s bucket, stamped with the bucket's start."""
SERIES_KEPT = 720
"""Samples kept per sandbox (an hour at full resolution); older ones are merged pairwise, so the series
still covers the sandbox's whole life with coarser old buckets and bounded memory."""


class CpuMeter:
    def __init__(self) -> None:
        self._samples: dict[str, tuple[float, int]] = {}

    def percent(self, sandbox_id: str, stats: SandboxStats) -> float:
        """CPU use since the previous call for this sandbox (0 the first time)."""
        now = time.monotonic()
        prev = self._samples.get(sandbox_id)
        self._samples[sandbox_id] = (now, stats.cpu_usage_ns)
        pct = 0.0
        if prev is not None and now > prev[0]:
            pct = (stats.cpu_usage_ns - prev[1]) / 1e9 / (now - prev[0]) / max(1, stats.cpu_count) * 100
        return max(0.0, pct)

    async def forget(self, sandbox_id: str) -> None:
        """The sandbox stopped being routable (a removal listener): its next read starts afresh."""
        self._samples.pop(sandbox_id, None)


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One bucket of E2B's ``SandboxMetric``."""

    timestamp: int
    """Unix seconds: the start of the sample's bucket (a multiple of :data:`BUCKET_S`)."""
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int

    @classmethod
    def of(cls, when: float, stats: SandboxStats, cpu_pct: float) -> MetricSample:
        return cls(
            timestamp=bucket_of(when),
            cpu_count=stats.cpu_count,
            cpu_used_pct=round(cpu_pct, 2),
            mem_used=stats.memory_used,
            mem_total=stats.memory_total,
            mem_cache=stats.memory_cache,
            disk_used=stats.disk_used,
            disk_total=stats.disk_total,
        )


def bucket_of(when: float) -> int:
    return int(when // BUCKET_S) * BUCKET_S


def _merge(old: MetricSample, new: MetricSample) -> MetricSample:
    """Two neighbouring samples as one, stamped with the older: mean CPU, peak use, the newer totals."""
    return MetricSample(
        timestamp=old.timestamp,
        cpu_count=new.cpu_count,
        cpu_used_pct=round((old.cpu_used_pct + new.cpu_used_pct) / 2, 2),
        mem_used=max(old.mem_used, new.mem_used),
        mem_total=new.mem_total,
        mem_cache=max(old.mem_cache, new.mem_cache),
        disk_used=max(old.disk_used, new.disk_used),
        disk_total=new.disk_total,
    )


class MetricSeries:
    """One sandbox's samples, oldest first, one per bucket, at most ``kept`` of them."""

    def __init__(self, kept: int = SERIES_KEPT) -> None:
        if kept < 2:
            raise ValueError("a series keeps at least two samples")
        self._kept = kept
        self._items: list[MetricSample] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, sample: MetricSample) -> None:
        """Append ``sample``; one in the same bucket as the newest replaces it; an older one is dropped."""
        if self._items:
            newest = self._items[-1]
            if sample.timestamp < newest.timestamp:
                return
            if sample.timestamp == newest.timestamp:
                self._items[-1] = sample
                return
        self._items.append(sample)
        if len(self._items) > self._kept:
            self._compact()

    def _compact(self) -> None:
        half = len(self._items) // 2
        old = self._items[:half]
        merged = [_merge(old[i], old[i + 1]) if i + 1 < len(old) else old[i] for i in range(0, len(old), 2)]
        self._items = merged + self._items[half:]

    def covers(self, when: float) -> bool:
        """Whether the newest sample is in the bucket of ``when``."""
        return bool(self._items) and self._items[-1].timestamp == bucket_of(when)

    def newest(self) -> MetricSample | None:
        return self._items[-1] if self._items else None

    def between(self, start: int | None, end: int | None) -> list[MetricSample]:
        """Samples stamped within ``[start, end]`` (Unix seconds; None: unbounded)."""
        return [
            s
            for s in self._items
            if (start is None or s.timestamp >= start) and (end is None or s.timestamp <= end)
        ]
