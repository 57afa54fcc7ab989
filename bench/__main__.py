"""``make bench``: measure a real node and write a JSON report (default bench/report.json).

Speed and memory targets live here, never in tests. Everything runs against a node started on
loopback with an empty state dir, the built-in templates, runc, and gVisor where runsc can network
(a B1-patched copy of Debian's runsc stands in for a fixed release, as in the tests).

``results`` has one entry per section (``--only`` picks some, ``--quick`` runs fewer iterations);
a section that fails records ``{"error": ...}`` and the others still run:

* ``sandboxes`` (bench/sandboxes.py): create-to-first-command, commands.run, idle memory, bare run;
* ``templates`` (bench/templates.py): image pulls vs skopeo, shared-base pull, SDK template builds;
* ``lifecycle`` (bench/lifecycle.py): pause, resume, snapshot, fork vs bare runtime verbs; warm pool;
* ``node`` (bench/node.py): server RSS / threads idle and with 50 sandboxes, default and capped;
  shutdown time at two concurrencies;
* ``hardening`` (bench/hardening.py): runc create-to-first-command, pause and resume on two nodes,
  hardening on vs off (``WARREN_HARDENING``), interleaved; the idmapped-mount step alone.
* ``disk`` (bench/disk.py): runc create-to-first-command on two nodes, per-sandbox disk sizes enforced
  vs not (``WARREN_DISK_QUOTA``), interleaved; the disk steps alone (template copy vs mkfs per sandbox).
* ``throughput`` (bench/throughput.py): sustained creates/s from a warm pool at 4 and 8 concurrent
  clients, the pool's refill rate alone, and the claim rate alone (pool cannot refill).
* ``egress`` (bench/egress.py): HTTP(S) request latency, requests/s and bulk MB/s from a sandbox, direct vs
  through the egress proxy (name check, HTTP header rule, HTTPS interception), runc and gVisor.
* ``domain`` (bench/domain.py): ``commands.run`` in domain mode (HTTPS, host routing, no
  ``E2B_SANDBOX_URL``) vs header mode, on two nodes, interleaved.
* ``code_interpreter`` (bench/code_interpreter.py): the ``e2b-code-interpreter`` SDK on runc and gVisor,
  create-to-first-result of ``1 + 1`` and 100 warm ``1 + 1`` round trips, p50/p99; the template's
  build or cache import.
* ``cluster`` (bench/cluster.py): create and ``commands.run`` p50/p99 through a gateway vs direct to
  the node, and creates/s through a gateway with 3 nodes vs 1.

``leftovers`` lists anything the benchmark's nodes left on the host (it should be empty). Numbers
are wall-clock on a possibly shared host: ``machine.loadavg_*`` says how busy it was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.subreaper import ENV as SUBREAPER_ENV

REPORT = Path(__file__).parent / "report.json"
TARGETS = {
    "runc_create_to_first_command_vs_bare_p50_ratio": "<= 2.0",
    "commands_run_p50_ms": "< 10",
    "idle_agent_rss_mib": "< 20",
    "gvisor_pause_vs_bare_checkpoint_p50_ratio": "<= 1.3",
    "gvisor_resume_vs_bare_restore_p50_ratio": "<= 1.3",
    "runc_pause_p50_ms": "< 20",
    "runc_resume_p50_ms": "< 20",
    "hardening_create_to_first_command_on_vs_off_p50_ratio": "<= 1.1",
    "hardening_pause_on_vs_off_p50_ratio": "<= 1.1",
    "hardening_resume_on_vs_off_p50_ratio": "<= 1.1",
    "disk_create_to_first_command_on_vs_off_p50_ratio": "<= 1.1",
    "warm_pool_creates_per_s": ">= 30",
    "gateway_added_commands_run_p50_ms": "< 5",
}
SECTIONS = (
    "sandboxes", "templates", "lifecycle", "node", "hardening", "disk", "throughput", "egress", "domain",
    "code_interpreter", "cluster",
)


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": list(os.getloadavg()),
        "reaper": "bench.subreaper (prompt, as tini/systemd)" if os.environ.get(SUBREAPER_ENV) == "1" else "host PID 1",
    }


def _on_shared_node(
    work: Path, runsc: Path | None, rootfs: Path, sections: list[str], scale: float, report: dict[str, Any],
    profile: bool,
) -> None:
    """The sandboxes, templates and lifecycle sections, on one node (warm pool off unless a section sets it).

    With ``profile`` the node writes its phases (``warren.phases``) and ``report["profile"]`` sums them."""
    from bench.harness import POOL_OFF
    from bench.profile import summarise

    phases = work / "phases.jsonl"
    env = {**POOL_OFF, "WARREN_PROFILE": str(phases)} if profile else POOL_OFF
    try:
        _run_shared(work, runsc, rootfs, sections, scale, report, env)
    finally:
        if profile:
            report["profile"] = summarise(phases)


def _run_shared(
    work: Path, runsc: Path | None, rootfs: Path, sections: list[str], scale: float, report: dict[str, Any],
    env: dict[str, str],
) -> None:
    from bench.harness import bench_node, sdk_env, section

    results = report["results"]
    with bench_node(work / "state", runsc, env) as node:
        sdk_env(node)
        with node.client() as c:
            probes = c.get("/health").json()["runtimes"]
            src = str(rootfs)
            c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
            agent_bundle = Path(c.get("/health").json().get("agent_bundle", ""))
        report["runtimes"] = probes
        if "sandboxes" in sections:
            from bench.sandboxes import run_sandboxes

            results["sandboxes"] = section(lambda: run_sandboxes(probes, rootfs, agent_bundle, runsc, scale))
        if "templates" in sections:
            from bench.templates import run_templates

            results["templates"] = section(lambda: run_templates(node, work, scale))
        if "lifecycle" in sections:
            from bench.lifecycle import run_lifecycle

            results["lifecycle"] = section(lambda: run_lifecycle(node, probes, rootfs, agent_bundle, runsc, scale))


def main() -> None:
    if os.environ.get(SUBREAPER_ENV) != "1" and os.environ.get("WARREN_BENCH_NO_SUBREAPER") != "1":
        # Under a prompt reaper, as nodes run in production: see bench/subreaper.py.
        os.environ[SUBREAPER_ENV] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "bench.subreaper", "--", sys.executable, "-m", "bench",
                                  *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument(
        "--profile", action="store_true",
        help="the shared node writes the phases of create, pause, connect and resume (report['profile'])",
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default: all of {','.join(SECTIONS)})",
    )
    args = parser.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if unknown := set(only) - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    scale = 0.25 if args.quick else 1.0

    from bench.harness import cleanup_bare_cgroups, host_baseline, keep_logs, leftovers, section
    from tests.framework.node import DEFAULT_CACHE
    from tests.framework.runsc import SYSTEM_RUNSC, patch_runsc

    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(),
        "quick": args.quick,
        "targets": TARGETS,
        "results": {},
    }
    results: dict[str, Any] = report["results"]
    t_start = time.monotonic()
    baseline = host_baseline()
    rootfs = DEFAULT_CACHE / "templates" / "base" / "rootfs"
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as tmp:
        work = Path(tmp)
        runsc = patch_runsc(SYSTEM_RUNSC, work / "runsc") if SYSTEM_RUNSC.exists() else None
        report["machine"]["runsc"] = "B1-patched copy of /usr/bin/runsc (stands in for a fixed release)"
        shared = [x for x in SECTIONS[:3] if x in only]
        try:
            if shared:
                _on_shared_node(work, runsc, rootfs, shared, scale, report, args.profile)
        except Exception as exc:  # the shared node did not start or stop: its sections get the error
            for name in shared:
                results.setdefault(name, {"error": f"{type(exc).__name__}: {exc}"})
        if "node" in only:
            from bench.node import run_node

            results["node"] = section(lambda: run_node(work / "nodes", runsc, scale))
        if "hardening" in only:
            from bench.hardening import run_hardening

            results["hardening"] = section(lambda: run_hardening(work / "hardening", rootfs, scale))
        if "disk" in only:
            from bench.disk import run_disk

            results["disk"] = section(lambda: run_disk(work / "disk", scale))
        if "throughput" in only:
            from bench.throughput import run_throughput

            results["throughput"] = section(lambda: run_throughput(work / "throughput", runsc, scale))
        if "egress" in only:
            from bench.egress import run_egress

            results["egress"] = section(lambda: run_egress(work / "egress", runsc, rootfs, scale))
        if "domain" in only:
            from bench.domain import run_domain

            results["domain"] = section(lambda: run_domain(work / "domain", runsc, scale))
        if "code_interpreter" in only:
            from bench.code_interpreter import run_code_interpreter

            results["code_interpreter"] = section(
                lambda: run_code_interpreter(work / "code_interpreter", runsc, scale)
            )
        if "cluster" in only:
            from bench.cluster import run_cluster

            results["cluster"] = section(lambda: run_cluster(work / "cluster", runsc, scale))
        cleanup_bare_cgroups()
        report["leftovers"] = leftovers(work, baseline)
        if report["leftovers"]:
            report["leftovers"]["node_logs_kept_in"] = keep_logs(work)
        for mount in sorted(report["leftovers"].get("mounts", []), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)  # never let the temp dir's removal cross one
    report["machine"]["loadavg_end"] = list(os.getloadavg())
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
