"""Unprivileged sandbox root: host uid/gid ranges, user namespace fds, and idmapped layer mounts.

A runc sandbox runs in its own user namespace: uid/gid ``0..65535`` inside map to the host range
``[base, base + 65536)`` that :class:`RangeAllocator` hands out. Its read-only template layers are
seen through *idmapped* mounts of that range (``open_tree`` + ``mount_setattr(MOUNT_ATTR_IDMAP)``), so
the layers stay owned by 0..65535 on disk and are shared by every sandbox. Its writable upper dir is
stored in the range on disk (an idmapped *upper* makes overlayfs read-only, userns-notes.md), so a copy
into another range shifts ownership (:func:`to_neutral`, :func:`from_neutral`).

Measured on kernel 6.18 with runc 1.1.5 (../shared/reference/userns-notes.md): idmapped lower layers
under a plain upper mount read-write; the same layer can be idmapped for many ranges at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from warren.errors import RuntimeFailure
from warren.runtime.rootfs import mount_overlay, unmount
from warren.trees import remove_tree

__all__ = [
    "NAMESPACES",
    "RANGE_SIZE",
    "RangeAllocator",
    "UidRange",
    "UsernsCache",
    "detached_idmapped_tree",
    "from_neutral",
    "probe_idmapped_mounts",
    "to_neutral",
    "unsearchable_ancestor",
    "userns_fd",
]

_log = logging.getLogger(__name__)

RANGE_SIZE = 65536
"""uid/gid 0..65535 inside; the top one (65535) is the conventional overflow id."""

DEFAULT_BASE = 1 << 30
"""First host uid handed to sandboxes: far above the accounts and subuid ranges a host gives out."""

DEFAULT_SLOTS = 8192
"""Ranges available: base + 8192 * 65536 = 1.5 G, below 2^31 (some tools treat uids as signed)."""

OVERFLOW_ID = 65534
"""What an id outside a range becomes when it is shifted (the kernel's ``nobody``)."""

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
"""The same numbers on every architecture (the unified syscall table of the new mount API)."""
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_RECURSIVE = 0x8000
_AT_EMPTY_PATH = 0x1000
_MOUNT_ATTR_IDMAP = 0x00100000
_CLONE_NEWUSER = 0x10000000


@dataclass(frozen=True)
class UidRange:
    """One sandbox's host id range: inside ``k`` is ``host + k`` outside, for ``k < size``."""

    host: int
    size: int = RANGE_SIZE

    @property
    def mapping(self) -> list[dict[str, int]]:
        """The OCI ``uidMappings``/``gidMappings`` entry list."""
        return [{"containerID": 0, "hostID": self.host, "size": self.size}]

    def inside(self, uid: int) -> int:
        """A host id seen from inside (OVERFLOW_ID when it is not in the range)."""
        return uid - self.host if self.host <= uid < self.host + self.size else OVERFLOW_ID

    def outside(self, uid: int) -> int:
        """An inside id as the host stores it (ids beyond the range become the range's overflow id)."""
        return self.host + (uid if 0 <= uid < self.size else OVERFLOW_ID)


def to_neutral(rng: UidRange | None) -> Callable[[int, int], tuple[int, int]] | None:
    """An ownership map for ``trees.copy_tree``: files of ``rng`` as they look inside (0-based)."""
    if rng is None:
        return None
    return lambda uid, gid: (rng.inside(uid), rng.inside(gid))


def from_neutral(rng: UidRange | None) -> Callable[[int, int], tuple[int, int]] | None:
    """The reverse of :func:`to_neutral`: 0-based files into ``rng``."""
    if rng is None:
        return None
    return lambda uid, gid: (rng.outside(uid), rng.outside(gid))


class RangeAllocator:
    """Hands out disjoint host ranges; the lowest free slot first. Not thread-safe (event loop only)."""

    def __init__(self, base: int = DEFAULT_BASE, slots: int = DEFAULT_SLOTS) -> None:
        if base < RANGE_SIZE or base + slots * RANGE_SIZE >= 1 << 31:
            raise ValueError(f"uid range base {base} with {slots} slots leaves the usable uid space")
        self.base = base
        self.slots = slots
        self._used: set[int] = set()

    def allocate(self) -> UidRange:
        for slot in range(self.slots):
            if slot not in self._used:
                self._used.add(slot)
                return UidRange(self.base + slot * RANGE_SIZE)
        raise RuntimeFailure(f"all {self.slots} sandbox uid ranges are in use")

    def adopt(self, rng: UidRange) -> None:
        """Mark a range found in a sandbox record (after a restart) as used."""
        slot, rest = divmod(rng.host - self.base, RANGE_SIZE)
        if rest == 0 and 0 <= slot < self.slots:
            self._used.add(slot)

    def release(self, rng: UidRange | None) -> None:
        if rng is not None:
            self._used.discard((rng.host - self.base) // RANGE_SIZE)

    def in_use(self) -> int:
        return len(self._used)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise RuntimeFailure(f"{what} failed: {os.strerror(err)} (errno {err})")
    return rc


def userns_fd(rng: UidRange) -> int:
    """An fd of a new user namespace mapping ``0..size`` to ``rng`` (uids and gids); the caller closes it.

    A forked child unshares its user namespace and waits; the parent writes the maps, opens the
    namespace and ends the child. The child runs no Python between fork and ``_exit`` but two syscalls
    through a ctypes function resolved before the fork.
    """
    unshare = _libc().unshare
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(ready_r)
            os.close(done_w)
            ok = unshare(_CLONE_NEWUSER) == 0
            os.write(ready_w, b"1" if ok else b"0")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise RuntimeFailure("unshare(CLONE_NEWUSER) failed in the helper process")
        line = f"0 {rng.host} {rng.size}\n"
        Path(f"/proc/{pid}/uid_map").write_text(line)
        Path(f"/proc/{pid}/setgroups").write_text("deny")
        Path(f"/proc/{pid}/gid_map").write_text(line)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def detached_idmapped_tree(source: Path, ns_fd: int) -> int:
    """A detached, recursive clone of the mount tree at ``source``, idmapped through ``ns_fd``.

    Returns its fd (close-on-exec); ``/proc/self/fd/N`` names it as an overlay lower dir, and the
    overlay keeps it alive after the fd is closed, so nothing is attached and nothing needs unmounting.
    """
    libc = _libc()
    fd = _check(libc.syscall(_SYS_OPEN_TREE, -100, os.fsencode(source),
                             _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE),
                f"open_tree({source})")
    attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, ns_fd)
    try:
        _check(libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH | _AT_RECURSIVE,
                            ctypes.byref(attr), ctypes.sizeof(attr)), f"idmapping {source}")
    except BaseException:
        os.close(fd)
        raise
    return fd


class UsernsCache:
    """One user namespace fd per range, made on first use and kept: a range's mapping never changes, and
    ranges are handed out lowest first, so nearly every sandbox start finds its range's namespace made.
    Making one forks this process (5-20 ms, bench/hardening.py). Thread-safe; ``close()`` drops all."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def fd(self, rng: UidRange) -> int:
        with self._lock:
            fd = self._fds.get(rng.host)
            if fd is None:
                fd = self._fds[rng.host] = userns_fd(rng)
            return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


NAMESPACES = UsernsCache()
"""The process's cache (user namespaces are kernel objects; one per range is enough for a process)."""


class IdmappedLayers:
    """The idmapped views of a sandbox's layers, open as fds for one overlay mount; a context manager.

    ``paths`` are ``/proc/self/fd/N`` names to pass as lower dirs; close after the overlay is mounted.
    """

    def __init__(self, layers: Iterable[Path], rng: UidRange, namespaces: UsernsCache = NAMESPACES) -> None:
        self._fds: list[int] = []
        ns = namespaces.fd(rng)
        try:
            for layer in layers:
                self._fds.append(detached_idmapped_tree(layer, ns))
        except BaseException:
            self.close()
            raise

    @property
    def paths(self) -> list[Path]:
        return [Path(f"/proc/self/fd/{fd}") for fd in self._fds]

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> IdmappedLayers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def probe_idmapped_mounts(scratch: Path) -> str:
    """``""`` when an overlay over an idmapped lower dir mounts read-write here, else the reason."""

    if os.geteuid() != 0:
        return "not root"
    lower, upper, work, merged = (scratch / n for n in ("lower", "upper", "work", "merged"))
    rng = UidRange(DEFAULT_BASE)
    try:
        for d in (lower, upper, work, merged):
            d.mkdir(parents=True, exist_ok=True)
        (lower / "f").write_text("x")
        os.chown(upper, rng.host, rng.host)
        os.chown(work, rng.host, rng.host)
        with IdmappedLayers([lower], rng) as views:
            mount_overlay(views.paths, upper, work, merged)
        try:
            st = os.stat(merged / "f")
            if st.st_uid != rng.host:
                return f"idmapped mount shows uid {st.st_uid}, not {rng.host}"
            (merged / "g").write_text("y")
        finally:
            unmount(merged)
        return ""
    except (OSError, RuntimeFailure) as exc:
        return f"idmapped overlay lower dirs do not work here: {exc}"
    finally:
        _remove_small(scratch)


def unsearchable_ancestor(path: Path) -> Path | None:
    """The first directory from ``/`` down to ``path``'s parent that other users cannot search (a sandbox's
    runtime resolves its bundle as an unprivileged uid), or None."""
    for parent in reversed(path.absolute().parents):
        try:
            if not os.stat(parent).st_mode & 0o001:
                return parent
        except OSError:
            return parent
    return None


def _remove_small(root: Path) -> None:
    """Remove the probe's own few files (never sandbox content); an overlay left mounted stays."""
    with contextlib.suppress(OSError):
        remove_tree(root)

