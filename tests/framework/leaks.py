"""Host-resource leak checks for tests that start sandboxes.

    before = snapshot(state_dirs=[state_dir])
    ...                                   # start and stop sandboxes
    assert_no_leaks(before)               # polls a few seconds: runsc processes exit asynchronously

A snapshot records, as sets of strings: processes whose cmdline or cwd mentions one of the state dirs
or that sit in a cgroup under one of our parents; ``ip netns`` entries and links with our prefixes;
cgroup directories under our parents in every v1 hierarchy and in v2; mounts under the state dirs;
loop devices whose backing file is under a state dir (sandbox disks); sandbox dirs; and our nft tables.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from warren.mountinfo import points_under, read_mounts
from warren.runtime.cgroups import CgroupHierarchies

__all__ = ["HostSnapshot", "assert_no_leaks", "snapshot"]

NETNS_PREFIXES = ("wrn-", "wrt-")
LINK_PREFIXES = ("wv", "wt")
CGROUP_PARENTS = ("warren", "warren-test")
NFT_TABLES = ("warren", "warren_test")


@dataclass(frozen=True)
class HostSnapshot:
    processes: frozenset[str]
    netns: frozenset[str]
    links: frozenset[str]
    cgroups: frozenset[str]
    mounts: frozenset[str]
    loop_devices: frozenset[str]
    sandbox_dirs: frozenset[str]
    nft_tables: frozenset[str]
    # The filters, kept to take the "after" snapshot the same way.
    state_dirs: tuple[str, ...] = ()
    cgroup_parents: tuple[str, ...] = CGROUP_PARENTS
    netns_prefixes: tuple[str, ...] = NETNS_PREFIXES
    link_prefixes: tuple[str, ...] = LINK_PREFIXES
    nft_table_names: tuple[str, ...] = NFT_TABLES

    def diff(self, later: HostSnapshot) -> dict[str, list[str]]:
        """What ``later`` has that this snapshot had not, per category (empty categories omitted)."""
        out = {}
        for f in fields(self):
            if not isinstance(getattr(self, f.name), frozenset):
                continue
            extra = sorted(getattr(later, f.name) - getattr(self, f.name))
            if extra:
                out[f.name] = extra
        return out


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _processes(state_dirs: Sequence[str], cgroup_parents: Sequence[str]) -> frozenset[str]:
    me = os.getpid()
    found = set()
    markers = [f":/{p}/" for p in cgroup_parents]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        cmdline = _read(f"/proc/{entry}/cmdline")
        if not cmdline:
            continue  # kernel thread or already gone (zombies have an empty cmdline too)
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            cwd = ""
        cgroup = _read(f"/proc/{entry}/cgroup")
        if any(d in cmdline or cwd.startswith(d) for d in state_dirs) or any(m in cgroup for m in markers):
            found.add(f"{entry} {cmdline[:200]}")
    return frozenset(found)


def _cgroup_dirs(parents: Sequence[str]) -> frozenset[str]:
    hier = CgroupHierarchies.detect()
    out: set[str] = set()
    for parent in parents:
        for top in hier.existing(parent):
            for root, dirs, _ in os.walk(top):
                out.update(str(Path(root, d)) for d in dirs)
    return frozenset(out)


def _mounts(state_dirs: Sequence[str]) -> frozenset[str]:
    mounts = read_mounts()
    return frozenset(str(point) for d in state_dirs for point in points_under(d, mounts))


def _loop_devices(state_dirs: Sequence[str]) -> frozenset[str]:
    """``loopN: backing file`` for loop devices bound to a file under a state dir (also a deleted one:
    the kernel then appends `` (deleted)``, which still starts with the dir)."""
    out: set[str] = set()
    for dev in Path("/sys/block").glob("loop*"):
        backing = _read(str(dev / "loop" / "backing_file"))
        if backing and any(backing.startswith(d + "/") for d in state_dirs):
            out.add(f"{dev.name}: {backing}")
    return frozenset(out)


def _sandbox_dirs(state_dirs: Sequence[str]) -> frozenset[str]:
    out: set[str] = set()
    for d in state_dirs:
        sandboxes = Path(d) / "sandboxes"
        if sandboxes.is_dir():
            out.update(str(p) for p in sandboxes.iterdir())
    return frozenset(out)


def _nft_tables(names: Sequence[str]) -> frozenset[str]:
    res = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    tables = (line.split() for line in res.stdout.splitlines())
    return frozenset(" ".join(t) for t in tables if t and t[-1] in names)


def snapshot(
    *,
    state_dirs: Sequence[Path] = (),
    cgroup_parents: Sequence[str] = CGROUP_PARENTS,
    netns_prefixes: Sequence[str] = NETNS_PREFIXES,
    link_prefixes: Sequence[str] = LINK_PREFIXES,
    nft_tables: Sequence[str] = NFT_TABLES,
) -> HostSnapshot:
    dirs = tuple(str(Path(d).absolute()) for d in state_dirs)
    try:
        netns = [n for n in os.listdir("/run/netns") if n.startswith(tuple(netns_prefixes))]
    except FileNotFoundError:
        netns = []
    links = [n for n in os.listdir("/sys/class/net") if n.startswith(tuple(link_prefixes))]
    return HostSnapshot(
        processes=_processes(dirs, cgroup_parents),
        netns=frozenset(netns),
        links=frozenset(links),
        cgroups=_cgroup_dirs(cgroup_parents),
        mounts=_mounts(dirs),
        loop_devices=_loop_devices(dirs),
        sandbox_dirs=_sandbox_dirs(dirs),
        nft_tables=_nft_tables(nft_tables),
        state_dirs=dirs,
        cgroup_parents=tuple(cgroup_parents),
        netns_prefixes=tuple(netns_prefixes),
        link_prefixes=tuple(link_prefixes),
        nft_table_names=tuple(nft_tables),
    )


def assert_no_leaks(before: HostSnapshot, after: HostSnapshot | None = None, *, settle: float = 5.0) -> None:
    """Fail if the host has resources that ``before`` did not have.

    Without ``after``, snapshots are retaken for up to ``settle`` seconds until nothing is left
    (gVisor's sandbox and gofer processes and the kernel's netns cleanup finish asynchronously).
    """
    deadline = time.monotonic() + settle
    while True:
        current = after or snapshot(
            state_dirs=[Path(d) for d in before.state_dirs], cgroup_parents=before.cgroup_parents,
            netns_prefixes=before.netns_prefixes, link_prefixes=before.link_prefixes,
            nft_tables=before.nft_table_names,
        )
        leaked = before.diff(current)
        if not leaked or after is not None or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert not leaked, "leaked host resources:\n" + "\n".join(
        f"  {kind}: {', '.join(items)}" for kind, items in leaked.items()
    )
