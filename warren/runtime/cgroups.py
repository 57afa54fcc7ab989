"""Reading a sandbox's cgroup counters and removing leftover cgroup directories, v1 and v2.

The runtimes (runc, runsc) create and limit the cgroups from ``linux.cgroupsPath``; warren only reads
them for metrics and removes what a crashed or killed runtime left behind. Hierarchies are found in
``/proc/self/mountinfo``, so co-mounted controllers (``cpu,cpuacct``) and hybrid hosts (v1 controllers
plus a v2 mount) both work.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from warren.mountinfo import SELF, read_mounts
from warren.trees import walk

__all__ = ["CgroupHierarchies", "CgroupUsage"]

_UNLIMITED = 1 << 62
"""v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages); anything above this is unlimited."""

_NOT_CONTROLLERS = frozenset({"rw", "ro", "xattr", "noprefix", "cpuset_v2_mode"})


@dataclass(frozen=True)
class CgroupUsage:
    """Counters of one cgroup. ``memory_limit`` is None when unlimited."""

    memory_usage: int
    memory_cache: int
    memory_limit: int | None
    cpu_usage_ns: int


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


@dataclass(frozen=True)
class CgroupHierarchies:
    """Mount points of the host's cgroup hierarchies."""

    v1: dict[str, Path]
    """Controller (or ``name=systemd``) -> mount point."""
    v2: Path | None

    @classmethod
    def detect(cls, mountinfo: Path = SELF) -> CgroupHierarchies:
        v1: dict[str, Path] = {}
        v2: Path | None = None
        for mount in read_mounts(mountinfo):
            if mount.fstype == "cgroup2":
                v2 = v2 or mount.point
            elif mount.fstype == "cgroup":
                for opt in mount.super_options:
                    if opt not in _NOT_CONTROLLERS and not opt.startswith(("release_agent", "clone_children")):
                        v1.setdefault(opt, mount.point)
        return cls(v1, v2)

    def directories(self, rel: str) -> list[Path]:
        """Every directory ``rel`` (e.g. ``warren/sbx1``) has or would have, one per hierarchy."""
        rel = rel.strip("/")
        roots = {os.path.realpath(p): p for p in self.v1.values()}
        if self.v2 is not None:
            roots.setdefault(os.path.realpath(self.v2), self.v2)
        return [Path(root) / rel for root in sorted(roots)]

    def existing(self, rel: str) -> list[Path]:
        return [d for d in self.directories(rel) if d.is_dir()]

    def _memory_dir(self, rel: str) -> tuple[Path, bool] | None:
        if "memory" in self.v1:
            return self.v1["memory"] / rel.strip("/"), True
        if self.v2 is not None:
            return self.v2 / rel.strip("/"), False
        return None

    def usage(self, rel: str) -> CgroupUsage | None:
        """Counters of cgroup ``rel``, or None when it does not exist."""
        found = self._memory_dir(rel)
        if found is None or not found[0].is_dir():
            return None
        mem_dir, is_v1 = found
        if is_v1:
            stat = _read_kv(mem_dir / "memory.stat")
            usage = _read_int(mem_dir / "memory.usage_in_bytes") or 0
            cache = stat.get("total_cache", stat.get("cache", 0))
            inactive_file = stat.get("total_inactive_file", 0)
            limit = _read_int(mem_dir / "memory.limit_in_bytes")
        else:
            stat = _read_kv(mem_dir / "memory.stat")
            usage = _read_int(mem_dir / "memory.current") or 0
            cache = stat.get("file", 0)
            inactive_file = stat.get("inactive_file", 0)
            limit = _read_int(mem_dir / "memory.max")
        if limit is not None and limit >= _UNLIMITED:
            limit = None
        return CgroupUsage(
            # Like docker stats: the inactive page cache can be reclaimed at once, so it is not "used".
            memory_usage=max(0, usage - inactive_file),
            memory_cache=cache,
            memory_limit=limit,
            cpu_usage_ns=self._cpu_usage(rel),
        )

    def _cpu_usage(self, rel: str) -> int:
        if "cpuacct" in self.v1:
            return _read_int(self.v1["cpuacct"] / rel.strip("/") / "cpuacct.usage") or 0
        if self.v2 is not None:
            return _read_kv(self.v2 / rel.strip("/") / "cpu.stat").get("usage_usec", 0) * 1000
        return 0

    def remove(self, rel: str) -> list[Path]:
        """rmdir ``rel`` and its children in every hierarchy; return the directories that remain.

        A cgroup that still has processes cannot be removed (EBUSY): those come back in the list.
        """
        left = []
        for top in self.existing(rel):
            # A sandbox with a cgroup namespace can nest cgroups at any depth: bottom-up, by fd, no recursion.
            for visit in walk(top, topdown=False):
                for d in visit.dirs:
                    with contextlib.suppress(OSError):  # reported by the caller, which checks what still exists
                        os.rmdir(d, dir_fd=visit.fd)
            _rmdir(top)
            if top.exists():
                left.append(top)
        return left


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        pass  # reported by the caller, which checks what still exists
