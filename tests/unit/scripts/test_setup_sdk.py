"""scripts/setup.sh's sdk stage (the older e2b SDK of the version matrix) against a stand-in pip: it installs
each requirements-e2b-<version>.lock with --no-deps into <dir>/e2b-<version>, once; a changed lock or a
half-made dir installs again; a failed pip leaves nothing behind and fails the stage."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SETUP = REPO / "scripts" / "setup.sh"
BASH = shutil.which("bash")
LOCKS = sorted(REPO.glob("requirements-e2b-*.lock"))

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="scripts/setup.sh refuses to run as non-root"),
    pytest.mark.skipif(BASH is None, reason="bash not installed"),
]

PIP = """#!/bin/sh
echo "pip $*" >> "$FAKE_CALLS"
[ -n "$FAKE_PIP_FAIL" ] && exit 1
while [ $# -gt 0 ]; do
    if [ "$1" = --target ]; then mkdir -p "$2/e2b" && touch "$2/e2b/__init__.py"; fi
    shift
done
"""


def _run(tmp_path: Path, **extra: str) -> tuple[int, str, list[str]]:
    pip = tmp_path / "pip"
    pip.write_text(PIP)
    pip.chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "WARREN_SETUP_STAGES": "sdk",
           "WARREN_SDK_DIR": str(tmp_path / "sdk"), "WARREN_SDK_PIP": str(pip), "FAKE_CALLS": str(calls),
           **extra}  # fmt: skip
    assert BASH is not None
    result = subprocess.run([BASH, str(SETUP)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    return result.returncode, result.stderr + result.stdout, calls.read_text().splitlines()


def _version(lock: Path) -> str:
    return lock.stem.removeprefix("requirements-e2b-")


def test_installs_each_lock_once(tmp_path: Path) -> None:
    assert LOCKS
    rc, out, calls = _run(tmp_path)
    assert rc == 0, out
    assert len(calls) == len(LOCKS)
    for lock, call in zip(LOCKS, calls, strict=True):
        target = tmp_path / "sdk" / f"e2b-{_version(lock)}"
        assert f"--no-deps --target {target}.tmp -r {lock}" in call
        assert (target / "e2b" / "__init__.py").is_file() and not Path(f"{target}.tmp").exists()
    rc, out, calls = _run(tmp_path)
    assert rc == 0 and len(calls) == len(LOCKS), "a second run installs nothing"
    assert "up to date" in out


def test_a_changed_stamp_installs_again(tmp_path: Path) -> None:
    assert _run(tmp_path)[0] == 0
    stamp = tmp_path / "sdk" / f"e2b-{_version(LOCKS[0])}" / ".warren-sdk"
    stamp.write_text("an older lock\n")
    rc, out, calls = _run(tmp_path)
    assert rc == 0, out
    assert len(calls) == 2 * len(LOCKS) - (len(LOCKS) - 1)
    assert stamp.read_text() != "an older lock\n"


def test_a_failed_pip_fails_the_stage_and_leaves_nothing(tmp_path: Path) -> None:
    rc, out, _ = _run(tmp_path, FAKE_PIP_FAIL="1")
    assert rc != 0
    assert "failed" in out
    assert not list((tmp_path / "sdk").iterdir())
