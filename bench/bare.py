"""Bare ``runc run`` / ``runsc run`` of the base rootfs starting the agent's interpreter: the floor.

Each run is a fresh container (own netns made by the runtime, no warren networking, no overlay),
running ``/.agent/bin/python3 -S -E -B -c 'import asyncio, json'`` in the foreground, so the time
covers runtime start + interpreter start + the agent's main imports + exit.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from warren.runtime.base import AGENT_MOUNT, Resources
from warren.runtime.oci.spec import ConfigInputs, build_config

BARE_ARGS = [f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-B", "-c", "import asyncio, json"]


def _bundle(root: Path, rootfs: Path, agent_bundle: Path, name: str) -> Path:
    bundle = root / name
    bundle.mkdir()
    config = build_config(
        ConfigInputs(
            hostname=name,
            rootfs=rootfs,
            netns_path=Path("/nonexistent"),
            agent_bundle=agent_bundle,
            etc_files={},
            cgroups_path=f"/warren-bench/{name}",
            resources=Resources(),
            args=BARE_ARGS,
            env={},
            nofile=min(1 << 20, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
            oom_score_adj=None,
        )
    )
    config["root"]["readonly"] = True
    config["linux"]["namespaces"] = [
        {"type": t} for t in ("pid", "ipc", "uts", "mount", "network")
    ]
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def bare_starts(binary: str, rootfs: Path, agent_bundle: Path, n: int, *, gvisor: bool) -> list[float]:
    """Wall time of ``n`` foreground runs; each container is deleted after it exits."""
    samples: list[float] = []
    root = Path(tempfile.mkdtemp(prefix="warren-bare-"))
    state = root / "state"
    state.mkdir()
    try:
        for i in range(n):
            name = f"bare{i}"
            bundle = _bundle(root, rootfs, agent_bundle, name)
            argv = [binary, "--root", str(state)]
            if gvisor:
                argv += ["--platform=ptrace", "--network=none"]
            argv += ["run", "--bundle", str(bundle), name]
            t0 = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, timeout=60)
            elapsed = time.perf_counter() - t0
            subprocess.run([binary, "--root", str(state), "delete", "--force", name], capture_output=True)
            if proc.returncode != 0:
                raise RuntimeError(f"bare {binary} run failed: {proc.stderr.decode()[-500:]}")
            samples.append(elapsed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return samples
