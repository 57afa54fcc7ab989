"""Run the deploy scripts under dash, bounded, with their whole process group cleaned up."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

BASE = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "base"
DASH = shutil.which("dash")
needs_dash = pytest.mark.skipif(DASH is None, reason="dash not installed")


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str

    def lines(self, needle: str) -> list[str]:
        return [line for line in self.output.splitlines() if needle in line]


def run_script(name: str, env: Mapping[str, str], *, timeout: float = 30.0) -> Result:
    """``dash BASE/name`` with only ``env`` (plus PATH); stdout and stderr together.

    The script runs in its own session so that on a timeout its children (sleep, curl) die with it.
    """
    assert DASH is not None
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    proc = subprocess.Popen(
        [DASH, str(BASE / name)],
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{name} did not finish within {timeout}s:\n{out}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Result(proc.returncode, out)
