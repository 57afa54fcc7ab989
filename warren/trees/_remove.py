"""Removing trees (never through a symlink nor into another filesystem), and moving garbage aside."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from pathlib import Path

from ._walk import _DIR_FLAGS, _Chain, _dfs, _make_accessible, _split

__all__ = ["QUARANTINE", "clear_dir", "move_aside", "remove_tree"]

_log = logging.getLogger("warren.trees")
"""One logger for the package, named as when it was one module."""

QUARANTINE = "quarantine"
"""The directory under the state dir that start-up garbage is moved aside into (:func:`move_aside`)."""


# remove


def remove_tree(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> None:
    """Remove ``path`` (relative to ``dir_fd`` if given) and everything below it; a missing ``path``
    is fine, a file or symlink is just unlinked (a symlink is never followed). Read-only directories
    are made writable as needed (root needs no such help). A mount point or another filesystem
    inside the tree raises ``OSError`` (``EXDEV``) before anything on it is touched.
    Immutable/append-only attributes are not handled.
    """
    parent, name = _split(path)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        _remove_entry(pfd, name)
    finally:
        os.close(pfd)


def _remove_entry(parent_fd: int, name: str) -> None:
    """Remove ``name`` in directory ``parent_fd``, whatever it is."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent_fd)
        return
    try:
        chain = _Chain.open(name, dir_fd=parent_fd, fix_access=True)
    except PermissionError:
        _make_accessible(parent_fd, name)
        chain = _Chain.open(name, dir_fd=parent_fd, fix_access=True)
    if chain.stats[0].st_dev != os.fstat(parent_fd).st_dev:
        chain.close()
        raise OSError(errno.EXDEV, f"refusing to remove {name!r}: it is a mount point")
    root_uid = os.geteuid() == 0
    try:
        for entering, visit in _dfs(chain, strict=True):
            if entering:
                if not root_uid and stat.S_IMODE(visit.stat.st_mode) & stat.S_IRWXU != stat.S_IRWXU:
                    os.fchmod(visit.fd, stat.S_IMODE(visit.stat.st_mode) | stat.S_IRWXU)
                for entry in (*visit.files, *visit.other):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=visit.fd)
                visit.files.clear()
                visit.other.clear()
            else:
                for entry in visit.dirs:
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(entry, dir_fd=visit.fd)
    finally:
        chain.close()
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent_fd)


def clear_dir(path: str | os.PathLike[str]) -> None:
    """Remove everything inside directory ``path`` but not ``path`` itself (a missing one is fine)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        with os.scandir(fd) as entries:
            names = [e.name for e in entries]
        for name in names:
            _remove_entry(fd, name)
    finally:
        os.close(fd)


# quarantine


def move_aside(path: str | os.PathLike[str], quarantine_dir: str | os.PathLike[str], reason: str) -> Path | None:
    """Move ``path`` (garbage found in warren's own directories) into ``quarantine_dir`` as
    ``<UTC timestamp>-<name>``: one rename, on the same filesystem, logged as a warning with
    ``reason``. Returns the new path, or None when ``path`` is gone. If the rename fails, the tree is
    removed instead (logged); if that fails too, it is left where it is (logged). Never raises
    ``OSError``: start-up must go on.
    """
    source = Path(path)
    target_dir = Path(quarantine_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    try:
        target_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = target_dir / f"{stamp}-{source.name}"
        n = 1
        while os.path.lexists(target):
            n += 1
            target = target_dir / f"{stamp}-{source.name}.{n}"
        os.rename(source, target)
        _log.warning("moved %s aside to %s: %s", source, target, reason)
        return target
    except OSError as exc:
        if not os.path.lexists(source):
            return None
        _log.warning("cannot move %s aside (%s); removing it: %s", source, exc, reason)
    try:
        remove_tree(source)
    except (OSError, ValueError) as exc:
        _log.error("cannot remove %s either, leaving it: %s", source, exc)
    return None
