"""Copying trees: data (sparse-aware), links, whiteouts, owners, modes, times and xattrs."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
from collections.abc import Callable

from warren.errors import HostError

from ._remove import clear_dir, remove_tree
from ._walk import _PATH_FLAGS, _READ_FLAGS, _Chain, _dfs

__all__ = ["CopyCancelled", "OwnerMap", "TreeLimitExceeded", "copy_tree"]

_log = logging.getLogger("warren.trees")
"""One logger for the package, named as when it was one module."""

_LINK_CACHE = 128
"""Hard-linked files whose first copy is remembered (an ``O_PATH`` fd each) to link later names to."""

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OVERLAY_XATTR = "trusted.overlay."

OwnerMap = Callable[[int, int], tuple[int, int]]
"""``owner(uid, gid) -> (uid, gid)``: the owner a copied entry gets, from the source entry's owner."""


class TreeLimitExceeded(HostError):
    """A tree has more entries than the caller allowed (``max_entries``)."""


class CopyCancelled(Exception):
    """:func:`copy_tree` saw its ``cancel`` event set; what it had made is removed."""


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
