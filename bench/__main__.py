"""``make bench``: measure a real node and write a JSON report (default bench/report.json).

Speed and memory targets live here, never in tests. Everything runs against a node started on
loopback with an empty state dir, the built-in templates, runc, and gVisor where runsc can network
(a B1-patched copy of Debian's runsc stands in for a fixed release, as in the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import summary_ms, timed

REPORT = Path(__file__).parent / "report.json"
TARGETS = {
    "runc_create_to_first_command_vs_bare_p50_ratio": "<= 2.0",
    "commands_run_p50_ms": "< 10",
    "idle_agent_rss_mib": "< 20",
}


def _env(node: Any) -> None:
    os.environ.update(node.env())


def create_to_first_command(template: str, n: int) -> dict[str, Any]:
    from e2b import Sandbox

    samples: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        sbx = Sandbox.create(template=template, timeout=120)
        sbx.commands.run("true")
        samples.append(time.perf_counter() - t0)
        sbx.kill()
    return summary_ms(samples)


def commands_round_trip(template: str, n: int) -> dict[str, Any]:
    from e2b import Sandbox

    sbx = Sandbox.create(template=template, timeout=300)
    try:
        for _ in range(5):
            sbx.commands.run("true")
        return summary_ms([timed(lambda: sbx.commands.run("true")) for _ in range(n)])
    finally:
        sbx.kill()


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def idle_memory(template: str, n: int) -> dict[str, Any]:
    """Agent RSS as the sandbox sees pid 1, cgroup memory per sandbox, and host MemAvailable drop."""
    from e2b import Sandbox

    before = _mem_available()
    boxes = [Sandbox.create(template=template, timeout=300) for _ in range(n)]
    try:
        time.sleep(2)
        after = _mem_available()
        rss = []
        for sbx in boxes:
            status = sbx.commands.run("cat /proc/1/status", user="root").stdout
            kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            rss.append(kib / 1024)
        cgroup = [sbx.get_metrics()[-1].mem_used / 2**20 for sbx in boxes]
        return {
            "sandboxes": n,
            "idle_agent_rss_mib_p50": round(sorted(rss)[len(rss) // 2], 2),
            "cgroup_memory_per_sandbox_mib_p50": round(sorted(cgroup)[len(cgroup) // 2], 2),
            "host_memavailable_drop_per_sandbox_mib": round((before - after) / n / 2**20, 2),
        }
    finally:
        for sbx in boxes:
            sbx.kill()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0

    from bench.bare import bare_starts
    from tests.framework.node import DEFAULT_CACHE, running_node
    from tests.framework.runsc import SYSTEM_RUNSC, patch_runsc

    report: dict[str, Any] = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "targets": TARGETS,
        "results": {},
    }
    results: dict[str, Any] = report["results"]
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as tmp:
        runsc = patch_runsc(SYSTEM_RUNSC, Path(tmp) / "runsc") if SYSTEM_RUNSC.exists() else None
        report["machine"]["runsc"] = "B1-patched copy of /usr/bin/runsc (stands in for a fixed release)"
        with running_node(Path(tmp) / "state", runsc=runsc) as node:
            _env(node)
            with node.client() as c:
                probes = c.get("/health").json()["runtimes"]
                src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
                c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
                agent_bundle = Path(c.get("/health").json().get("agent_bundle", ""))
            report["runtimes"] = probes
            rootfs = DEFAULT_CACHE / "templates" / "base" / "rootfs"
            for runtime, template, n in (("runc", "base", 40), ("gvisor", "base-gvisor", 12)):
                if not probes.get(runtime, {}).get("available"):
                    results[runtime] = {"skipped": probes.get(runtime, {}).get("reason")}
                    continue
                k = max(3, int(n * scale))
                r: dict[str, Any] = {}
                r["create_to_first_command"] = create_to_first_command(template, k)
                r["commands_run_round_trip"] = commands_round_trip(template, max(20, int(200 * scale)))
                r["idle"] = idle_memory(template, 5)
                binary = "runc" if runtime == "runc" else str(runsc)
                r["bare_run"] = summary_ms(bare_starts(binary, rootfs, agent_bundle, k, gvisor=runtime == "gvisor"))
                r["create_vs_bare_p50_ratio"] = round(
                    r["create_to_first_command"]["p50_ms"] / r["bare_run"]["p50_ms"], 2
                )
                results[runtime] = r
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
