"""CPU use in percent between two reads of a sandbox's cumulative CPU time."""

from __future__ import annotations

import time

from ..runtime.base import SandboxStats


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
