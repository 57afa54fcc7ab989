"""Section "code_interpreter" (issue 14): the unmodified ``e2b-code-interpreter`` SDK on its own node.

* ``ensure_s``: making ``code-interpreter-v1`` exist on an empty node (``POST /warren/templates/ensure``):
  an import of the setup cache's layer, or a whole build when the cache lacks it (``source`` says which);
  ``gvisor_variant_s`` the gVisor variant's no-step build plus its seal as a memory snapshot.
* per runtime (runc from the warm pool, which is on here: its spares have run the start command, the
  server and its kernel are up; gVisor restoring the sealed snapshot with the kernel started):
  ``create_to_first_result``, ``Sandbox.create`` + ``run_code("1 + 1")`` until its result is back, then a
  kill (not timed); runc's shelf exists before the first iteration and each waits for a spare, so each
  is a hit.
* ``round_trip_1_plus_1``: 100 ``run_code("1 + 1")`` on one warm sandbox (after 5 unmeasured).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.harness import bench_node, sdk_env, wait_for
from bench.stats import summary_ms
from tests.framework.node import Node

ROUND_TRIPS = 100
WARMUP = 5
ENSURE_TIMEOUT_S = 3600.0


def _ensure(node: Node, name: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    last = ""
    with node.client() as c:
        c.timeout = ENSURE_TIMEOUT_S
        with c.stream("POST", "/warren/templates/ensure", json={"name": name}) as r:
            r.raise_for_status()
            for raw in r.iter_lines():
                doc = json.loads(raw)
                if doc["event"] == "error":
                    raise RuntimeError(f"{name}: {doc['message']}")
                if doc["event"] == "log":
                    last = str(doc["message"])
    return time.perf_counter() - t0, last


def _spare_ready(node: Node, template_id: str) -> bool:
    with node.client() as c:
        pool = c.get("/health").json().get("warmPool", {})
    shelf = next((v for k, v in pool.items() if k.startswith(f"{template_id}/")), {})
    return int(shelf.get("ready", 0)) >= 1


def _runtime(node: Node, template: str, iterations: int, pooled: bool) -> dict[str, Any]:
    from e2b_code_interpreter import Sandbox

    with node.client() as c:
        template_id = c.get(f"/templates/{template}").json()["templateID"]
        if pooled:  # the shelf exists now, not at the first create (which would be a miss)
            c.post(f"/warren/templates/{template_id}/pool", json={"size": 1}).raise_for_status()
    firsts: list[float] = []
    for _ in range(iterations):
        if pooled:
            wait_for(lambda: _spare_ready(node, template_id), 120, interval=0.1)
        t0 = time.perf_counter()
        sbx = Sandbox.create(template=template, timeout=300)
        text = sbx.run_code("1 + 1").text
        firsts.append(time.perf_counter() - t0)
        assert text == "2", text
        sbx.kill()
    sbx = Sandbox.create(template=template, timeout=300)
    try:
        for _ in range(WARMUP):
            sbx.run_code("1 + 1")
        trips = []
        for _ in range(ROUND_TRIPS):
            t0 = time.perf_counter()
            sbx.run_code("1 + 1")
            trips.append(time.perf_counter() - t0)
    finally:
        sbx.kill()
    return {"create_to_first_result": summary_ms(firsts), "round_trip_1_plus_1": summary_ms(trips)}


def run_code_interpreter(work: Path, runsc: Path | None, scale: float) -> dict[str, Any]:
    from warren.templates.codeinterp import GVISOR_NAME, NAME

    work.mkdir(parents=True, exist_ok=True)
    iterations = max(3, int(20 * scale))
    out: dict[str, Any] = {}
    with bench_node(work / "state", runsc, {"WARREN_WARM_POOL": "1"}) as node:
        sdk_env(node)
        took, last = _ensure(node, NAME)
        out["ensure_s"] = round(took, 1)
        out["source"] = "setup cache" if "importing" in last or "ready" in last else "build"
        out["ensure_last_line"] = last
        out["runc"] = _runtime(node, NAME, iterations, pooled=True)
        with node.client() as c:
            gvisor = c.get("/health").json()["runtimes"].get("gvisor", {})
        if gvisor.get("available"):
            took, _ = _ensure(node, GVISOR_NAME)
            out["gvisor_variant_s"] = round(took, 1)
            out["gvisor"] = _runtime(node, GVISOR_NAME, iterations, pooled=False)
        else:
            out["gvisor"] = {"skipped": gvisor.get("reason")}
    return out
