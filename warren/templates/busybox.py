"""The ``busybox`` built-in template: a static busybox and its applets, nothing else (~2 MB).

The E2B SDK runs every command as ``/bin/bash -l -c CMD`` and every PTY as ``/bin/bash -i -l``.
Busybox has no ``bash`` applet (and picks the applet by ``argv[0]``, so a symlink named bash
fails), so ``/bin/bash`` is a two-line script that hands its arguments to busybox ``ash``.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from warren.errors import HostError, NotFoundError
from warren.templates._fs import run

BUSYBOX_CANDIDATES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
"""Where Debian's busybox-static puts the binary (``/bin`` may be a symlink to ``/usr/bin``)."""

USER_UID = 1000
USER_GID = 1000
USER_HOME = "/home/user"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PASSWD = """\
root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
"""

GROUP = """\
root:x:0:
user:x:1000:
nogroup:x:65534:
"""

SHADOW = """\
root:*:19000:0:99999:7:::
user:*:19000:0:99999:7:::
nobody:*:19000:0:99999:7:::
"""

PROFILE = f"""\
export PATH={DEFAULT_PATH}
if [ "$(id -u)" -eq 0 ]; then PS1='\\u@\\h:\\w# '; else PS1='\\u@\\h:\\w$ '; fi
export PS1
"""

BASH_SHIM = """\
#!/bin/busybox sh
# busybox has no bash applet; the E2B SDK always runs /bin/bash -l -c CMD, which ash understands.
exec /bin/busybox ash "$@"
"""

HOSTS = """\
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
"""

_DIRS: tuple[tuple[str, int], ...] = (
    ("bin", 0o755),
    ("sbin", 0o755),
    ("usr/bin", 0o755),
    ("usr/sbin", 0o755),
    ("usr/local/bin", 0o755),
    ("etc", 0o755),
    ("dev", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("run", 0o755),
    ("mnt", 0o755),
    ("opt", 0o755),
    ("var/log", 0o755),
    ("root", 0o700),
    ("home", 0o755),
    ("home/user", 0o755),
    ("tmp", 0o1777),
    ("var/tmp", 0o1777),
)

_PT_INTERP = 3


def is_static_elf(path: Path) -> bool:
    """True when ``path`` is an ELF executable without a program interpreter (statically linked)."""
    try:
        with open(path, "rb") as fh:
            ident = fh.read(16)
            if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2):
                return False
            is64 = ident[4] == 2
            order = "<" if ident[5] == 1 else ">"
            layout = order + ("HHIQQQIHHH" if is64 else "HHIIIIIHHH")
            fields = struct.unpack(layout, fh.read(struct.calcsize(layout)))
            phoff, phentsize, phnum = int(fields[4]), int(fields[8]), int(fields[9])
            for i in range(phnum):
                fh.seek(phoff + i * phentsize)
                (p_type,) = struct.unpack(order + "I", fh.read(4))
                if p_type == _PT_INTERP:
                    return False
            return phnum > 0
    except (OSError, struct.error):
        return False


def find_busybox() -> Path:
    """The host's statically linked busybox; raise ``NotFoundError`` if there is none."""
    candidates = [*BUSYBOX_CANDIDATES]
    found = shutil.which("busybox")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and is_static_elf(candidate):
            return candidate
    raise NotFoundError("no statically linked busybox on the host: apt-get install busybox-static")


def applet_paths(busybox: Path) -> list[str]:
    """Applet paths relative to ``/`` (``bin/sh``, ``usr/bin/env``, ...), from ``busybox --list-full``."""
    listing = run([busybox, "--list-full"], timeout=30)
    return [line.strip().lstrip("/") for line in listing.splitlines() if line.strip()]


def build_busybox_rootfs(dest: Path, *, busybox: Path | None = None) -> None:
    """Build the busybox rootfs into the empty or missing directory ``dest``.

    Produces ``/bin/busybox`` with an absolute symlink per applet, ``/bin/bash`` (a shim to ash),
    ``/etc/{passwd,group,shadow,profile,hostname,hosts}``, ``root`` (uid 0) and ``user`` (uid 1000,
    home ``/home/user``). Needs root for the ownership of ``/home/user``.
    """
    source = busybox or find_busybox()
    if not is_static_elf(source):
        raise HostError(f"{source} is not a statically linked executable")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for rel, mode in _DIRS:
            directory = dest / rel
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, mode)
        shutil.copy2(source, dest / "bin/busybox")
        os.chmod(dest / "bin/busybox", 0o755)
        for rel in applet_paths(source):
            link = dest / rel
            if link.name == "busybox" or link.exists() or link.is_symlink():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to("/bin/busybox")
        _write(dest / "bin/bash", BASH_SHIM, 0o755)
        _write(dest / "etc/passwd", PASSWD, 0o644)
        _write(dest / "etc/group", GROUP, 0o644)
        _write(dest / "etc/shadow", SHADOW, 0o640)
        _write(dest / "etc/profile", PROFILE, 0o644)
        _write(dest / "etc/hostname", "sandbox\n", 0o644)
        _write(dest / "etc/hosts", HOSTS, 0o644)
        _write(dest / "etc/resolv.conf", _host_resolv_conf(), 0o644)
        os.chown(dest / "home/user", USER_UID, USER_GID)
    except OSError as exc:
        raise HostError(f"cannot build the busybox rootfs in {dest}: {exc}") from exc


def _write(path: Path, text: str, mode: int) -> None:
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)


def _host_resolv_conf() -> str:
    """The host's resolver config as a starting point (what debootstrap does too); empty if none."""
    try:
        return Path("/etc/resolv.conf").read_text()
    except OSError:
        return ""
