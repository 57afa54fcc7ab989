"""The SDK version matrix: the pinned e2b (the newest release, in .venv) runs every test; the release of
about a year before it (requirements-e2b-<version>.lock, installed by scripts/setup.sh into
.sdk/e2b-<version>) runs the SDK tests of lifecycle, commands, files and pause here, in a pytest of its
own with ``WARREN_E2B_SDK`` (tests/conftest.py puts it first on sys.path). A change of the node that
breaks the older SDK fails this test.

Deselected under the older SDK: tests of calls it does not have (``pause()``, ``lifecycle``, snapshots,
fork: e2b 2.9+; tests/e2e/test_sdk_compat.py covers its ``beta_pause``), and gVisor (the wire protocol
is the same; the pinned SDK runs both runtimes), to keep the run under a minute. Its async client shares
one connection pool across event loops, so that run uses one loop for the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.framework.node import DEFAULT_CACHE

REPO = Path(__file__).resolve().parents[2]
LOCKS = sorted(REPO.glob("requirements-e2b-*.lock"))
FILES = ["test_sdk_lifecycle.py", "test_sdk_commands.py", "test_sdk_files.py", "test_sdk_compat.py",
         "test_sdk_async.py"]  # fmt: skip


def _pinned(lock: Path) -> str:
    return next(line.split("==", 1)[1].strip() for line in lock.read_text().splitlines() if line.startswith("e2b=="))


def test_the_pinned_sdk_is_the_one_installed() -> None:
    lock = (REPO / "requirements.lock").read_text().splitlines()
    assert f"e2b=={version('e2b')}" in lock
    assert LOCKS, "no requirements-e2b-<version>.lock: the version matrix has no older SDK"
    for older in LOCKS:
        assert older.name == f"requirements-e2b-{_pinned(older)}.lock"


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.stem.removeprefix("requirements-"))
def test_sdk_tests_pass_under_the_older_sdk(lock: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip("end-to-end tests need root and `warren setup`")
    sdk = REPO / ".sdk" / f"e2b-{_pinned(lock)}"
    assert (sdk / ".warren-sdk").is_file(), f"{sdk} is missing: run scripts/setup.sh (its sdk stage)"
    env = {**os.environ, "WARREN_E2B_SDK": str(sdk), "PYTHONPATH": str(REPO)}
    for name in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
        env.pop(name, None)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "run"),
            "-o", "asyncio_default_fixture_loop_scope=session", "-o", "asyncio_default_test_loop_scope=session",
            "-k", "not gvisor", "-rfE", *(str(REPO / "tests" / "e2e" / f) for f in FILES)]  # fmt: skip
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    tail = "\n".join(result.stdout.splitlines()[-40:])
    assert f"e2b SDK: {_pinned(lock)}" in result.stdout, tail
    assert result.returncode == 0, f"SDK tests failed under e2b {_pinned(lock)}:\n{tail}\n{result.stderr[-2000:]}"
