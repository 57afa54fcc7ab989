"""Durability and size of trees: fsync one directory or a whole tree (bounded), and disk usage."""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from ._walk import _READ_FLAGS, _Chain, _dfs, walk

__all__ = ["FSYNC_LIMIT", "fsync_dir", "fsync_tree", "tree_usage"]

FSYNC_LIMIT = 4096
"""Single fsyncs :func:`fsync_tree` makes before it syncs the whole filesystem once instead."""


# fsync


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync one directory (makes a create, rename or unlink inside it durable). The only function
    here that follows a symlink (as the last component of ``path``): callers name warren's own
    directories, which may be configured as symlinks (a state or cache dir), and fsync changes nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike[str], *, max_fsyncs: int = FSYNC_LIMIT) -> None:
    """Make the tree at ``path`` durable: fsync every regular file and every directory (itself included).

    Bounded: after ``max_fsyncs`` single fsyncs the walk stops and one ``syncfs`` of the tree's
    filesystem covers the rest (a sandbox can make 100000 directories; one journal commit each would
    take minutes). Symlinks, fifos, sockets and device nodes are never opened (nothing to sync, and
    opening a device may have effects); a file is opened ``O_NOFOLLOW | O_NONBLOCK`` and checked to be
    a regular file before it is synced.
    """
    chain = _Chain.open(path)
    done = 0
    try:
        for entering, visit in _dfs(chain, strict=True):
            if done >= max_fsyncs:
                _syncfs(chain.fds[0])
                return
            if entering:
                for name in visit.files:
                    try:
                        fd = os.open(name, _READ_FLAGS, dir_fd=visit.fd)
                    except OSError as exc:
                        if exc.errno in (errno.ENOENT, errno.ELOOP):
                            continue  # gone, or replaced by a symlink
                        raise
                    try:
                        if stat.S_ISREG(os.fstat(fd).st_mode):
                            os.fsync(fd)
                            done += 1
                    finally:
                        os.close(fd)
            else:
                os.fsync(visit.fd)
                done += 1
    finally:
        chain.close()


def _syncfs(fd: int) -> None:
    """``syncfs(2)``: write back everything of the filesystem ``fd`` is on."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# usage


def tree_usage(path: str | os.PathLike[str]) -> int:
    """Bytes allocated on disk (``st_blocks * 512``) by every entry below ``path`` (not ``path``
    itself), symlinks not followed, other filesystems not entered. Never raises for what it cannot
    read (a missing ``path`` is 0): it is a measurement, not a check."""
    total = 0
    try:
        for visit in walk(path):
            for name in (*visit.dirs, *visit.files, *visit.other):
                try:
                    total += os.stat(name, dir_fd=visit.fd, follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    except OSError:
        pass  # the root is not a directory (or went away)
    return total
