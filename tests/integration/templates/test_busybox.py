from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.errors import NotFoundError
from warren.templates import build_busybox_rootfs
from warren.templates._fs import remove_tree
from warren.templates.busybox import find_busybox

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("need_root")]


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        find_busybox()
    except NotFoundError as exc:
        pytest.skip(str(exc))
    scratch = tmp_path_factory.mktemp("busybox")
    build_busybox_rootfs(scratch / "rootfs")
    yield scratch / "rootfs"
    remove_tree(scratch)


def _chroot(rootfs: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot"
    return subprocess.run(
        [chroot, str(rootfs), *argv], capture_output=True, text=True, timeout=30, env={"HOME": "/root"}
    )


def test_bash_login_shell_runs_commands(rootfs: Path) -> None:
    result = _chroot(rootfs, "/bin/bash", "-l", "-c", "echo hi; id user")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["hi", "uid=1000(user) gid=1000(user) groups=1000(user)"]


def test_login_shell_reads_profile_path(rootfs: Path) -> None:
    result = _chroot(rootfs, "/usr/bin/env", "-i", "/bin/bash", "-l", "-c", 'echo "$PATH"')
    assert result.stdout.strip() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_bash_exit_codes_pass_through(rootfs: Path) -> None:
    assert _chroot(rootfs, "/bin/bash", "-l", "-c", "exit 7").returncode == 7


def test_layout_and_ownership(rootfs: Path) -> None:
    home = os.stat(rootfs / "home/user")
    assert (home.st_uid, home.st_gid) == (1000, 1000)
    assert stat.S_IMODE(os.stat(rootfs / "tmp").st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(rootfs / "root").st_mode) == 0o700
    assert os.readlink(rootfs / "bin/sh") == "/bin/busybox"
    assert os.readlink(rootfs / "usr/bin/env") == "/bin/busybox"
    assert (rootfs / "etc/hostname").read_text().strip()
    passwd = (rootfs / "etc/passwd").read_text()
    assert "root:x:0:0:root:/root:/bin/bash" in passwd
    assert "user:x:1000:1000:user:/home/user:/bin/bash" in passwd
    assert "user:x:1000:" in (rootfs / "etc/group").read_text()


def test_applets_work_in_the_chroot(rootfs: Path) -> None:
    result = _chroot(rootfs, "/bin/sh", "-c", "ls / >/dev/null && env true && whoami")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "root"
