"""Section "sandboxes": create-to-first-command per runtime, commands.run round trip, idle memory, bare run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.bare import bare_starts
from bench.stats import summary_ms, timed


def create_to_first_command_once(template: str) -> float:
    """Seconds from ``Sandbox.create`` to the first ``commands.run("true")`` answer (the kill is not timed)."""
    from e2b import Sandbox

    t0 = time.perf_counter()
    sbx = Sandbox.create(template=template, timeout=120)
    try:
        sbx.commands.run("true")
        return time.perf_counter() - t0
    finally:
        sbx.kill()


def create_to_first_command(template: str, n: int) -> dict[str, Any]:
    return summary_ms([create_to_first_command_once(template) for _ in range(n)])


_BASH_FLOOR = """
import json, subprocess, time
samples = []
for _ in range({n}):
    t0 = time.perf_counter()
    subprocess.run(["/bin/bash", "-l", "-c", "true"])
    samples.append(time.perf_counter() - t0)
print(json.dumps(samples))
"""
"""What ``commands.run("true")`` asks of the sandbox (the SDK runs ``/bin/bash -l -c <cmd>``), started
from a Python in the sandbox as the default user: the floor under the round trip."""


def commands_round_trip(template: str, n: int) -> dict[str, Any]:
    """``commands.run("true")`` through the proxy, and in the same sandbox the bare fork/exec floor."""
    import json

    from e2b import Sandbox

    sbx = Sandbox.create(template=template, timeout=300)
    try:
        for _ in range(5):
            sbx.commands.run("true")
        out = summary_ms([timed(lambda: sbx.commands.run("true")) for _ in range(n)])
        sbx.files.write("/tmp/bench_bash_floor.py", _BASH_FLOOR.format(n=n))
        floor = sbx.commands.run("python3 /tmp/bench_bash_floor.py", timeout=300).stdout
        out["in_sandbox_bash_l_c_true"] = summary_ms(json.loads(floor))
        return out
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


def run_sandboxes(
    probes: dict[str, Any], rootfs: Path, agent_bundle: Path, runsc: Path | None, scale: float
) -> dict[str, Any]:
    """Per runtime: create-to-first-command (warm pool off) vs a bare runtime run of the agent's interpreter."""
    results: dict[str, Any] = {}
    for runtime, template, n in (("runc", "base", 40), ("gvisor", "base-gvisor", 12)):
        if not probes.get(runtime, {}).get("available"):
            results[runtime] = {"skipped": probes.get(runtime, {}).get("reason")}
            continue
        k = max(3, int(n * scale))
        r: dict[str, Any] = {}
        try:
            r["create_to_first_command"] = create_to_first_command(template, k)
            r["commands_run_round_trip"] = commands_round_trip(template, max(20, int(200 * scale)))
            r["idle"] = idle_memory(template, 5)
            binary = "runc" if runtime == "runc" else str(runsc)
            r["bare_run"] = summary_ms(bare_starts(binary, rootfs, agent_bundle, k, gvisor=runtime == "gvisor"))
            r["create_vs_bare_p50_ratio"] = round(r["create_to_first_command"]["p50_ms"] / r["bare_run"]["p50_ms"], 2)
        except Exception as exc:  # reported; the other runtime still runs
            r["error"] = f"{type(exc).__name__}: {exc}"
        results[runtime] = r
    return results
