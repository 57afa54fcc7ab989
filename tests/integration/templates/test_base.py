"""The ``base`` template (debootstrap, ~40 s): taken from the setup cache when present."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.cli.config import DEFAULT_CACHE_DIR
from warren.templates import ensure_builtin_templates, load_template_info
from warren.templates._fs import remove_tree
from warren.templates.debian import HOST_CA_BUNDLE

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("need_root")]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The base template dir: from WARREN_CACHE_DIR (default /var/cache/warren) if built, else built
    here into a temporary cache that is deleted afterwards (180 MB)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    cache = Path(os.environ.get("WARREN_CACHE_DIR") or DEFAULT_CACHE_DIR)
    cached = cache / "templates" / "base"
    if (cached / "template.json").is_file() and (cached / "rootfs").is_dir():
        yield cached
        return
    if shutil.which("debootstrap", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        pytest.skip("debootstrap is not installed")
    scratch = tmp_path_factory.mktemp("cache")
    try:
        yield ensure_builtin_templates(scratch, names=["base"])["base"]
    finally:
        remove_tree(scratch)


def _chroot(rootfs: Path, script: str) -> subprocess.CompletedProcess[str]:
    chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot"
    return subprocess.run(
        [chroot, str(rootfs), "/bin/bash", "-l", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": "/root", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def test_bash_python_and_user(base: Path) -> None:
    result = _chroot(base / "rootfs", "echo hi; id user; python3 -c 'print(6 * 7)'; ps -p 1 -o pid= >/dev/null; true")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "hi"
    assert lines[1] == "uid=1000(user) gid=1000(user) groups=1000(user)"
    assert lines[2] == "42"


def test_user_home_and_shell(base: Path) -> None:
    rootfs = base / "rootfs"
    home = os.stat(rootfs / "home/user")
    assert (home.st_uid, home.st_gid) == (1000, 1000)
    entry = next(line for line in (rootfs / "etc/passwd").read_text().splitlines() if line.startswith("user:"))
    assert entry.split(":")[5:] == ["/home/user", "/bin/bash"]
    sudo = (rootfs / "usr/bin/sudo").stat()
    assert sudo.st_uid == 0 and sudo.st_mode & 0o4000, "sudo is setuid root, as in E2B's base image"
    sudoers = rootfs / "etc/sudoers.d/user"
    assert sudoers.read_text() == "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
    assert sudoers.stat().st_mode & 0o777 == 0o440


def test_host_ca_bundle_and_clean_apt(base: Path) -> None:
    rootfs = base / "rootfs"
    if HOST_CA_BUNDLE.is_file():
        assert filecmp.cmp(rootfs / "etc/ssl/certs/ca-certificates.crt", HOST_CA_BUNDLE, shallow=False)
    assert list((rootfs / "var/cache/apt/archives").glob("*.deb")) == []
    assert list((rootfs / "var/lib/apt/lists").glob("*_*")) == []


def test_metadata(base: Path) -> None:
    info = load_template_info(base)
    assert info.name == "base"
    assert "bookworm" in info.source
    assert (info.user, info.workdir) == ("user", "/home/user")
    assert "/usr/bin" in info.env["PATH"]
