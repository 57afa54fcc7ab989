"""The sealed state dir: nothing under it is reachable by host accounts other than root.

Every entry directly under the state dir is ``0700`` (dirs) or ``0600`` (files: the API key, the
database with every access token and env var, the runtime index). Two dirs are ``0711``, searchable but
not listable, because a runc sandbox's runtime resolves its bundle as the sandbox's own unprivileged root
(its user namespace range): the state dir itself and ``sandboxes/``; each ``sandboxes/<id>`` is ``0700``
and owned by that range (gVisor's: by root). Modes deeper down are the sandboxes' own business: no host
account can reach them.

:func:`seal_state_dir` runs at every start: it makes the top-level dirs that components create lazily
(so they are never born world-readable) and fixes, with a warning, any mode that drifted.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["SEARCHABLE", "TOP_LEVEL_DIRS", "seal_state_dir"]

log = logging.getLogger(__name__)

SEARCHABLE = 0o711
TOP_LEVEL_DIRS = ("assets", "disk-templates", "images", "layers", "probe", "quarantine", "runtime", "sandboxes",
                  "snapshots", "uploads")
"""Made at start with their final modes, before any component writes into them."""
_SEARCHABLE_NAMES = frozenset({"sandboxes"})


def _wanted(entry: Path, st: os.stat_result) -> int:
    if stat.S_ISDIR(st.st_mode):
        return SEARCHABLE if entry.name in _SEARCHABLE_NAMES else 0o700
    return 0o600


def seal_state_dir(state_dir: Path) -> list[str]:
    """Create the state dir's top-level dirs, fix every top-level mode; return what was fixed."""
    state_dir.mkdir(mode=SEARCHABLE, parents=True, exist_ok=True)
    for name in TOP_LEVEL_DIRS:
        (state_dir / name).mkdir(mode=0o700, exist_ok=True)
    fixed = []
    for path in [state_dir, *state_dir.iterdir()]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue  # never followed; warren makes no links here
        want = SEARCHABLE if path == state_dir else _wanted(path, st)
        have = stat.S_IMODE(st.st_mode)
        if have != want:
            os.chmod(path, want)
            fixed.append(f"{path.name or path} {oct(have)} -> {oct(want)}")
    if fixed:
        log.warning("state dir %s: fixed modes that let host accounts in: %s", state_dir, "; ".join(fixed))
    return fixed
