"""Directory trees a sandbox may have made: remove, copy, fsync, walk, measure and re-own them safely.

Everything a sandbox writes is hostile, so every function here:

* never follows a symlink (directories are opened ``O_DIRECTORY | O_NOFOLLOW`` relative to their
  parent's descriptor, files ``O_NOFOLLOW``; metadata calls use ``follow_symlinks=False`` or an
  ``O_PATH`` descriptor through ``/proc/self/fd``);
* never recurses in Python: each walk is a loop over an explicit stack, so depth 100000 works;
* never builds a path longer than one name: everything below the root is reached through directory
  descriptors (``dir_fd=``), so trees deeper than ``PATH_MAX`` work;
* keeps at most :data:`FD_WINDOW` directory descriptors open however deep the tree is: descending
  past the window closes the oldest one, and going back up re-opens a closed parent through ``..``
  of its child, checked to be the same directory (``st_dev``/``st_ino``) it was on the way down;
* never crosses into another filesystem below the root (a mount point inside a tree is an error
  for the functions that change or copy it, and is not entered by the ones that only read).

All functions are synchronous (run them with ``asyncio.to_thread``) and raise ``OSError`` for what the
filesystem refuses, plus :class:`TreeLimitExceeded` and :class:`CopyCancelled` from :func:`copy_tree`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from warren.errors import HostError

__all__ = [
    "FD_WINDOW",
    "FSYNC_LIMIT",
    "QUARANTINE",
    "CopyCancelled",
    "OwnerMap",
    "TreeLimitExceeded",
    "WalkDir",
    "copy_tree",
    "fsync_dir",
    "fsync_tree",
    "move_aside",
    "remove_tree",
    "shift_owner",
    "tree_usage",
    "walk",
]

_log = logging.getLogger(__name__)

FD_WINDOW = 64
"""Directory descriptors a walk keeps open at most (plus its root), whatever the depth."""

QUARANTINE = "quarantine"
"""The directory under the state dir that start-up garbage is moved aside into (:func:`move_aside`)."""

FSYNC_LIMIT = 4096
"""Single fsyncs :func:`fsync_tree` makes before it syncs the whole filesystem once instead."""

_LINK_CACHE = 128
"""Hard-linked files whose first copy is remembered (an ``O_PATH`` fd each) to link later names to."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MODE_BITS = 0o7777
_OVERLAY_XATTR = "trusted.overlay."

OwnerMap = Callable[[int, int], tuple[int, int]]
"""``owner(uid, gid) -> (uid, gid)``: the owner a copied entry gets, from the source entry's owner."""


class TreeLimitExceeded(HostError):
    """A tree has more entries than the caller allowed (``max_entries``)."""


class CopyCancelled(Exception):
    """:func:`copy_tree` saw its ``cancel`` event set; what it had made is removed."""


# --------------------------------------------------------------------------------------------
# The descriptor chain and the walk engine


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


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# copy


def copy_tree(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    owner: OwnerMap | None = None,
    max_entries: int | None = None,
    cancel: threading.Event | None = None,
    hardlink: bool = False,
    ignore: Callable[[str], bool] | None = None,
) -> int:
    """Copy the directory ``src`` to ``dst`` (which must not exist, or be an empty directory, whose
    own metadata then becomes ``src``'s, as with ``cp -a --no-target-directory``); return the bytes
    of file data copied.

    Kept: file data (``copy_file_range``, sparse files stay sparse), directories, symlinks (as links, never
    followed), hard links between regular files of the tree (by ``(st_dev, st_ino)``; past
    :data:`_LINK_CACHE` pending inodes further names become copies), fifos, overlayfs whiteouts
    (0/0 character devices, made with ``mknod``), mode bits including setuid/setgid/sticky, access
    and modification times (ns), every xattr including ``trusted.overlay.*`` (opaque dirs).
    Skipped, counted and logged: any other device node, and sockets.

    Ownership: each entry gets ``owner(uid, gid)`` of its source entry's ``(uid, gid)``, or the same
    ids without ``owner``. ``owner`` may raise (e.g. ``ValueError`` for an id outside the range it
    maps); the copy then fails like any other error. Example, a user namespace with host base ``R``:
    ``owner=lambda u, g: (u - R, g - R)`` turns host ``R + k`` into ``k``.

    ``hardlink=True`` (``cp -al``): regular files are hard-linked to the source instead of copied
    (same filesystem only; they share the source's inode, so ``owner`` does not apply to them and
    nothing may write them in place afterwards); everything else is made as above.

    ``ignore(name)``: entries (at any level) whose name it is true for are not copied, nor is
    anything below them.

    ``max_entries`` bounds the number of entries below ``src`` (:class:`TreeLimitExceeded`);
    ``cancel`` is checked before every entry (:class:`CopyCancelled`). On any failure everything the
    copy made is removed (``dst`` too, unless it existed before) and the error is re-raised.
    """
    made = False
    try:
        os.mkdir(dst, 0o700)
        made = True
    except FileExistsError:
        st = os.lstat(dst)
        if not stat.S_ISDIR(st.st_mode):
            raise
        with os.scandir(dst) as entries:
            if any(True for _ in entries):
                raise
    try:
        src_chain = _Chain.open(src)
    except BaseException:
        if made:
            os.rmdir(dst)
        raise
    copier = _Copier(owner, max_entries, cancel, hardlink=hardlink, ignore=ignore)
    try:
        dst_chain = _Chain.open(dst)
        try:
            copier.run(src_chain, dst_chain)
        finally:
            dst_chain.close()
    except BaseException:
        src_chain.close()
        copier.close()
        try:
            if made:
                remove_tree(dst)
            else:
                clear_dir(dst)
        except Exception:
            _log.exception("cannot remove the partial copy %s", os.fspath(dst))
        raise
    src_chain.close()
    copier.close()
    if copier.skipped:
        _log.warning("copy of %s: skipped %d device node(s) or socket(s)", os.fspath(src), copier.skipped)
    return copier.bytes


class _Copier:
    def __init__(self, owner: OwnerMap | None, max_entries: int | None, cancel: threading.Event | None,
                 *, hardlink: bool = False, ignore: Callable[[str], bool] | None = None) -> None:
        self._hardlink = hardlink
        self._ignore = ignore
        self._owner = owner
        self._max = max_entries
        self._cancel = cancel
        self._entries = 0
        self._links: dict[tuple[int, int], list[int]] = {}
        """(st_dev, st_ino) of a source file -> [O_PATH fd of its copy, names still to see]."""
        self._links_full = False
        self.bytes = 0
        self.skipped = 0

    def close(self) -> None:
        for fd, _left in self._links.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._links.clear()

    def _ids(self, st: os.stat_result) -> tuple[int, int]:
        return self._owner(st.st_uid, st.st_gid) if self._owner is not None else (st.st_uid, st.st_gid)

    def _tick(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise CopyCancelled("the copy was cancelled")
        self._entries += 1
        if self._max is not None and self._entries > self._max:
            raise TreeLimitExceeded(f"the tree has more than {self._max} entries")

    def run(self, src: _Chain, dst: _Chain) -> None:
        for entering, visit in _dfs(src, strict=True):
            if entering:
                if self._ignore is not None:
                    for names in (visit.dirs, visit.files, visit.other):
                        names[:] = [n for n in names if not self._ignore(n)]
                if visit.depth > 0:
                    self._tick()
                    name = src.names[-1]
                    os.mkdir(name, 0o700, dir_fd=dst.fd)
                    dst.push(name)
                for name in visit.files:
                    self._tick()
                    self._file(visit.fd, dst.fd, name)
                for name in visit.other:
                    self._tick()
                    self._special(visit.fd, dst.fd, name)
                visit.files.clear()
                visit.other.clear()
            else:
                st = src.stats[-1]
                _set_metadata(dst.fd, st, self._ids(st), xattrs_from=src.fd)
                if visit.depth > 0:
                    dst.pop()

    def _file(self, sdir: int, ddir: int, name: str) -> None:
        st = os.stat(name, dir_fd=sdir, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            self._special(sdir, ddir, name)
            return
        if self._hardlink:
            os.link(name, name, src_dir_fd=sdir, dst_dir_fd=ddir, follow_symlinks=False)
            return
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and (seen := self._links.get(key)) is not None:
            os.link(f"/proc/self/fd/{seen[0]}", name, dst_dir_fd=ddir, follow_symlinks=True)
            seen[1] -= 1
            if seen[1] <= 0:
                os.close(seen[0])
                del self._links[key]
            return
        sfd = os.open(name, _READ_FLAGS, dir_fd=sdir)
        try:
            now = os.fstat(sfd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != key:
                raise OSError(errno.ESTALE, f"{name!r} changed during the copy")
            dfd = os.open(name, _WRITE_FLAGS, 0o600, dir_fd=ddir)
            try:
                self.bytes += _copy_data(sfd, dfd)
                _set_metadata(dfd, now, self._ids(now), xattrs_from=sfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        if st.st_nlink > 1:
            self._remember(key, ddir, name, st.st_nlink - 1)

    def _remember(self, key: tuple[int, int], ddir: int, name: str, left: int) -> None:
        if len(self._links) >= _LINK_CACHE:
            if not self._links_full:
                _log.info("more than %d hard-linked files pending: further links are copied", _LINK_CACHE)
                self._links_full = True
            return
        self._links[key] = [os.open(name, _PATH_FLAGS, dir_fd=ddir), left]

    def _special(self, sdir: int, ddir: int, name: str) -> None:
        st = os.stat(name, dir_fd=sdir, follow_symlinks=False)
        mode = st.st_mode
        if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
            raise OSError(errno.ESTALE, f"{name!r} changed type during the copy")
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=sdir), name, dir_fd=ddir)
        elif stat.S_ISFIFO(mode):
            os.mkfifo(name, 0o600, dir_fd=ddir)
        elif stat.S_ISCHR(mode) and st.st_rdev == 0:
            os.mknod(name, stat.S_IFCHR | 0o600, 0, dir_fd=ddir)  # an overlayfs whiteout
        else:
            self.skipped += 1
            return
        uid, gid = self._ids(st)
        os.chown(name, uid, gid, dir_fd=ddir, follow_symlinks=False)
        sfd = os.open(name, _PATH_FLAGS, dir_fd=sdir)
        try:
            dfd = os.open(name, _PATH_FLAGS, dir_fd=ddir)
            try:
                _copy_xattrs(f"/proc/self/fd/{sfd}", f"/proc/self/fd/{dfd}")
                if not stat.S_ISLNK(mode):
                    os.chmod(f"/proc/self/fd/{dfd}", stat.S_IMODE(mode))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=ddir, follow_symlinks=False)


def _copy_data(sfd: int, dfd: int) -> int:
    """Copy the regular file ``sfd`` into the new, empty ``dfd`` with the same size; return the bytes
    of data copied.

    Sparse-aware (``SEEK_DATA``/``SEEK_HOLE``): only data segments are copied and holes stay holes, so
    a file whose size is a terabyte but which holds no data (a sandbox can make one for free) costs
    nothing in the copy either. The size is the file's end when the copy starts, not a stat from
    earlier. The kernel moves the bytes (``copy_file_range``) where it can, else ``pread``/``pwrite``.
    """
    end = os.lseek(sfd, 0, os.SEEK_END)
    total = 0
    offset = 0
    while offset < end:
        try:
            start = os.lseek(sfd, offset, os.SEEK_DATA)
            stop = min(os.lseek(sfd, start, os.SEEK_HOLE), end)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # nothing but a hole up to the end
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            start, stop = offset, end  # no hole support: all of it is data
        if start >= end:
            break
        total += _copy_range(sfd, dfd, start, stop - start)
        offset = stop
    os.ftruncate(dfd, end)
    return total


def _copy_range(sfd: int, dfd: int, offset: int, count: int) -> int:
    done = 0
    try:
        while done < count:
            n = os.copy_file_range(sfd, dfd, count - done, offset + done, offset + done)
            if n == 0:
                return done  # the file shrank
            done += n
        return done
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
            raise
    while done < count:
        data = os.pread(sfd, min(1 << 20, count - done), offset + done)
        if not data:
            break
        view = memoryview(data)
        pos = offset + done
        while view:
            written = os.pwrite(dfd, view, pos)
            view, pos = view[written:], pos + written
        done += len(data)
    return done


def _set_metadata(fd: int, st: os.stat_result, ids: tuple[int, int], *, xattrs_from: int) -> None:
    """Owner, xattrs, mode, times onto the open file or directory ``fd``, in the order that keeps them
    (chown clears setuid/setgid and capabilities, so it goes first; times go last)."""
    os.fchown(fd, *ids)
    _copy_xattrs(xattrs_from, fd)
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_xattrs(src: int | str, dst: int | str) -> None:
    """Every xattr of ``src`` onto ``dst`` (fds, or ``/proc/self/fd/N`` of ``O_PATH`` fds).

    ``trusted.overlay.*`` must arrive (overlayfs semantics depend on it); others the destination
    filesystem refuses (as ``cp -a`` does) are dropped with a debug log.
    """
    try:
        names = os.listxattr(src)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise
    for name in names:
        try:
            value = os.getxattr(src, name)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                continue
            raise
        try:
            os.setxattr(dst, name, value)
        except OSError as exc:
            if name.startswith(_OVERLAY_XATTR) or exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
                raise
            _log.debug("xattr %s not copied: %s", name, exc)


# --------------------------------------------------------------------------------------------
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
