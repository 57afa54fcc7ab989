"""Section "hardening" (issue 9): what the runc sandbox hardening costs, on vs off in one run.

Two nodes run side by side, warm pool off: one with ``WARREN_HARDENING=1`` (per-sandbox user
namespace with idmapped layer mounts, seccomp allowlist, cgroup namespace, fewer capabilities, masked
paths, pinned OOM score) and one with ``WARREN_HARDENING=0`` (none of it). ``/health`` must show each
as asked (``runtimes.runc.hardened`` and ``userns.mode`` "per-sandbox" / "off"), else the section fails.

Each iteration measures, on both nodes, the same three things the other sections do:
*create_to_first_command* (``Sandbox.create(template="base")`` until ``commands.run("true")``
answers, bench/sandboxes.py), *pause* and *resume* of one long-lived sandbox per node (bench/lifecycle.py:
``pause()``, then ``Sandbox.connect`` until the first command; ``PAUSE_CYCLES`` of them per iteration,
as they are short and noisy). The node that goes first alternates per iteration (on/off, off/on, ...)
so load on a shared host falls on both alike. One untimed create per node comes first (cold caches).

``idmapped_layers`` times the idmapped-mount step alone, in this process: ``IdmappedLayers`` on the
base rootfs (a user namespace fd from a forked helper + ``open_tree`` + ``mount_setattr``) opened and
closed, and the user namespace fd alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.harness import POOL_OFF, bench_node, sdk_env
from bench.lifecycle import pause_resume_once
from bench.sandboxes import create_to_first_command_once
from bench.stats import summary_ms, timed
from tests.framework.node import Node

TEMPLATE = "base"
MODES = {"on": True, "off": False}
METRICS = ("create_to_first_command", "pause", "resume")
PAUSE_CYCLES = 3


def _check_hardening(node: Node, hardened: bool) -> dict[str, Any]:
    """The node's runc probe from ``/health`` (with the key); raises unless it is hardened as asked."""
    with node.client() as c:
        runc = c.get("/health").json().get("runtimes", {}).get("runc", {})
    want_mode = "per-sandbox" if hardened else "off"
    mode = runc.get("userns", {}).get("mode")
    if not runc.get("available") or runc.get("hardened") is not hardened or mode != want_mode:
        raise RuntimeError(
            f"node with WARREN_HARDENING={int(hardened)} reports runc available={runc.get('available')} "
            f"hardened={runc.get('hardened')} userns={runc.get('userns')} (wanted hardened={hardened}, "
            f"userns mode {want_mode!r})"
        )
    return {"hardened": runc["hardened"], "userns": runc["userns"]}


def _ratio(on: dict[str, Any], off: dict[str, Any]) -> float | None:
    return round(on["p50_ms"] / off["p50_ms"], 3) if off.get("p50_ms") else None


def interleaved(nodes: dict[str, Node], n: int) -> dict[str, dict[str, list[float]]]:
    """``n`` rounds of create-to-first-command, pause and resume on every node, alternating who goes first."""
    from e2b import Sandbox

    samples: dict[str, dict[str, list[float]]] = {key: {m: [] for m in (*METRICS, "resume_connect")} for key in nodes}
    boxes: dict[str, Any] = {}
    try:
        for key, node in nodes.items():
            sdk_env(node)
            create_to_first_command_once(TEMPLATE)  # warm-up, not counted
            boxes[key] = Sandbox.create(template=TEMPLATE, timeout=1200)
            boxes[key].commands.run("true")
        keys = list(nodes)
        for i in range(n):
            for key in keys if i % 2 == 0 else keys[::-1]:
                sdk_env(nodes[key])
                s = samples[key]
                s["create_to_first_command"].append(create_to_first_command_once(TEMPLATE))
                for _ in range(PAUSE_CYCLES):
                    boxes[key], t_pause, t_connect, t_resume = pause_resume_once(boxes[key])
                    s["pause"].append(t_pause)
                    s["resume_connect"].append(t_connect)
                    s["resume"].append(t_resume)
    finally:
        for box in boxes.values():
            box.kill()
    return samples


def idmapped_layers_cost(rootfs: Path, n: int) -> dict[str, Any]:
    """Open + close of the idmapped view of ``rootfs`` (what a hardened create adds before its overlay)."""
    from warren.runtime.userns import DEFAULT_BASE, DEFAULT_SLOTS, RANGE_SIZE, IdmappedLayers, UidRange, userns_fd

    rng = UidRange(DEFAULT_BASE + (DEFAULT_SLOTS - 1) * RANGE_SIZE)  # the last slot: a mapping only, no files
    views, ns = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with IdmappedLayers([rootfs], rng):
            pass
        views.append(time.perf_counter() - t0)
        ns.append(timed(lambda: os.close(userns_fd(rng))))
    return {"open_close": summary_ms(views), "userns_fd_alone": summary_ms(ns), "layers": 1, "rootfs": str(rootfs)}


def run_hardening(work: Path, rootfs: Path, scale: float) -> dict[str, Any]:
    n = max(4, int(20 * scale))
    out: dict[str, Any] = {"iterations": n, "pause_cycles_per_iteration": PAUSE_CYCLES, "template": TEMPLATE,
                           "nodes": {}}
    work.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    try:
        with (
            bench_node(work / "on", None, {**POOL_OFF, "WARREN_HARDENING": "1"}) as on,
            bench_node(work / "off", None, {**POOL_OFF, "WARREN_HARDENING": "0"}) as off,
        ):
            nodes = {"on": on, "off": off}
            for key, node in nodes.items():
                out["nodes"][key] = _check_hardening(node, MODES[key])
            samples = interleaved(nodes, n)
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    for key, per in samples.items():
        out[key] = {metric: summary_ms(values) for metric, values in per.items()}
    out["ratios"] = {
        f"hardening_{metric}_on_vs_off_p50_ratio": _ratio(out["on"][metric], out["off"][metric]) for metric in METRICS
    }
    out["on_minus_off_p50_ms"] = {
        metric: round(out["on"][metric]["p50_ms"] - out["off"][metric]["p50_ms"], 2) for metric in METRICS
    }
    try:
        out["idmapped_layers"] = idmapped_layers_cost(rootfs, max(10, int(50 * scale)))
    except Exception as exc:  # reported; the node measurements stand
        out["idmapped_layers"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
