"""Re-owning a tree in place by an offset (user-namespace id shifts)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ._walk import _PATH_FLAGS, _Chain, _dfs

__all__ = ["shift_owner"]


# ownership shift


def shift_owner(
    path: str | os.PathLike[str],
    delta_uid: int,
    delta_gid: int,
    *,
    within: range,
    within_gid: range | None = None,
) -> int:
    """Re-own the tree at ``path`` (itself included) in place, by an offset, never following symlinks.

    Every entry whose uid is in ``within`` gets uid ``uid + delta_uid``; every entry whose gid is in
    ``within_gid`` (default: ``within``) gets gid ``gid + delta_gid``; ids outside the ranges are
    left as they are. Examples, for a user namespace mapping ids 0..65535 inside to host ``R..R+65535``:

    * ``shift_owner(p, R, R, within=range(0, 65536))``: a tree written on the host as root (ids k)
      becomes the tree that namespace sees as ids k (host ``R + k``);
    * ``shift_owner(p, -R, -R, within=range(R, R + 65536))``: back (host ``R + k`` becomes ``k``),
      e.g. when sealing an upper dir of a user-namespaced sandbox as a layer that is shifted again
      when it is used.

    A shifted id outside ``0 .. 2**32-2`` raises ``ValueError`` (before anything is changed for
    that entry). ``chown`` clears setuid/setgid bits and ``security.capability``; both are put back
    as they were (the capability xattr byte for byte: a v3 capability's namespace root id is not
    rewritten). Returns the number of entries re-owned. Another filesystem below ``path`` raises
    ``OSError`` (``EXDEV``).
    """
    gids = within if within_gid is None else within_gid

    def mapped(st: os.stat_result) -> tuple[int, int]:
        uid = st.st_uid + delta_uid if st.st_uid in within else st.st_uid
        gid = st.st_gid + delta_gid if st.st_gid in gids else st.st_gid
        for value in (uid, gid):
            if not 0 <= value < 2**32 - 1:
                raise ValueError(f"shifting owner {st.st_uid}:{st.st_gid} gives an invalid id {value}")
        return uid, gid

    changed = 0
    chain = _Chain.open(path)
    try:
        root = chain.stats[0]
        if (ids := mapped(root)) != (root.st_uid, root.st_gid):
            _reown_fd(chain.fd, root, ids)
            changed += 1
        for entering, visit in _dfs(chain, strict=True):
            if not entering:
                continue
            for name in (*visit.dirs, *visit.files, *visit.other):
                try:
                    st = os.stat(name, dir_fd=visit.fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                ids = mapped(st)
                if ids == (st.st_uid, st.st_gid):
                    continue
                if stat.S_ISLNK(st.st_mode):
                    os.chown(name, *ids, dir_fd=visit.fd, follow_symlinks=False)
                else:
                    fd = os.open(name, _PATH_FLAGS, dir_fd=visit.fd)
                    try:
                        now = os.fstat(fd)
                        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                            raise OSError(errno.ESTALE, f"{name!r} changed during the walk")
                        _reown_fd(fd, now, ids)
                    finally:
                        os.close(fd)
                changed += 1
    finally:
        chain.close()
    return changed


def _reown_fd(fd: int, st: os.stat_result, ids: tuple[int, int]) -> None:
    """chown the non-symlink behind ``fd`` (any open or ``O_PATH`` fd), keeping mode and capabilities."""
    proc = f"/proc/self/fd/{fd}"
    cap: bytes | None = None
    if stat.S_ISREG(st.st_mode):
        with contextlib.suppress(OSError):
            cap = os.getxattr(proc, "security.capability")
    os.chown(proc, *ids)
    if cap is not None:
        os.setxattr(proc, "security.capability", cap)
    if stat.S_IMODE(st.st_mode) & (stat.S_ISUID | stat.S_ISGID):
        os.chmod(proc, stat.S_IMODE(st.st_mode))
