"""Objects as files under a directory: a filesystem every node mounts at the same place (NFS, CephFS).

    <root>/<key>              one file per object; ``a/b/c`` is the file ``c`` in directories ``a/b``
    <root>/.tmp/<random>      puts in progress (another node's too: never swept while young)

Every put writes a temp file in ``.tmp`` (same filesystem), fsyncs it, renames it over the key and
fsyncs the key's directory: a reader on any node sees the old file or the new one, and a crash leaves
at worst a temp file, which :data:`STALE_TMP_S` later the next store to open the root removes.

Everything below the root is reached through directory descriptors opened ``O_NOFOLLOW`` one
component at a time, and files are opened ``O_NOFOLLOW`` and checked to be regular: a symlink planted
in the store (by anyone who can write the mount) is an error, never a way out of it. The root itself
may be a symlink (configuration). A delete removes directories it emptied, so the tree holds only
keys that exist; a put that races such a removal retries on a fresh path.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ...errors import HostError, InvalidRequestError, NotFoundError, UnavailableError
from .objects import LIST_LIMIT, ObjectTooLargeError, Stopped, check_key, check_prefix, run_in_thread

__all__ = ["STALE_TMP_S", "DirObjectStore"]

TMP = ".tmp"
STALE_TMP_S = 24 * 3600.0
"""A temp file this old is a put that crashed (a live one takes minutes at most): removed at open."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
_PUT_ATTEMPTS = 3
_UNAVAILABLE = {errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ENOTCONN, errno.ESTALE, errno.ECONNREFUSED}


class _Missing(Exception):
    """A directory on the way to a key does not exist (internal: the key has no object)."""


@contextlib.contextmanager
def _mapped(op: str, key: str) -> Iterator[None]:
    """The one place ``OSError`` becomes a warren error for this backend."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _UNAVAILABLE:
            raise UnavailableError(f"shared store: {op} {key!r}: {exc.strerror}") from exc
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HostError(f"shared store: {op} {key!r}: a symlink or a file where a directory belongs") from exc
        raise HostError(f"shared store: {op} {key!r}: {exc}") from exc


class DirObjectStore:
    """An :class:`~.objects.ObjectStore` on a directory (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with _mapped("open", str(root)):
            (root / TMP).mkdir(parents=True, exist_ok=True, mode=0o700)
            self._sweep()

    def __repr__(self) -> str:
        return f"DirObjectStore({str(self.root)!r})"

    # the ObjectStore protocol

    async def put_file(self, key: str, src: Path) -> None:
        check_key(key)

        def put(stop: threading.Event) -> None:
            def fill(out: BinaryIO) -> None:
                with open(src, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        if stop.is_set():
                            raise Stopped
                        out.write(chunk)

            self._put(key, fill)

        await run_in_thread(put)

    async def put_bytes(self, key: str, data: bytes) -> None:
        check_key(key)

        def fill(out: BinaryIO) -> None:
            out.write(data)

        await run_in_thread(lambda stop: self._put(key, fill))

    async def get_file(self, key: str, dest: Path, *, max_bytes: int) -> None:
        check_key(key)

        def get(stop: threading.Event) -> None:
            def sink(chunk: bytes) -> None:
                if stop.is_set():
                    raise Stopped
                out.write(chunk)

            with open(dest, "wb") as out:
                try:
                    self._get(key, max_bytes, sink)
                    out.flush()
                except BaseException:
                    os.unlink(dest)
                    raise

        await run_in_thread(get)

    async def get_bytes(self, key: str, *, max_bytes: int) -> bytes | None:
        check_key(key)

        def get(stop: threading.Event) -> bytes | None:
            chunks: list[bytes] = []
            try:
                self._get(key, max_bytes, chunks.append)
            except NotFoundError:
                return None
            return b"".join(chunks)

        return await run_in_thread(get)

    async def delete(self, key: str) -> None:
        check_key(key)
        await run_in_thread(lambda stop: self._delete(key))

    async def list(self, prefix: str) -> builtins.list[str]:
        check_prefix(prefix)
        return await run_in_thread(lambda stop: self._list(prefix))

    # the synchronous work, in a thread

    def _sweep(self) -> None:
        """Remove temp files of puts that crashed long ago (young ones may be another node's put)."""
        now = time.time()
        with os.scandir(self.root / TMP) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S and not entry.is_dir(
                        follow_symlinks=False
                    ):
                        os.unlink(entry.path)

    @contextlib.contextmanager
    def _dirs(self, parts: builtins.list[str], *, create: bool) -> Iterator[builtins.list[int]]:
        """Descriptors of the root and of each directory in ``parts`` (made when ``create``), opened
        ``O_NOFOLLOW`` one below the other; :class:`_Missing` when one is absent and not ``create``."""
        fds = [os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            for part in parts:
                try:
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fds[-1])
                except FileNotFoundError:
                    if not create:
                        raise _Missing(part) from None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fds[-1])
                        os.fsync(fds[-1])
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fds[-1])
                fds.append(fd)
            yield fds
        finally:
            for fd in fds:
                os.close(fd)

    def _put(self, key: str, fill: Callable[[BinaryIO], None]) -> None:
        parts = key.split("/")
        with _mapped("put", key), self._dirs([TMP], create=True) as (_, tmp_fd):
            name = f"{secrets.token_hex(8)}.put"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=tmp_fd)  # fmt: skip
            try:
                with os.fdopen(fd, "wb") as out:
                    fill(out)
                    out.flush()
                    os.fsync(out.fileno())
                for attempt in range(_PUT_ATTEMPTS):
                    try:
                        with self._dirs(parts[:-1], create=True) as fds:
                            os.replace(name, parts[-1], src_dir_fd=tmp_fd, dst_dir_fd=fds[-1])
                            os.fsync(fds[-1])
                            return
                    except FileNotFoundError:  # a delete pruned a directory on the way: walk again
                        if attempt == _PUT_ATTEMPTS - 1:
                            raise
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=tmp_fd)
                raise

    def _get(self, key: str, max_bytes: int, sink: Callable[[bytes], object]) -> None:
        parts = key.split("/")
        with _mapped("get", key):
            try:
                with self._dirs(parts[:-1], create=False) as fds:
                    fd = os.open(parts[-1], _READ_FLAGS, dir_fd=fds[-1])
            except (_Missing, FileNotFoundError):
                raise NotFoundError(f"shared store: no object {key!r}") from None
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise HostError(f"shared store: {key!r} is not a regular file")
                if st.st_size > max_bytes:
                    raise ObjectTooLargeError(f"shared store: {key!r} has {st.st_size} bytes, more than {max_bytes}")
                left = max_bytes + 1  # a file that grows while read is cut off here
                while chunk := f.read(min(_CHUNK, left)):
                    left -= len(chunk)
                    if left == 0:
                        raise ObjectTooLargeError(f"shared store: {key!r} grew past {max_bytes} bytes")
                    sink(chunk)

    def _delete(self, key: str) -> None:
        parts = key.split("/")
        with _mapped("delete", key):
            try:
                with self._dirs(parts[:-1], create=False) as fds:
                    try:
                        os.unlink(parts[-1], dir_fd=fds[-1])
                    except (FileNotFoundError, IsADirectoryError):
                        return  # no object (a directory is only a prefix of other keys)
                    os.fsync(fds[-1])
                    # Remove the directories this emptied, deepest first; the first non-empty one stops it.
                    for depth in range(len(parts) - 1, 0, -1):
                        try:
                            os.rmdir(parts[depth - 1], dir_fd=fds[depth - 1])
                        except OSError:
                            break
                        os.fsync(fds[depth - 1])
            except _Missing:
                return

    def _list(self, prefix: str) -> builtins.list[str]:
        base = prefix.rpartition("/")[0]
        start = base.split("/") if base else []
        out: builtins.list[str] = []
        stack = [start]
        with _mapped("list", prefix):
            while stack:
                parts = stack.pop()
                try:
                    with self._dirs(parts, create=False) as fds, os.scandir(fds[-1]) as entries:
                        for entry in entries:
                            name = "/".join([*parts, entry.name])
                            if entry.name.startswith(".") or not _listable(name):
                                continue
                            if entry.is_dir(follow_symlinks=False):
                                if (name + "/").startswith(prefix) or prefix.startswith(name + "/"):
                                    stack.append([*parts, entry.name])
                            elif entry.is_file(follow_symlinks=False) and name.startswith(prefix):
                                out.append(name)
                                if len(out) > LIST_LIMIT:
                                    raise HostError(f"shared store: more than {LIST_LIMIT} keys under {prefix!r}")
                except (_Missing, FileNotFoundError):
                    continue  # gone meanwhile (a delete pruned it), or never there
        return out


def _listable(name: str) -> bool:
    """Whether a name found on disk is a valid key (files made by hand may not be)."""
    try:
        check_key(name)
    except InvalidRequestError:
        return False
    return True
