"""The wheels of the code-interpreter template, fetched on the host with the host's own pip configuration.

The build sandbox installs them offline (``sandbox/ci_bootstrap.py``): the host's package indexes (a
``PIP_INDEX_URL``, ``/etc/pip.conf``'s extra ``file://`` indexes and find-links, a TLS-intercepting proxy
trusted through ``PIP_CERT``) then all apply as they are, which a sandbox could not see. Wheels only, for
the base template's Python (CPython 3.11 on glibc x86_64, Debian bookworm).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from warren.errors import UnavailableError

PYTHON_VERSION = "3.11"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
"""Bookworm has glibc 2.36: any manylinux wheel up to 2_28 runs there."""
TIMEOUT_S = 1800


def download_argv(dest: Path, packages: Sequence[str]) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
            "--dest", str(dest), "--only-binary=:all:", "--python-version", PYTHON_VERSION,
            "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none"]  # fmt: skip
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    return [*argv, "pip", *packages]


def download(dest: Path, packages: Sequence[str], say: Callable[[str], None]) -> list[Path]:
    """Fetch ``pip`` and ``packages`` with their dependencies into ``dest``; the wheels. Blocking."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = download_argv(dest, packages)
    say(f"downloading wheels on the host: pip download {' '.join(packages)}")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnavailableError(f"pip download of the code-interpreter packages failed: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join(line for line in proc.stderr.splitlines() if "is ignored" not in line)[-1500:]
        raise UnavailableError(
            f"pip download of the code-interpreter packages failed (exit {proc.returncode}); is the package "
            f"index reachable from this host? {tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    say(f"{len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) >> 20} MiB")
    return wheels


__all__ = ["download", "download_argv"]
