"""Section "node" (issue 4/5): the server process's own footprint, and how long a stop takes.

* *footprint*: VmRSS and Threads of the ``warren serve`` process (``/proc/<pid>/status``) idle, then
  holding 50 busybox sandboxes (runc) that each answered a command through the proxy; two node runs,
  one with default settings and one with the caps of ``warren/footprint.py``
  (``WARREN_EXECUTOR_WORKERS=2 MALLOC_ARENA_MAX=2 WARREN_HTTP_MAX_KEEPALIVE=32``). Both run with the
  node's default warm pool (the busybox shelf adds its sandboxes, reported as ``warm_pool``).
* *shutdown*: 20 running busybox sandboxes, SIGTERM, time until the process exits (it pauses every
  running sandbox first), at ``WARREN_SHUTDOWN_CONCURRENCY=1`` and ``=8``, warm pool off. The node is
  then started again on the same state dir and deletes the re-adopted paused sandboxes.
"""

from __future__ import annotations

import contextlib
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import POOL_OFF, clean_node, proc_status, sdk_env, start_node, wait_for
from bench.stats import summary_ms
from tests.framework.node import Node

CAPS = {"WARREN_EXECUTOR_WORKERS": "2", "MALLOC_ARENA_MAX": "2", "WARREN_HTTP_MAX_KEEPALIVE": "32"}
TEMPLATE = "busybox"


def _create_many(n: int, workers: int = 4) -> tuple[list[Any], list[float]]:
    from e2b import Sandbox

    def one(_: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        sbx = Sandbox.create(template=TEMPLATE, timeout=900)
        sbx.commands.run("true")
        return sbx, time.perf_counter() - t0

    with ThreadPoolExecutor(workers) as pool:
        made = list(pool.map(one, range(n)))
    return [m[0] for m in made], [m[1] for m in made]


def _settled(node: Node, seconds: float = 3.0) -> dict[str, Any]:
    assert node.proc is not None
    time.sleep(seconds)
    return proc_status(node.proc.pid)


def footprint(state_dir: Path, runsc: Path | None, env: dict[str, str], n: int) -> dict[str, Any]:
    node = start_node(state_dir, runsc, env)
    try:
        sdk_env(node)
        idle = _settled(node)
        boxes, creates = _create_many(n)
        held = _settled(node)
        with node.client() as c:
            health = c.get("/health").json()
        out = {
            "env": env or "defaults",
            "idle": idle,
            f"holding_{n}": held,
            "sandboxes": health.get("sandboxes"),
            "warm_pool": health.get("warmPool"),
            "footprint_caps": health.get("footprint"),
            "create_to_first_command_4_parallel": summary_ms(creates),
        }
        for sbx in boxes:
            sbx.kill()
        return out
    finally:
        clean_node(node)
        node.stop()


def _logged_ms(node: Node, needle: str, since: float) -> float | None:
    """Milliseconds from ``since`` (wall clock) to the first node log line with ``needle`` after it
    (the log's timestamps have millisecond resolution)."""
    for line in node.log_path.read_text(errors="replace").splitlines():
        if needle not in line:
            continue
        with contextlib.suppress(ValueError):
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since - 0.001:
                return round((at - since) * 1000, 1)
    return None


def shutdown_time(state_dir: Path, runsc: Path | None, concurrency: int, n: int) -> dict[str, Any]:
    env = {**POOL_OFF, "WARREN_SHUTDOWN_CONCURRENCY": str(concurrency)}
    node = start_node(state_dir, runsc, env)
    try:
        sdk_env(node)
        _create_many(n)
        assert node.proc is not None
        sent_at = time.time()
        t0 = time.perf_counter()
        node.proc.send_signal(signal.SIGTERM)
        code = node.proc.wait(300)
        elapsed = time.perf_counter() - t0
    finally:
        node.stop(signal.SIGKILL)
    # Start again on the same state dir: it re-adopts the paused sandboxes; delete them all.
    again = start_node(state_dir, runsc, POOL_OFF, api_key=node.api_key)
    try:
        with again.client() as c:
            listed = c.get("/v2/sandboxes").json()
        paused = sum(1 for s in listed if s.get("state") == "paused")
        clean_node(again)
        with again.client() as c:
            if not wait_for(lambda: not c.get("/v2/sandboxes").json(), timeout=60):
                raise RuntimeError("sandboxes left after the restart's cleanup")
    finally:
        again.stop()
    return {
        "concurrency": concurrency,
        "sandboxes": n,
        "sigterm_to_exit_ms": round(elapsed * 1000, 1),
        "sigterm_to_all_paused_ms": _logged_ms(node, "shutdown: ", sent_at),
        "exit_code": code,
        "paused_and_readopted": paused,
    }


def run_node(workdir: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    workdir.mkdir(parents=True, exist_ok=True)
    n_hold = 50 if scale >= 1 else 20
    for label, env in (("default", {}), ("capped", CAPS)):
        try:
            out[f"footprint_{label}"] = footprint(workdir / f"fp-{label}", runsc, env, n_hold)
        except Exception as exc:  # reported; the next run still goes
            out[f"footprint_{label}"] = {"error": f"{type(exc).__name__}: {exc}"}
    for conc in (1, 8):
        try:
            out[f"shutdown_concurrency_{conc}"] = shutdown_time(workdir / f"sd-{conc}", runsc, conc, 20)
        except Exception as exc:
            out[f"shutdown_concurrency_{conc}"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
