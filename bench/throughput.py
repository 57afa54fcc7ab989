"""Section "throughput" (issue 10): sustained creates per second from a warm pool, runc ``base``.

Three measurements, each on its own node (loopback, empty state dir):

* *pool_fill*: the ``base`` shelf is set to ``P`` (``POST /warren/templates/{id}/pool``) on an empty
  node; the time until ``/health`` ``warmPool`` shows ``ready == P`` gives the refill rate alone (the
  pool starts one spare at a time, nothing else runs).
* *sustained* (node with ``WARREN_MAX_SANDBOXES`` high, shelf of 8, full before the run): ``C``
  clients (threads of this process) each loop ``Sandbox.create(template="base")`` +
  ``commands.run("true")`` + ``kill()`` for a bounded count and time. ``creates_per_s`` is completed
  creates / wall time of the whole run (kills included); ``create_call`` is the create call alone,
  ``create_to_first_command`` create + first command. ``hits`` / ``misses`` are the shelf's counters
  before vs after (a miss is a cold start in the request). Every claim wakes the pool's refill, which
  starts a spare in the background on the same cores as the creates.
* *claim_only* (node with ``WARREN_MAX_SANDBOXES`` = shelf size ``P``, shelf full): ``C`` clients
  create + first command ``P`` sandboxes in all and keep them until the end. Spares plus claimed
  sandboxes fill the cap, so the pool cannot refill during the run: this is the claim rate alone.

``node_cpu`` is the node process's CPU (``/proc/<pid>/stat`` utime+stime, and cutime+cstime of its
reaped children: runc, mount helpers) over the run's wall time, in cores; ``host_cpu_busy`` the
whole host's (``/proc/stat``), in cores (this benchmark's client threads included).
``all_warren_sandboxes_cores`` is the ``warren`` cpuacct cgroup (cgroup v1): every warren sandbox on the
host, other nodes' included.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.harness import bench_node, drain_pool, sdk_env, wait_for
from bench.stats import summary_ms
from tests.framework.node import Node

TEMPLATE = "base"
TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat(5))
    kids = int(fields[13]) + int(fields[14])  # cutime, cstime
    return own / TICK, kids / TICK


def _host_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the host, from the first line of /proc/stat."""
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]  # idle, iowait
    return (sum(vals) - idle) / TICK, sum(vals) / TICK


SANDBOX_CPUACCT = Path("/sys/fs/cgroup/cpuacct/warren/cpuacct.usage")
"""CPU of every warren sandbox on the host (cgroup v1; other nodes' sandboxes too), ns; gone on v2."""


def _sandboxes_cpu() -> float:
    try:
        return int(SANDBOX_CPUACCT.read_text()) / 1e9
    except (OSError, ValueError):
        return float("nan")


@contextmanager
def _cpu(node: Node, out: dict[str, Any]) -> Iterator[None]:
    """Fill ``out`` with the node's and the host's CPU over the block, in cores."""
    assert node.proc is not None
    pid = node.proc.pid
    own0, kids0 = _proc_cpu(pid)
    me0, _ = _proc_cpu(os.getpid())
    busy0, _ = _host_cpu()
    box0 = _sandboxes_cpu()
    t0 = time.monotonic()
    yield
    wall = time.monotonic() - t0
    own1, kids1 = _proc_cpu(pid)
    me1, _ = _proc_cpu(os.getpid())
    busy1, _ = _host_cpu()
    box1 = _sandboxes_cpu()
    out["cpu"] = {
        "all_warren_sandboxes_cores": round((box1 - box0) / wall, 2),
        "node_cores": round((own1 - own0) / wall, 2),
        "node_children_cores": round((kids1 - kids0) / wall, 2),
        "bench_clients_cores": round((me1 - me0) / wall, 2),
        "host_busy_cores": round((busy1 - busy0) / wall, 2),
        "host_cpus": os.cpu_count(),
        "node_plus_children_cpu_s": round(own1 - own0 + kids1 - kids0, 2),
        "host_busy_cpu_s": round(busy1 - busy0, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }


def _shelf(node: Node, tid: str) -> dict[str, int]:
    with node.client() as c:
        pool = c.get("/health").json().get("warmPool", {})
    return next((v for k, v in pool.items() if k.startswith(f"{tid}/")), {})


def _fill(node: Node, size: int, timeout: float = 180) -> tuple[str, dict[str, Any]]:
    """Set the ``base`` shelf to ``size`` and wait until it is full; (template id, report)."""
    out: dict[str, Any] = {"spares": size}
    with node.client() as c:
        tid = c.get(f"/templates/{TEMPLATE}").json()["templateID"]
    with _cpu(node, out):
        t0 = time.perf_counter()
        with node.client() as c:
            c.post(f"/warren/templates/{tid}/pool", json={"size": size}).raise_for_status()
        if not wait_for(lambda: _shelf(node, tid).get("ready", 0) >= size, timeout, interval=0.05):
            raise RuntimeError(f"warm pool of {TEMPLATE} did not fill to {size}: {_shelf(node, tid)}")
        fill_s = time.perf_counter() - t0
    out.update(s=round(fill_s, 2), starts_per_s=round(size / fill_s, 2))
    out["node_plus_children_cpu_s_per_start"] = round(out["cpu"]["node_plus_children_cpu_s"] / size, 3)
    out["host_busy_cpu_s_per_start"] = round(out["cpu"]["host_busy_cpu_s"] / size, 3)
    return tid, out


def _wait_full(node: Node, tid: str, size: int, timeout: float = 180) -> None:
    if not wait_for(lambda: _shelf(node, tid).get("ready", 0) >= size, timeout, interval=0.1):
        raise RuntimeError(f"warm pool of {TEMPLATE} did not refill to {size}: {_shelf(node, tid)}")


def _clients(node: Node, tid: str, clients: int, per_client: int, budget_s: float, keep: bool) -> dict[str, Any]:
    """``clients`` threads, each up to ``per_client`` create + first command (+ kill unless ``keep``)."""
    from e2b import Sandbox

    calls: list[float] = []
    firsts: list[float] = []
    done: list[float] = []
    kept: list[Any] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + budget_s

    def client(_: int) -> None:
        for _ in range(per_client):
            if time.monotonic() > deadline:
                return
            try:
                t0 = time.perf_counter()
                sbx = Sandbox.create(template=TEMPLATE, timeout=300)
                t_call = time.perf_counter() - t0
                sbx.commands.run("true")
                t_first = time.perf_counter() - t0
            except Exception as exc:  # reported with the numbers
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                calls.append(t_call)
                firsts.append(t_first)
                done.append(time.perf_counter())
                if keep:
                    kept.append(sbx)
            if not keep:
                sbx.kill()

    before = _shelf(node, tid)
    out: dict[str, Any] = {"clients": clients, "spares_at_start": before.get("ready", 0)}
    with _cpu(node, out):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        wall = time.perf_counter() - t0
    after = _shelf(node, tid)
    done.sort()
    spares = before.get("ready", 0)
    if len(done) > spares + 1:  # after the spares there at the start are gone: what refill + cold starts give
        out["after_spares_creates_per_s"] = round((len(done) - 1 - spares) / (done[-1] - done[spares]), 2)
    for sbx in kept:
        sbx.kill()
    out.update(
        creates=len(calls),
        wall_s=round(wall, 2),
        creates_per_s=round(len(calls) / wall, 2),
        create_call=summary_ms(calls),
        create_to_first_command=summary_ms(firsts),
        hits=after.get("hits", 0) - before.get("hits", 0),
        misses=after.get("misses", 0) - before.get("misses", 0),
        ready_after=after.get("ready"),
    )
    cpu_s = out["cpu"]["node_plus_children_cpu_s"]
    out["node_plus_children_cpu_s_per_create"] = round(cpu_s / len(calls), 3) if calls else None
    out["host_busy_cpu_s_per_create"] = round(out["cpu"]["host_busy_cpu_s"] / len(calls), 3) if calls else None
    if errors:
        out["errors"] = errors[:5]
        out["error_count"] = len(errors)
    return out


def sustained(work: Path, runsc: Path | None, size: int, per_client: dict[int, int], budget_s: float) -> dict[str, Any]:
    env = {"WARREN_WARM_POOL": "0", "WARREN_MAX_SANDBOXES": "64"}
    out: dict[str, Any] = {"pool_size": size, "max_sandboxes": 64}
    with bench_node(work / "sustained", runsc, env) as node:
        sdk_env(node)
        try:
            tid, out["pool_fill"] = _fill(node, size)
            for clients, n in per_client.items():
                _wait_full(node, tid, size)
                out[f"c{clients}"] = _clients(node, tid, clients, n, budget_s, keep=False)
        finally:
            drain_pool(node)
    return out


def claim_only(work: Path, runsc: Path | None, size: int, clients_list: tuple[int, ...]) -> dict[str, Any]:
    env = {"WARREN_WARM_POOL": "0", "WARREN_MAX_SANDBOXES": str(size)}
    out: dict[str, Any] = {"pool_size": size, "max_sandboxes": size}
    with bench_node(work / "claim-only", runsc, env) as node:
        sdk_env(node)
        try:
            tid, out["pool_fill"] = _fill(node, size)
            for clients in clients_list:
                _wait_full(node, tid, size)
                out[f"c{clients}"] = _clients(node, tid, clients, size // clients, 300, keep=True)
        finally:
            drain_pool(node)
    return out


def run_throughput(work: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {"template": TEMPLATE, "runtime": "runc"}
    work.mkdir(parents=True, exist_ok=True)
    per_client = {4: max(20, int(50 * scale)), 8: max(10, int(25 * scale))}
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "sustained": lambda: sustained(work, runsc, 8, per_client, budget_s=max(30.0, 120 * scale)),
        "claim_only": lambda: claim_only(work, runsc, 16 if scale < 1 else 32, (4, 8)),
    }
    for name, fn in parts.items():
        try:
            out[name] = fn()
        except Exception as exc:  # reported, the other part still runs
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    rates = [v.get("creates_per_s", 0) for v in out.get("sustained", {}).values() if isinstance(v, dict)]
    out["warm_pool_creates_per_s"] = max(rates, default=None)
    return out
