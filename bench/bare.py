"""Bare ``runc run`` / ``runsc run`` of the base rootfs starting the agent's interpreter: the floor.

Each run is a fresh container (own netns made by the runtime, no warren networking, no overlay),
running ``/.agent/bin/python3 -S -E -B -c 'import asyncio, json'`` in the foreground, so the time
covers runtime start + interpreter start + the agent's main imports + exit.

The lifecycle floors (:func:`bare_runc_pause_resume`, :func:`bare_runsc_checkpoint_restore`) run the
same interpreter detached, sleeping after those imports, and time the runtime's own verbs on it.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from warren.runtime.base import AGENT_MOUNT, Resources
from warren.runtime.oci.spec import ConfigInputs, build_config

BARE_ARGS = [f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-B", "-c", "import asyncio, json"]
SLEEP_ARGS = [f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-B", "-c", "import asyncio, json, time; time.sleep(86400)"]
RUNSC_FLAGS = ["--platform=ptrace", "--network=none"]


def _bundle(root: Path, rootfs: Path, agent_bundle: Path, name: str, args: list[str] = BARE_ARGS) -> Path:
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
            args=args,
            env={},
            nofile=min(1 << 20, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
            oom_score_adj=None,
        )
    )
    config["root"]["readonly"] = True
    config["linux"]["namespaces"] = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]
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


def _cli(binary: str, state: Path, *, gvisor: bool) -> list[str]:
    return [binary, "--root", str(state), *(RUNSC_FLAGS if gvisor else [])]


def _timed_call(argv: list[str], log: Path, timeout: float = 60) -> float:
    """Run ``argv`` with stdio away from pipes (a detached container inherits them); its wall time."""
    with log.open("ab") as err:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=timeout)
        elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[3:5])} failed ({proc.returncode}): {log.read_text()[-500:]}")
    return elapsed


@contextlib.contextmanager
def _detached(binary: str, rootfs: Path, agent_bundle: Path, *, gvisor: bool) -> Iterator[tuple[list[str], Path, str]]:
    """A detached bare container running the sleeping interpreter: (cli, bundle, name); deleted on exit."""
    root = Path(tempfile.mkdtemp(prefix="warren-bare-"))
    state = root / "state"
    state.mkdir()
    name = "barelc"
    cli = _cli(binary, state, gvisor=gvisor)
    try:
        bundle = _bundle(root, rootfs, agent_bundle, name, SLEEP_ARGS)
        _timed_call([*cli, "run", "--detach", "--bundle", str(bundle), name], root / "cli.log")
        yield cli, root, name
    finally:
        subprocess.run([*cli, "delete", "--force", name], capture_output=True, stdin=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


def bare_runc_pause_resume(rootfs: Path, agent_bundle: Path, n: int) -> tuple[list[float], list[float]]:
    """``runc pause`` / ``runc resume`` of one detached bare container, ``n`` times each."""
    pauses, resumes = [], []
    with _detached("runc", rootfs, agent_bundle, gvisor=False) as (cli, root, name):
        for _ in range(n):
            pauses.append(_timed_call([*cli, "pause", name], root / "cli.log"))
            resumes.append(_timed_call([*cli, "resume", name], root / "cli.log"))
    return pauses, resumes


def bare_runsc_checkpoint_restore(
    runsc: str, rootfs: Path, agent_bundle: Path, n: int
) -> tuple[list[float], list[float], list[float]]:
    """``runsc checkpoint`` to an image dir, then ``runsc restore --detach`` from it (``--network=none``:
    the restored sandbox gets a fresh netns of its own with loopback only), ``n`` times each.

    The ``delete --force`` between them (checkpoint leaves a stopped container) is timed apart.
    """
    checkpoints, deletes, restores = [], [], []
    with _detached(runsc, rootfs, agent_bundle, gvisor=True) as (cli, root, name):
        bundle, log = root / name, root / "cli.log"
        for i in range(n):
            image = root / f"image{i}"
            checkpoints.append(_timed_call([*cli, "checkpoint", f"--image-path={image}", name], log))
            deletes.append(_timed_call([*cli, "delete", "--force", name], log))
            restores.append(
                _timed_call([*cli, "restore", "--detach", f"--image-path={image}", "--bundle", str(bundle), name], log)
            )
            shutil.rmtree(image, ignore_errors=True)
    return checkpoints, deletes, restores
