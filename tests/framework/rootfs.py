"""A tiny busybox rootfs for sandbox tests: static ``/bin/busybox``, its applets, root and ``user``.

``build_busybox_rootfs(dest)`` is a plain function; ``busybox_rootfs`` is the session fixture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from warren.runtime.probe import is_static_elf

__all__ = ["build_busybox_rootfs", "busybox_rootfs", "find_static_busybox"]

_PASSWD = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
_GROUP = "root:x:0:\ntty:x:5:\nuser:x:1000:\n"


def find_static_busybox() -> Path | None:
    """The host's statically linked busybox (Debian: busybox-static), or None."""
    for candidate in (shutil.which("busybox"), "/bin/busybox", "/usr/bin/busybox"):
        if candidate and Path(candidate).is_file() and is_static_elf(Path(candidate)):
            return Path(candidate)
    return None


def build_busybox_rootfs(dest: Path, busybox: Path | None = None) -> Path:
    """Populate ``dest`` and return it.

    Same result as ``busybox --install -s``, but the applet links point at ``/bin/busybox`` inside the
    rootfs (``--install`` would link to the host path of the binary it ran from).
    """
    busybox = busybox or find_static_busybox()
    if busybox is None:
        raise FileNotFoundError("no static busybox on this host (apt install busybox-static)")
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home/user", "tmp", "proc", "sys", "dev",
              "var/tmp", "run"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, dest / "bin" / "busybox")
    applets = subprocess.run([busybox, "--list-full"], check=True, capture_output=True, text=True).stdout.split()
    for rel in applets:
        link = dest / rel
        if rel != "bin/busybox" and not link.exists():
            link.symlink_to("/bin/busybox")
    bash = dest / "bin" / "bash"
    if not bash.is_symlink() and not bash.exists():
        # A wrapper, not a symlink: busybox picks the applet from argv[0], and "bash" is not one.
        bash.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
        bash.chmod(0o755)
    (dest / "etc" / "passwd").write_text(_PASSWD)
    (dest / "etc" / "group").write_text(_GROUP)
    os.chown(dest / "home" / "user", 1000, 1000)
    (dest / "root").chmod(0o700)
    (dest / "tmp").chmod(0o1777)
    (dest / "var" / "tmp").chmod(0o1777)
    return dest


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A read-only-use busybox rootfs layer shared by the whole session."""
    if find_static_busybox() is None:
        pytest.skip("needs a static busybox (apt install busybox-static)")
    return build_busybox_rootfs(tmp_path_factory.mktemp("busybox-rootfs"))
