"""Safe unpacking of one layer tar into its own directory, OCI whiteouts turned into overlayfs ones.

Safety rules (violations raise ``UnsafeLayerError`` and leave nothing behind):

* member names are relative, without ``..``; every parent is opened component by component with
  ``O_NOFOLLOW`` from the layer directory, so a member can never be written through a symlink
  (a symlinked parent is refused, wherever the symlink points);
* hard links must name an earlier, non-directory member of the same layer;
* character and block devices are not created, nor hard links to them: they are dropped and
  reported (:func:`unpack_layer` returns their names; the pull log shows them), as rootless container
  engines do. Images made from debootstrap trees carry ``/dev/console`` and friends, and a sandbox
  gets its own ``/dev``. FIFOs are allowed (harmless, some images ship them);
* ``trusted.*`` / ``security.*`` xattrs from the tar are dropped (a layer must not smuggle overlayfs
  metadata such as ``trusted.overlay.redirect``); ``user.*`` and ``security.capability`` are kept.

Whiteouts: ``<dir>/.wh.<name>`` becomes a 0/0 character device ``<dir>/<name>``; ``<dir>/.wh..wh..opq``
sets ``trusted.overlay.opaque=y`` on ``<dir>``; other ``.wh..wh.*`` (aufs bookkeeping) are skipped.
The only device nodes in a layer directory are therefore our own whiteouts.

The diffID (sha256 of the uncompressed tar) is computed while unpacking and checked at the end.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import zlib
from pathlib import Path

from warren import trees
from warren.errors import HostError
from warren.images.errors import DigestMismatchError, LayerTooLargeError, UnsafeLayerError, UnsupportedImageError

OPAQUE_XATTR = "trusted.overlay.opaque"
WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
_KEPT_XATTRS = ("user.",)
_KEPT_XATTR_NAMES = frozenset({"security.capability"})
_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SYNC_TIMEOUT_S = 600


class UnpackCancelled(Exception):
    """The unpack was asked to stop (its pull was cancelled)."""


class _HashingReader(io.RawIOBase):
    """Reads the decompressed stream for tarfile and hashes every byte (the diffID)."""

    def __init__(self, raw: io.BufferedIOBase, diff_id: str = "", max_bytes: int | None = None) -> None:
        self._raw = raw
        self.hasher = hashlib.sha256()
        self._diff_id = diff_id
        self._max_bytes = max_bytes
        self.count = 0
        """Uncompressed bytes read so far: the size that counts, whatever the tar headers claim."""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.count += len(data)
        if self._max_bytes is not None and self.count > self._max_bytes:
            raise LayerTooLargeError(
                f"layer {self._diff_id} unpacks to more than this node accepts ({self._max_bytes} bytes "
                "uncompressed; WARREN_MAX_LAYER_UNPACKED_BYTES)"
            )
        self.hasher.update(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def unpack_layer(
    blob: Path, dest: Path, diff_id: str, cancel: threading.Event | None = None, max_bytes: int | None = None
) -> list[str]:
    """Unpack layer ``blob`` (gzip or plain tar, detected by magic) into the new directory ``dest``.

    Returns the names of the device nodes (and hard links to them) that were dropped, in tar order.

    ``dest`` must not exist. On any failure it is removed again. Raises ``UnsafeLayerError``,
    ``UnsupportedImageError`` (zstd), ``DigestMismatchError`` (diffID), ``HostError`` (disk),
    ``UnpackCancelled``, ``LayerTooLargeError`` (more than ``max_bytes`` of uncompressed tar).
    """
    try:
        os.mkdir(dest, 0o755)
    except OSError as exc:
        raise HostError(f"cannot create layer directory {dest}: {exc}") from exc
    try:
        with open(blob, "rb") as raw:
            magic = raw.read(4)
            raw.seek(0)
            if magic[:4] == b"\x28\xb5\x2f\xfd":
                raise UnsupportedImageError(
                    f"layer {diff_id} is zstd-compressed; only gzip and plain tar are supported"
                )
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if magic[:2] == b"\x1f\x8b" else raw
            reader = _HashingReader(stream, diff_id, max_bytes)
            root_fd = os.open(dest, _DIR_FLAGS)
            try:
                extractor = _Extractor(root_fd, cancel)
                extractor.run(reader)
            finally:
                os.close(root_fd)
        actual = "sha256:" + reader.hasher.hexdigest()
        if actual != diff_id:
            raise DigestMismatchError(f"layer unpacks to diffID {actual}, but the image config says {diff_id}")
        subprocess.run(["sync", "--file-system", str(dest)], check=False, timeout=_SYNC_TIMEOUT_S)
        return extractor.dropped
    except BaseException as exc:
        with contextlib.suppress(OSError):
            trees.remove_tree(dest)
        if isinstance(exc, (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)):
            raise UnsafeLayerError(f"layer {diff_id} is not a valid (gzipped) tar archive: {exc}") from exc
        if isinstance(exc, OSError):
            raise HostError(f"cannot unpack layer {diff_id} into {dest}: {exc}") from exc
        raise


def _member_parts(name: str, what: str) -> list[str]:
    """The path components of a member name, refusing absolute paths, ``..`` and NUL."""
    if "\x00" in name:
        raise UnsafeLayerError(f"{what} {name!r} contains a NUL byte")
    if name.startswith("/"):
        raise UnsafeLayerError(f"{what} {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeLayerError(f"{what} {name!r} contains '..'")
    return parts


class _Extractor:
    def __init__(self, root_fd: int, cancel: threading.Event | None) -> None:
        self._root = root_fd
        self._cancel = cancel
        self._dir_times: list[tuple[list[str], float]] = []
        self.dropped: list[str] = []
        """Device members (and hard links to them) not created, in tar order."""
        self._dropped_paths: set[str] = set()

    def run(self, reader: _HashingReader) -> None:
        with tarfile.open(fileobj=reader, mode="r|", bufsize=_CHUNK) as tar:
            for member in tar:
                if self._cancel is not None and self._cancel.is_set():
                    raise UnpackCancelled()
                self._member(tar, member)
        reader.drain()
        for parts, mtime in reversed(self._dir_times):
            try:
                fd = self._open_dir(parts, create=False)
            except UnsafeLayerError:
                continue  # replaced by a later member
            try:
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)

    def _open_dir(self, parts: list[str], *, create: bool) -> int:
        """An fd of directory ``parts`` under the layer root, never following a symlink."""
        fd = os.dup(self._root)
        try:
            for i, comp in enumerate(parts):
                try:
                    nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise UnsafeLayerError(f"'{'/'.join(parts[: i + 1])}' does not exist in the layer") from None
                    os.mkdir(comp, 0o755, dir_fd=fd)
                    nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    st = os.stat(comp, dir_fd=fd, follow_symlinks=False)
                    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
                    raise UnsafeLayerError(
                        f"parent '{'/'.join(parts[: i + 1])}' is {kind}; refusing to write through it"
                    ) from None
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _member(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        parts = _member_parts(m.name, "member")
        if not parts:
            if not m.isdir():
                raise UnsafeLayerError(f"member {m.name!r} names the layer root but is not a directory")
            self._apply_dir_attrs(self._root, [], m)
            return
        base = parts[-1]
        if base.startswith(WHITEOUT_PREFIX):
            self._whiteout(parts)
            return
        if m.ischr() or m.isblk() or (m.islnk() and self._links_to_dropped(m)):
            self._drop_device(parts, m.name)
            return
        self._dropped_paths.discard("/".join(parts))
        if not (m.isdir() or m.isreg() or m.issym() or m.islnk() or m.isfifo()):
            raise UnsafeLayerError(f"member {m.name!r} has unsupported tar type {m.type!r}")
        pfd = self._open_dir(parts[:-1], create=True)
        try:
            if m.isdir():
                if not _clear(pfd, base, keep_dir=True):
                    os.mkdir(base, 0o700, dir_fd=pfd)
                fd = os.open(base, _DIR_FLAGS, dir_fd=pfd)
                try:
                    self._apply_dir_attrs(fd, parts, m)
                finally:
                    os.close(fd)
            elif m.isreg():
                self._regular(tar, m, pfd, base)
            elif m.issym():
                _clear(pfd, base)
                os.symlink(m.linkname, base, dir_fd=pfd)
                os.chown(base, m.uid, m.gid, dir_fd=pfd, follow_symlinks=False)
                os.utime(base, (m.mtime, m.mtime), dir_fd=pfd, follow_symlinks=False)
            elif m.islnk():
                self._hardlink(m, pfd, base)
            else:
                _clear(pfd, base)
                os.mkfifo(base, 0o600, dir_fd=pfd)
                fd = os.open(base, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
                try:
                    self._apply_attrs(fd, m)
                finally:
                    os.close(fd)
        finally:
            os.close(pfd)

    def _links_to_dropped(self, m: tarfile.TarInfo) -> bool:
        return "/".join(_member_parts(m.linkname, f"hard link {m.name!r} -> target")) in self._dropped_paths

    def _drop_device(self, parts: list[str], name: str) -> None:
        """Record ``name`` as dropped; an earlier member at its path goes (the tar would replace it).

        Nothing is created, not even the parent directories; a parent that is missing, a symlink or
        not a directory means there is nothing of ours to remove.
        """
        self.dropped.append(name)
        self._dropped_paths.add("/".join(parts))
        try:
            pfd = self._open_dir(parts[:-1], create=False)
        except UnsafeLayerError:
            return
        try:
            _clear(pfd, parts[-1])
        finally:
            os.close(pfd)

    def _whiteout(self, parts: list[str]) -> None:
        base = parts[-1]
        if base.startswith(WHITEOUT_PREFIX + WHITEOUT_PREFIX):
            if base == OPAQUE_MARKER:
                fd = self._open_dir(parts[:-1], create=True)
                try:
                    os.setxattr(fd, OPAQUE_XATTR, b"y")
                finally:
                    os.close(fd)
            return  # other .wh..wh.* entries are aufs bookkeeping
        target = base[len(WHITEOUT_PREFIX) :]
        if target in ("", ".", ".."):
            raise UnsafeLayerError(f"whiteout {'/'.join(parts)!r} names no file")
        pfd = self._open_dir(parts[:-1], create=True)
        try:
            _clear(pfd, target)
            os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=pfd)
        finally:
            os.close(pfd)

    def _regular(self, tar: tarfile.TarFile, m: tarfile.TarInfo, pfd: int, base: str) -> None:
        _clear(pfd, base)
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        with os.fdopen(fd, "wb") as out:
            src = tar.extractfile(m)
            if src is not None:
                shutil.copyfileobj(src, out, _CHUNK)
            out.flush()
            self._apply_attrs(out.fileno(), m)
            os.utime(out.fileno(), (m.mtime, m.mtime))

    def _hardlink(self, m: tarfile.TarInfo, pfd: int, base: str) -> None:
        target = _member_parts(m.linkname, f"hard link {m.name!r} -> target")
        if not target:
            raise UnsafeLayerError(f"hard link {m.name!r} points at the layer root")
        tfd = self._open_dir(target[:-1], create=False)
        try:
            try:
                st = os.stat(target[-1], dir_fd=tfd, follow_symlinks=False)
            except FileNotFoundError:
                raise UnsafeLayerError(
                    f"hard link {m.name!r} -> {m.linkname!r}: target is not an earlier member of this layer"
                ) from None
            if stat.S_ISDIR(st.st_mode):
                raise UnsafeLayerError(f"hard link {m.name!r} -> {m.linkname!r} points at a directory")
            if (st.st_dev, st.st_ino) == _stat_or_none(pfd, base):
                return
            _clear(pfd, base)
            os.link(target[-1], base, src_dir_fd=tfd, dst_dir_fd=pfd, follow_symlinks=False)
        finally:
            os.close(tfd)

    def _apply_dir_attrs(self, fd: int, parts: list[str], m: tarfile.TarInfo) -> None:
        self._apply_attrs(fd, m)
        self._dir_times.append((parts, m.mtime))

    @staticmethod
    def _apply_attrs(fd: int, m: tarfile.TarInfo) -> None:
        """Owner, then mode (chown clears set-id bits), then the xattrs we keep."""
        os.fchown(fd, m.uid, m.gid)
        os.fchmod(fd, stat.S_IMODE(m.mode))
        for key, value in m.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            name = key[len("SCHILY.xattr.") :]
            if name.startswith(_KEPT_XATTRS) or name in _KEPT_XATTR_NAMES:
                os.setxattr(fd, name, value.encode("utf-8", "surrogateescape"))


def _stat_or_none(dir_fd: int, name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _clear(dir_fd: int, name: str, *, keep_dir: bool = False) -> bool:
    """Remove whatever ``name`` is in ``dir_fd`` (a later tar member replaces an earlier one).

    With ``keep_dir``, an existing directory stays and True is returned.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        if keep_dir:
            return True
        trees.remove_tree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
    return False


def describe_dropped(names: list[str], shown: int = 8) -> str:
    """One line for the pull log about the device nodes a layer had and did not get."""
    n = len(names)
    listed = ", ".join(names[:shown]) + (f", and {n - shown} more" if n > shown else "")
    return f"{n} device node{'s' if n != 1 else ''} not created (sandboxes get their own /dev): {listed}"


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below (no error if it is gone); ``HostError`` on failure."""
    try:
        trees.remove_tree(path)
    except OSError as exc:
        raise HostError(f"cannot remove {path}: {exc}") from exc


__all__ = ["OPAQUE_XATTR", "UnpackCancelled", "describe_dropped", "remove_tree", "unpack_layer"]
