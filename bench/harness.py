"""Shared plumbing for the benchmark sections: nodes with extra environment, process stats, cleanup.

Every node the benchmark starts lives under one temporary directory; :func:`leftovers` looks for
what a section could have left on the host (processes naming that directory, mounts under it, loop
devices bound to files under it (sandbox disks), runtime containers in its ``--root`` dirs, and netns /
cgroups of the sandboxes its nodes logged).
Other nodes on the host (tests running at the same time) share the ``wrn-`` / ``warren`` names, so
only ids that appear in our own node logs count.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.framework.node import Node, free_port

SANDBOX_ID = re.compile(r"\b([a-z][a-z0-9]{19})\b")


def section(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one report section; a failure becomes ``{"error": ...}`` instead of ending the report."""
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # a section's failure is data for the report
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["section_wall_s"] = round(time.monotonic() - t0, 1)
    return out


POOL_OFF = {"WARREN_WARM_POOL": "0"}


def start_node(
    state_dir: Path,
    runsc: Path | None,
    env: Mapping[str, str] | None = None,
    api_key: str | None = None,
    domain_ca: Path | None = None,
) -> Node:
    """A started node; ``env`` is added to the server's environment (nothing else: with ``env=None``
    the node runs with its real defaults, warm pool included). ``domain_ca``: in domain mode."""
    node = Node(
        state_dir=state_dir,
        port=free_port(),
        api_key=api_key or "wrn_bench_" + os.urandom(8).hex(),
        runsc=runsc,
        extra_env=dict(env or {}),
        domain_ca=domain_ca,
    )
    node.start()
    return node


def drain_pool(node: Node, timeout: float = 60) -> bool:
    """Set every warm-pool shelf to 0 and wait until the node has no sandbox dirs but listed ones.

    Stopping a node while its pool still starts or trims a sandbox can leave that sandbox's host
    resources behind (the stop is cancelled half-way), so the benchmark empties the pool first.
    """
    with node.client() as c:
        for key in c.get("/health").json().get("warmPool", {}):
            c.post(f"/warren/templates/{key.split('/')[0]}/pool", json={"size": 0})

        def settled() -> bool:
            listed = {s["sandboxID"] for s in c.get("/v2/sandboxes").json()}
            sandboxes = node.state_dir / "sandboxes"
            on_disk = {p.name for p in sandboxes.iterdir()} if sandboxes.is_dir() else set()
            return on_disk <= listed

        return wait_for(settled, timeout, interval=0.2)


def clean_node(node: Node) -> None:
    """Empty the warm pool, kill every sandbox (running or paused), delete every snapshot."""
    with node.client() as c:
        for _ in range(3):
            boxes = c.get("/v2/sandboxes").json()
            if not boxes:
                break
            for sbx in boxes:
                with contextlib.suppress(httpx.HTTPError):
                    c.delete(f"/sandboxes/{sbx['sandboxID']}")
        for snap in c.get("/snapshots").json():
            with contextlib.suppress(httpx.HTTPError):
                c.delete(f"/snapshots/{snap['snapshotID']}")
    if not drain_pool(node):
        raise RuntimeError(f"sandboxes of {node.state_dir} did not go away")


@contextlib.contextmanager
def bench_node(
    state_dir: Path, runsc: Path | None, env: Mapping[str, str] = POOL_OFF, domain_ca: Path | None = None
) -> Iterator[Node]:
    """A node for one section, emptied (sandboxes, snapshots) and stopped at the end; pool off by default."""
    node = start_node(state_dir, runsc, env, domain_ca=domain_ca)
    try:
        yield node
    finally:
        with contextlib.suppress(Exception):
            clean_node(node)
        node.stop()


def sdk_env(node: Node) -> None:
    os.environ.update(node.env())


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS (MiB) and Threads of a process, from /proc/<pid>/status."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            out["rss_mib"] = round(int(value.split()[0]) / 1024, 1)
        elif key == "Threads":
            out["threads"] = int(value)
    return out


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _our_ids(root: Path) -> set[str]:
    ids: set[str] = set()
    for log in root.rglob("*-node.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "left alone:" not in line:  # the reaper naming another node's sandboxes
                ids.update(SANDBOX_ID.findall(line))
    for sandboxes in root.rglob("sandboxes"):
        if sandboxes.is_dir():
            ids.update(p.name for p in sandboxes.iterdir())
    return ids


def _netns_and_cgroups() -> tuple[set[str], set[str]]:
    netns: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        netns = {n for n in os.listdir("/run/netns") if n.startswith("wrn-")}
    base = Path("/sys/fs/cgroup")
    pats = ("warren/*", "*/warren/*", "warren-bench/*", "*/warren-bench/*")
    return netns, {str(p) for pat in pats for p in base.glob(pat) if p.is_dir()}


def host_baseline() -> set[str]:
    """The ``wrn-`` netns and ``warren`` / ``warren-bench`` cgroups that exist before the benchmark."""
    netns, cgroups = _netns_and_cgroups()
    return netns | cgroups


def leftovers(root: Path, baseline: set[str]) -> dict[str, list[str]]:
    """What the benchmark's nodes and bare runs under ``root`` left on the host (empty: nothing).

    A netns or cgroup counts when it is new since ``baseline`` and named after a sandbox our nodes
    logged (or is a bare run's ``warren-bench`` cgroup).
    """
    prefix = str(root.absolute())
    found: dict[str, list[str]] = {}
    procs = []
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == me:
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if prefix in cmd or "/warren-bench/" in Path(f"/proc/{pid}/cgroup").read_text():
                procs.append(f"{pid} {cmd[:160]}")
    from warren.mountinfo import read_mounts
    from warren.runtime.disk import loop_devices_backed_by

    mounts = [str(m.point) for m in read_mounts() if str(m.point).startswith(prefix)]
    loops = loop_devices_backed_by(root.absolute())
    containers = []
    for rt_root in [*root.rglob("runtime/runc"), *root.rglob("runtime/runsc")]:
        containers += [f"{rt_root}: {p.name}" for p in rt_root.iterdir()] if rt_root.is_dir() else []
    ids = _our_ids(root)
    netns_now, cgroups_now = _netns_and_cgroups()
    netns = [n for n in netns_now - baseline if n[4:] in ids]
    cgroups = [c for c in cgroups_now - baseline if Path(c).name in ids or "/warren-bench/" in c]
    for key, items in (
        ("processes", procs),
        ("mounts", mounts),
        ("loop_devices", loops),
        ("containers", containers),
        ("netns", netns),
        ("cgroups", cgroups),
    ):
        if items:
            found[key] = sorted(items)
    return found


def keep_logs(root: Path) -> str:
    """Copy the node logs under ``root`` out of it (to look into leftovers after the temp dir is gone)."""
    dest = Path(f"/tmp/warren-bench-logs-{time.strftime('%Y%m%d-%H%M%S')}")
    dest.mkdir(parents=True, exist_ok=True)
    for log in root.rglob("*-node.log"):
        shutil.copy2(log, dest / f"{log.parent.name}-{log.name}")
    return str(dest)


def cleanup_bare_cgroups() -> None:
    """Remove empty ``warren-bench`` cgroups the bare runs' runtimes left (runsc leaves the parent)."""
    for base in [*Path("/sys/fs/cgroup").glob("warren-bench"), *Path("/sys/fs/cgroup").glob("*/warren-bench")]:
        for d in [*sorted(base.rglob("*"), key=lambda p: -len(p.parts)), base]:
            if d.is_dir():
                with contextlib.suppress(OSError):
                    d.rmdir()


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... failed ({proc.returncode}): {proc.stderr.decode()[-400:]}")
    return proc
