"""Section "disk" (issue 9): what enforcing per-sandbox disk sizes costs, on vs off in one run.

Two nodes run side by side, warm pool off: one with ``WARREN_DISK_QUOTA=1`` (every sandbox gets a
sparse ext4 image of its template's ``diskSizeMB``, 2048 for ``base``, loop-mounted under its upper
dir, see warren/runtime/disk.py) and one with ``WARREN_DISK_QUOTA=0`` (the upper dir on the host
filesystem, as before). ``/health`` must show each as asked (``diskQuota.enforced``), else the section
fails. Each iteration measures *create_to_first_command* (``Sandbox.create(template="base")`` until
``commands.run("true")`` answers, as bench/sandboxes.py) on both nodes, alternating who goes first.
Warm-pool claims are not measured here: a pooled sandbox's disk is made when the pool fills, so a
claim does not touch it.

``mechanism`` times the steps alone, in this process, on a 2048 MiB disk: the chosen way (a sparse
copy of a template image formatted once per size, ``LOOP_CONFIGURE`` + ``mount``), the alternative it
was chosen over (``mkfs.ext4`` with lazy init for every sandbox), and the release (unmount; the loop
device detaches itself).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import POOL_OFF, bench_node, sdk_env
from bench.sandboxes import create_to_first_command_once
from bench.stats import summary_ms, timed
from tests.framework.node import Node

if TYPE_CHECKING:
    from warren.runtime.disk import SandboxDisks

TEMPLATE = "base"
SIZE_MB = 2048


def _check_disk_quota(node: Node, enforced: bool) -> dict[str, Any]:
    with node.client() as c:
        status = c.get("/health").json().get("diskQuota", {})
    if status.get("enforced") is not enforced:
        raise RuntimeError(f"node with WARREN_DISK_QUOTA={int(enforced)} reports diskQuota={status}")
    return dict(status)


def interleaved(nodes: dict[str, Node], n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {key: [] for key in nodes}
    for node in nodes.values():
        sdk_env(node)
        create_to_first_command_once(TEMPLATE)  # warm-up, not counted (the first disk makes its template image)
    keys = list(nodes)
    for i in range(n):
        for key in keys if i % 2 == 0 else keys[::-1]:
            sdk_env(nodes[key])
            samples[key].append(create_to_first_command_once(TEMPLATE))
    return samples


def mechanism_cost(n: int) -> dict[str, Any]:
    """The disk steps alone on a scratch state dir (removed afterwards)."""
    from warren.runtime.disk import DISK_IMAGE, SandboxDisks, loop_devices_backed_by

    with tempfile.TemporaryDirectory(prefix="warren-bench-disk-") as tmp:
        state = Path(tmp) / "state"
        disks = SandboxDisks(state)
        probe = disks.probe()
        if not probe["enforced"]:
            return {"skipped": probe["reason"]}
        first = state / "sandboxes" / "first"
        first.mkdir(parents=True)
        template_s = timed(lambda: disks.create(first, SIZE_MB))  # formats the template image once
        disks.release(first)
        template = next(disks.templates.glob(f"*-{SIZE_MB}M.img"))
        rounds = [_one_round(disks, state / "sandboxes" / f"s{i}", template) for i in range(n)]
        create, release, copy, mkfs = (list(column) for column in zip(*rounds, strict=True))
        image_kib = os.stat(first / DISK_IMAGE).st_blocks // 2
        left = loop_devices_backed_by(state)
    return {
        "size_mb": SIZE_MB,
        "first_disk_of_a_size_ms": round(template_s * 1000, 2),
        "create_copy_attach_mount": summary_ms(create),
        "release_unmount_detach": summary_ms(release),
        "sparse_copy_alone": summary_ms(copy),
        "alternative_mkfs_per_sandbox": summary_ms(mkfs),
        "host_kib_of_a_fresh_disk": image_kib,
        "loop_devices_left": left,
    }


def _one_round(disks: SandboxDisks, root: Path, template: Path) -> tuple[float, float, float, float]:
    """(create, release, sparse copy alone, mkfs alone) seconds for one sandbox dir, removed afterwards."""
    from warren.runtime.disk import MKFS_ARGS, _sparse_copy

    def format_one() -> None:
        with open(root / "mkfs.img", "wb") as fh:
            fh.truncate(SIZE_MB * 2**20)
        subprocess.run(["mkfs.ext4", *MKFS_ARGS, str(root / "mkfs.img")], check=True, capture_output=True)

    root.mkdir()
    try:
        return (
            timed(lambda: disks.create(root, SIZE_MB)),
            timed(lambda: disks.release(root)),
            timed(lambda: _sparse_copy(template, root / "copy.img")),
            timed(format_one),
        )
    finally:
        disks.release(root)
        shutil.rmtree(root)


def run_disk(work: Path, scale: float) -> dict[str, Any]:
    n = max(6, int(40 * scale))  # the difference is a few ms on ~200: p50s of 20 samples were noise-bound
    out: dict[str, Any] = {"iterations": n, "template": TEMPLATE, "nodes": {}}
    work.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    try:
        with (
            bench_node(work / "on", None, {**POOL_OFF, "WARREN_DISK_QUOTA": "1"}) as on,
            bench_node(work / "off", None, {**POOL_OFF, "WARREN_DISK_QUOTA": "0"}) as off,
        ):
            nodes = {"on": on, "off": off}
            out["nodes"] = {key: _check_disk_quota(node, key == "on") for key, node in nodes.items()}
            samples = interleaved(nodes, n)
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    for key, values in samples.items():
        out[key] = {"create_to_first_command": summary_ms(values)}
    on_p50 = out["on"]["create_to_first_command"]["p50_ms"]
    off_p50 = out["off"]["create_to_first_command"]["p50_ms"]
    out["disk_create_to_first_command_on_vs_off_p50_ratio"] = round(on_p50 / off_p50, 3) if off_p50 else None
    out["on_minus_off_p50_ms"] = round(on_p50 - off_p50, 2)
    try:
        out["mechanism"] = mechanism_cost(max(10, int(40 * scale)))
    except Exception as exc:  # reported; the node measurements stand
        out["mechanism"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
