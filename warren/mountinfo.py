"""The one reader of ``/proc/<pid>/mountinfo`` (proc(5)): which mounts a mount namespace has.

A line is ``id parent major:minor root point options [optional fields...] - fstype source super-options``.
The kernel writes space, tab, newline and backslash in paths as octal escapes (``\\040``), and overlayfs
also escapes ``,`` and ``=`` in its option values, so options are split on ``,`` first and unescaped after.

The table is text the kernel writes, but its paths come from whoever mounted: a sandbox's own mounts
show up in ``/proc/<its pid>/mountinfo``. Nothing here follows a path; callers compare strings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SELF", "Mount", "parse_mounts", "points_under", "read_mounts", "unescape"]

SELF = Path("/proc/self/mountinfo")
"""The mount table of this process's mount namespace."""

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of a mount table, unescaped."""

    point: Path
    fstype: str
    source: str
    super_options: tuple[str, ...]
    """The filesystem's own options (``lowerdir=...``, ``upperdir=...``, cgroup controllers), each unescaped."""

    def option(self, name: str) -> str | None:
        """The value of super option ``name=value``; ``""`` for a bare flag ``name``; None when absent."""
        for item in self.super_options:
            key, sep, value = item.partition("=")
            if key == name:
                return value if sep else ""
        return None


def unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """The mounts of a mount table's text, in its order (parents before children); malformed lines are skipped."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split(" ")
        if len(fields) < 5:
            continue
        fstype, source, options = ([*tail.split(" "), "", "", ""] if sep else ["", "", ""])[:3]
        mounts.append(
            Mount(
                point=Path(unescape(fields[4])),
                fstype=unescape(fstype),
                source=unescape(source),
                super_options=tuple(unescape(o) for o in options.split(",") if o),
            )
        )
    return mounts


def read_mounts(path: Path = SELF) -> list[Mount]:
    """The mounts in the table at ``path`` (another process's: ``/proc/<pid>/mountinfo``). Raises ``OSError``.

    Decoded as file names are (undecodable bytes kept as surrogates), so a path compares equal to the
    same path from ``os.fsdecode``."""
    return parse_mounts(os.fsdecode(path.read_bytes()))


def points_under(root: str | os.PathLike[str], mounts: Iterable[Mount]) -> list[Path]:
    """Mount points at or below ``root`` (compared as strings: ``root`` is not resolved), in table order."""
    top = os.fspath(root).rstrip("/")
    return [m.point for m in mounts if str(m.point) == top or str(m.point).startswith(top + "/")]
