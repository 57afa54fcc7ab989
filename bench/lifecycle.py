"""Section "lifecycle" (issue 3/5): pause, resume, snapshot, fork per runtime through the SDK, the bare
runtime verbs in the same run for a ratio, and create-to-first-command with the warm pool warm.

Per runtime one source sandbox is paused and resumed ``n`` times: *pause* is ``Sandbox.pause()``
(memory pause: the runc freezer, or ``runsc checkpoint`` + a background release), *resume* is ``Sandbox.connect()`` of
the paused sandbox until the first ``commands.run("true")`` answers (``resume_connect`` is the
connect call alone); ``resume_after_idle`` is the same one second after the pause (:data:`IDLE_S`).
*snapshot* is ``create_snapshot()`` of the running source (deleted after), and
*fork* is ``fork(count=k)`` until it returns (``..._to_first_command``: until every child answered).

The bare floors run the agent's interpreter sleeping in a bare bundle (bench/bare.py): ``runc
pause`` / ``runc resume``, and ``runsc checkpoint`` / ``runsc restore --detach`` with
``--network=none``. ``runsc delete --force`` of the checkpointed container is timed apart: a warren
gVisor pause includes it (it releases the sandbox), and it is most of the pause's time.

*warm pool*: the template's pool size is set to 2 through ``POST /warren/templates/{id}/pool``; each
create waits until the shelf is full again (``/health`` ``warmPool``), so every create is a hit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.bare import bare_runc_pause_resume, bare_runsc_checkpoint_restore
from bench.harness import drain_pool, wait_for
from bench.stats import summary_ms, timed
from tests.framework.node import Node

IDLE_S = 1.0
"""*resume_after_idle*: a resume this long after the pause. A gVisor pause answers once the checkpoint is
written and releases the container in the background (~150 ms); a resume right after the pause waits
for that release, one after a realistic idle time does not."""


def _fork(sbx: Any, count: int) -> tuple[float, float]:
    from e2b import Sandbox

    t0 = time.perf_counter()
    children = sbx.fork(count=count)
    t_call = time.perf_counter() - t0
    try:
        boxes = [c for c in children if isinstance(c, Sandbox)]
        if len(boxes) != count:
            raise RuntimeError(f"fork(count={count}) gave {children}")
        for box in boxes:
            box.commands.run("true")
        return t_call, time.perf_counter() - t0
    finally:
        for c in children:
            if isinstance(c, Sandbox):
                c.kill()


def pause_resume_once(sbx: Any, idle_s: float = 0.0) -> tuple[Any, float, float, float]:
    """``sbx.pause()``, ``idle_s`` of idleness, then ``Sandbox.connect`` until the first
    ``commands.run("true")`` answers.

    Returns the connected sandbox and the seconds of the pause, the connect call, and connect +
    first command (*resume*). ``connect`` reads the node from the SDK's environment (E2B_API_URL ...).
    """
    from e2b import Sandbox

    t_pause = timed(sbx.pause)
    time.sleep(idle_s)
    t0 = time.perf_counter()
    sbx = Sandbox.connect(sbx.sandbox_id, timeout=600)
    t_connect = time.perf_counter() - t0
    sbx.commands.run("true")
    return sbx, t_pause, t_connect, time.perf_counter() - t0


def sdk_lifecycle(template: str, n: int, n_fork: int) -> dict[str, Any]:
    from e2b import Sandbox

    pause, connect, resume, snap, idle_connect, idle_resume = [], [], [], [], [], []
    fork: dict[int, tuple[list[float], list[float]]] = {1: ([], []), 3: ([], [])}
    sbx = Sandbox.create(template=template, timeout=600)
    try:
        sbx.commands.run("true")
        for _ in range(n):
            sbx, t_pause, t_connect, t_resume = pause_resume_once(sbx)
            pause.append(t_pause)
            connect.append(t_connect)
            resume.append(t_resume)
        for _ in range(max(2, n // 2)):
            sbx, _, t_connect, t_resume = pause_resume_once(sbx, idle_s=IDLE_S)
            idle_connect.append(t_connect)
            idle_resume.append(t_resume)
        for _ in range(n):
            t0 = time.perf_counter()
            info = sbx.create_snapshot()
            snap.append(time.perf_counter() - t0)
            Sandbox.delete_snapshot(info.snapshot_id)
            sbx.commands.run("true")
        for count, (calls, firsts) in fork.items():
            for _ in range(n_fork):
                t_call, t_first = _fork(sbx, count)
                calls.append(t_call)
                firsts.append(t_first)
    finally:
        sbx.kill()
    out = {
        "pause": summary_ms(pause),
        "resume": summary_ms(resume),
        "resume_connect": summary_ms(connect),
        "resume_after_idle": summary_ms(idle_resume),
        "resume_after_idle_connect": summary_ms(idle_connect),
        "snapshot": summary_ms(snap),
    }
    for count, (calls, firsts) in fork.items():
        out[f"fork_{count}"] = summary_ms(calls)
        out[f"fork_{count}_to_first_command"] = summary_ms(firsts)
    return out


def _shelf(node: Node, template_id: str) -> dict[str, int]:
    with node.client() as c:
        pool = c.get("/health").json().get("warmPool", {})
    return next((v for k, v in pool.items() if k.startswith(f"{template_id}/")), {})


def warm_pool_creates(node: Node, template: str, n: int, size: int = 2) -> dict[str, Any]:
    """Create-to-first-command with a warm pool of ``size``: each create waits for the shelf to refill."""
    from e2b import Sandbox

    with node.client() as c:
        tid = c.get(f"/templates/{template}").json()["templateID"]
        r = c.post(f"/warren/templates/{tid}/pool", json={"size": size})
        if r.status_code == 404:
            return {"missing": "no POST /warren/templates/{id}/pool on this node"}
        r.raise_for_status()
    samples, calls, refill = [], [], []
    before = _shelf(node, tid)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            if not wait_for(lambda: _shelf(node, tid).get("ready", 0) >= size, timeout=120, interval=0.05):
                raise RuntimeError(f"warm pool of {template} did not fill: {_shelf(node, tid)}")
            refill.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sbx = Sandbox.create(template=template, timeout=120)
            calls.append(time.perf_counter() - t0)
            sbx.commands.run("true")
            samples.append(time.perf_counter() - t0)
            sbx.kill()
        shelf = _shelf(node, tid)
    finally:
        drain_pool(node)
    return {
        "pool_size": size,
        "create_to_first_command": summary_ms(samples),
        "create_call": summary_ms(calls),
        "hits": shelf.get("hits", 0) - before.get("hits", 0),
        "misses": shelf.get("misses", 0) - before.get("misses", 0),
        "wait_for_refill": summary_ms(refill),
    }


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if "p50_ms" not in a or "p50_ms" not in b or not b["p50_ms"]:
        return None
    return round(float(a["p50_ms"]) / float(b["p50_ms"]), 2)


def _sum_p50(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"p50_ms": a["p50_ms"] + b["p50_ms"]} if "p50_ms" in a and "p50_ms" in b else {}


def run_lifecycle(
    node: Node, probes: dict[str, Any], rootfs: Path, agent_bundle: Path, runsc: Path | None, scale: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"bare": {}, "ratios": {}, "warm_pool": {}}
    for runtime, template, n in (("runc", "base", 20), ("gvisor", "base-gvisor", 10)):
        if not probes.get(runtime, {}).get("available"):
            out[runtime] = {"skipped": probes.get(runtime, {}).get("reason")}
            continue
        k = max(3, int(n * scale))
        try:
            out[runtime] = sdk_lifecycle(template, k, max(2, k // 2))
        except Exception as exc:  # reported, the other runtime still runs
            out[runtime] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            if runtime == "runc":
                p, r = bare_runc_pause_resume(rootfs, agent_bundle, max(10, k))
                out["bare"]["runc_pause"], out["bare"]["runc_resume"] = summary_ms(p), summary_ms(r)
            elif runsc is not None:
                c, d, r = bare_runsc_checkpoint_restore(str(runsc), rootfs, agent_bundle, k)
                out["bare"]["runsc_checkpoint"], out["bare"]["runsc_restore"] = summary_ms(c), summary_ms(r)
                out["bare"]["runsc_delete_after_checkpoint"] = summary_ms(d)
                out["bare"]["runsc_flags"] = "--platform=ptrace --network=none (restore: own loopback-only netns)"
        except Exception as exc:
            out["bare"][f"{runtime}_error"] = f"{type(exc).__name__}: {exc}"
        try:
            out["warm_pool"][runtime] = warm_pool_creates(node, template, max(3, int(n * scale)))
        except Exception as exc:
            out["warm_pool"][runtime] = {"error": f"{type(exc).__name__}: {exc}"}
    g, bare, rc = out.get("gvisor", {}), out["bare"], out.get("runc", {})
    out["ratios"] = {
        "gvisor_pause_vs_bare_checkpoint_p50": _ratio(g.get("pause", {}), bare.get("runsc_checkpoint", {})),
        "gvisor_pause_vs_bare_checkpoint_plus_delete_p50": _ratio(
            g.get("pause", {}),
            _sum_p50(bare.get("runsc_checkpoint", {}), bare.get("runsc_delete_after_checkpoint", {})),
        ),
        "gvisor_resume_vs_bare_restore_p50": _ratio(g.get("resume", {}), bare.get("runsc_restore", {})),
        "gvisor_resume_connect_vs_bare_restore_p50": _ratio(g.get("resume_connect", {}), bare.get("runsc_restore", {})),
        "gvisor_resume_after_idle_connect_vs_bare_restore_p50": _ratio(
            g.get("resume_after_idle_connect", {}), bare.get("runsc_restore", {})
        ),
        "runc_resume_connect_vs_bare_resume_p50": _ratio(rc.get("resume_connect", {}), bare.get("runc_resume", {})),
        "runc_pause_vs_bare_pause_p50": _ratio(rc.get("pause", {}), bare.get("runc_pause", {})),
        "runc_resume_vs_bare_resume_p50": _ratio(rc.get("resume", {}), bare.get("runc_resume", {})),
    }
    return out
