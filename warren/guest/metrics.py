"""``GET /metrics``: CPU, memory and disk use of the sandbox, from /proc, cgroups and statvfs."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import Agent


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies from the aggregate ``cpu`` line of /proc/stat."""
    text = _read("/proc/stat")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:9]]
            total = sum(values)
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return total - idle, total
    return None


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * 1024
    return out


def _cgroup_memory() -> tuple[int, int] | None:
    """(limit, usage) of the agent's memory cgroup (v2, then v1), when it has a limit."""
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit = (_read(limit_path) or "").strip()
        usage = (_read(usage_path) or "").strip()
        if limit.isdigit() and usage.isdigit():
            return int(limit), int(usage)
    return None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def collect(agent: Agent) -> dict[str, Any]:
    """envd's metrics: ``{ts, cpu_count, cpu_used_pct, mem_total, mem_used, mem_cache, disk_used,
    disk_total}`` plus ``mem_total_mib``/``mem_used_mib``; CPU use is since the previous call."""
    cpu_pct = 0.0
    sample = _cpu_times()
    if sample is not None:
        busy, total = sample
        prev_busy, prev_total = agent.cpu_sample or (0, 0)
        if total > prev_total:
            cpu_pct = round(100.0 * (busy - prev_busy) / (total - prev_total), 2)
        agent.cpu_sample = sample
    mem = _meminfo()
    mem_total = mem.get("MemTotal", 0)
    mem_used = mem_total - mem.get("MemAvailable", mem.get("MemFree", 0))
    mem_cache = mem.get("Cached", 0) + mem.get("Buffers", 0)
    cgroup = _cgroup_memory()
    if cgroup is not None and 0 < cgroup[0] < mem_total:
        mem_total, mem_used = cgroup[0], min(cgroup[1], cgroup[0])
    try:
        vfs = os.statvfs("/")
        disk_total = vfs.f_blocks * vfs.f_frsize
        disk_used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    except OSError:
        disk_total = disk_used = 0
    return {
        "ts": int(time.time()),
        "cpu_count": _cpu_count(),
        "cpu_used_pct": max(0.0, min(100.0, cpu_pct)),
        "mem_total": mem_total,
        "mem_used": mem_used,
        "mem_cache": mem_cache,
        "mem_total_mib": mem_total >> 20,
        "mem_used_mib": mem_used >> 20,
        "disk_used": disk_used,
        "disk_total": disk_total,
    }
