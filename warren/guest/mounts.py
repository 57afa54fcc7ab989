"""Which filesystem a path is on, from ``/proc/self/mountinfo`` (the agent is stdlib only: no statfs).

envd refuses to watch a directory on a network filesystem (NFS, CIFS/SMB, FUSE: its events are
unreliable there) unless the watch sets ``allow_network_mounts`` (envd >= 0.6.4)."""

from __future__ import annotations

import os
import re

__all__ = ["NETWORK_TYPES", "filesystem_type", "is_network_mount"]

NETWORK_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse", "fuseblk"})
"""The mount types behind the superblock magics envd checks (NFS, CIFS, SMB, SMB2, FUSE)."""
MOUNTINFO = "/proc/self/mountinfo"
MAX_MOUNTINFO = 4 << 20
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: str, mountinfo: str) -> str | None:
    """The type of the mount holding ``path`` (absolute, symlinks resolved) in ``mountinfo``'s text:
    the last-mounted one at the longest mount point above it; None when no line matches."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        point = _unescape(fields[4])
        inside = path == point or point == "/" or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), rest[0])
    return best[1] if best else None


def is_network_mount(path: str) -> bool:
    """Whether ``path`` is on a network filesystem of this mount namespace (fuse.* subtypes too)."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as fh:
            text = fh.read(MAX_MOUNTINFO)
    except OSError:
        return False
    kind = filesystem_type(os.path.realpath(path), text)
    return kind is not None and (kind in NETWORK_TYPES or kind.startswith("fuse."))
