"""Files the node keeps for one sandbox's guest: its boot id, and the ``/tmp`` of its rootfs.

E2B's rule for ``/proc/sys/kernel/random/boot_id``: each sandbox boots with its own; a memory pause and
resume keeps it (the same boot continues), a cold start (a filesystem-only pause, a sandbox made from a
snapshot or a fork) gets a new one. runc shows the host's file, so the node writes one per sandbox and
the runtime binds it over procfs's (:mod:`warren.runtime.oci.spec`).

``/tmp`` is a directory of the rootfs, on the sandbox's disk, as in E2B: what a template build writes
there is in every sandbox made from the template, and snapshots, forks and pauses keep it.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

from warren.runtime.userns import UidRange

__all__ = ["TMP_MODE", "ensure_rootfs_tmp", "write_boot_id"]

TMP_MODE = 0o1777


def write_boot_id(path: Path, owner: UidRange | None, *, fresh: bool) -> str:
    """A new boot id in ``path`` when ``fresh`` or when there is none yet; returns the id in the file.

    Atomic (temp file, rename); read-only, owned by the sandbox's root when it has a user namespace
    (its runtime binds the file from inside that namespace)."""
    if not fresh:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
    boot_id = str(uuid.uuid4())
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    try:
        os.write(fd, f"{boot_id}\n".encode())
        if owner is not None:
            os.fchown(fd, owner.host, owner.host)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return boot_id


def ensure_rootfs_tmp(rootfs: Path, owner: UidRange | None) -> Path | None:
    """The rootfs's ``/tmp`` directory, made (mode 1777, the sandbox root's) when it has none.

    None when ``/tmp`` is not a directory (a symlink or file the sandbox made): it is never followed on
    the host; the sandbox keeps what it made. Call it only while nothing runs in the sandbox."""
    tmp = rootfs / "tmp"
    try:
        st = os.lstat(tmp)
    except FileNotFoundError:
        os.mkdir(tmp, TMP_MODE)
        os.chmod(tmp, TMP_MODE, follow_symlinks=False)  # mkdir's mode is masked by the umask
        if owner is not None:
            os.chown(tmp, owner.host, owner.host, follow_symlinks=False)
        return tmp
    return tmp if stat.S_ISDIR(st.st_mode) else None
