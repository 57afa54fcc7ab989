"""The descriptor chain and the walk engine every function of :mod:`warren.trees` is built on."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

__all__ = ["FD_WINDOW", "WalkDir", "walk"]

FD_WINDOW = 64
"""Directory descriptors a walk keeps open at most (plus its root), whatever the depth."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class _Chain:
    """The directories from a root down to the current one: names, identities, and a window of fds.

    Index 0 is the root (its fd stays open). Indices ``low..top`` are open; the ones between were
    closed when the chain grew past the window and are re-opened through ``..`` on the way back up.
    """

    def __init__(self, root_fd: int, window: int | None = None, *, fix_access: bool = False) -> None:
        st = os.fstat(root_fd)
        self._fix_access = fix_access
        self.fds = [root_fd]
        self.stats = [st]
        self.names = [""]
        self._window = max(FD_WINDOW if window is None else window, 2)
        self._low = 1

    @classmethod
    def open(cls, path: str | os.PathLike[str], dir_fd: int | None = None, *, fix_access: bool = False) -> _Chain:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            return cls(fd, fix_access=fix_access)
        except BaseException:
            os.close(fd)
            raise

    @property
    def fd(self) -> int:
        return self.fds[-1]

    @property
    def depth(self) -> int:
        return len(self.fds) - 1

    def relpath(self) -> str:
        return "/".join(self.names[1:])

    def push(self, name: str) -> os.stat_result:
        """Enter subdirectory ``name`` of the current directory (never through a symlink)."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except PermissionError:
            if not self._fix_access:
                raise
            _make_accessible(self.fd, name)  # removal, not root: a directory without r/x for its owner
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fds.append(fd)
        self.stats.append(st)
        self.names.append(name)
        while len(self.fds) - self._low > self._window:
            os.close(self.fds[self._low])
            self.fds[self._low] = -1
            self._low += 1
        return st

    def pop(self) -> None:
        """Go back up to the parent directory."""
        top = len(self.fds) - 1
        if top == 0:
            raise ValueError("the chain is at its root")
        fd = self.fds[top]
        if self.fds[top - 1] < 0:
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            st = os.fstat(parent)
            want = self.stats[top - 1]
            if (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino):
                os.close(parent)
                raise OSError(errno.ESTALE, f"a directory was moved during the walk (below {self.names[top - 1]!r})")
            self.fds[top - 1] = parent
            self._low = top - 1
        os.close(fd)
        del self.fds[top], self.stats[top], self.names[top]

    def close(self) -> None:
        for fd in self.fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fds = []


class WalkDir:
    """One directory of a :func:`walk`; valid until the walk moves on.

    ``dirs`` are its subdirectories (never symlinks); in a top-down walk, removing names from it
    prunes them. ``files`` are its regular files, ``other`` everything else (symlinks, fifos,
    devices, sockets). ``fd`` is an open descriptor of the directory: use it with ``dir_fd=``.
    """

    __slots__ = ("_chain", "depth", "dirs", "files", "other")

    def __init__(self, chain: _Chain, dirs: list[str], files: list[str], other: list[str]) -> None:
        self._chain = chain
        self.depth = chain.depth
        self.dirs = dirs
        self.files = files
        self.other = other

    @property
    def fd(self) -> int:
        """An open descriptor of the directory (the number may change while the walk is below it)."""
        return self._chain.fds[self.depth]

    @property
    def path(self) -> str:
        """The directory's path relative to the root (``""`` for the root). O(depth): use sparingly."""
        return self._chain.relpath()

    @property
    def stat(self) -> os.stat_result:
        """The directory's own ``fstat``, taken when it was entered."""
        return self._chain.stats[self.depth]


def _list(chain: _Chain) -> WalkDir:
    dirs: list[str] = []
    files: list[str] = []
    other: list[str] = []
    with os.scandir(chain.fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            elif entry.is_file(follow_symlinks=False):
                files.append(entry.name)
            else:
                other.append(entry.name)
    return WalkDir(chain, dirs, files, other)


def _dfs(chain: _Chain, *, strict: bool) -> Iterator[tuple[bool, WalkDir]]:
    """Every directory below and including the chain's root, depth first: ``(True, dir)`` when it is
    entered (before its subdirectories; prune ``dir.dirs`` then), ``(False, dir)`` when it is left.

    ``strict``: a subdirectory that cannot be entered, or lies on another filesystem, raises
    ``OSError``; otherwise it is silently not entered (one that vanished is never an error).
    """
    root_dev = chain.stats[0].st_dev
    first = _list(chain)
    yield True, first
    stack: list[tuple[WalkDir, list[str]]] = [(first, first.dirs[::-1])]
    while stack:
        current, pending = stack[-1]
        if not pending:
            yield False, current
            stack.pop()
            if stack:
                chain.pop()
            continue
        name = pending.pop()
        try:
            st = chain.push(name)
        except FileNotFoundError:
            continue
        except OSError:
            if strict:
                raise
            continue
        if st.st_dev != root_dev:
            chain.pop()
            if strict:
                raise OSError(errno.EXDEV, f"a mount point or other filesystem inside the tree: {name!r}")
            continue
        try:
            child = _list(chain)
        except OSError:
            chain.pop()
            if strict:
                raise
            continue
        yield True, child
        stack.append((child, child.dirs[::-1]))


def walk(path: str | os.PathLike[str], *, topdown: bool = True, strict: bool = False) -> Iterator[WalkDir]:
    """Every directory of the tree at ``path`` (itself included), like ``os.walk`` but iterative,
    descriptor-based and never following symlinks (a symlink to a directory is in ``other``).

    Top-down: each directory before its subdirectories (remove names from ``dirs`` to prune);
    bottom-up (``topdown=False``): after them. A missing ``path`` yields nothing. Subdirectories
    that cannot be opened or are on another filesystem are skipped unless ``strict``.
    """
    try:
        chain = _Chain.open(path)
    except FileNotFoundError:
        return
    try:
        for entering, visit in _dfs(chain, strict=strict):
            if entering == topdown:
                yield visit
    finally:
        chain.close()


# Small helpers


def _make_accessible(dir_fd: int, name: str) -> None:
    """Give the owner rwx on directory ``name`` (never through a symlink) so it can be emptied."""
    fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    finally:
        os.close(fd)


def _split(path: str | os.PathLike[str]) -> tuple[str, str]:
    parent, name = os.path.split(os.path.normpath(os.fspath(path)))
    if name in ("", ".", ".."):
        raise ValueError(f"not a removable path: {os.fspath(path)!r}")
    return parent or ".", name
