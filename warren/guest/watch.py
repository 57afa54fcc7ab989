"""Directory watching: inotify through ctypes, or polling where inotify is unavailable.

Events are reported like envd's fsnotify: ``(name relative to the watched dir, type)`` with type one
of CREATE, WRITE, REMOVE, RENAME, CHMOD (the ``EVENT_TYPE_`` prefix is added by the caller). With
``recursive`` every subdirectory is watched, including ones created later; entries found in a new
directory when its watch is added are reported as created, so fast ``mkdir -p a/b/c`` is not lost.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import struct
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("warren.guest")

EventSink = Callable[[str, str], None]
"""Called with (absolute path, event type) for every event."""

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_WATCH_MASK = (
    IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")

POLL_INTERVAL_S = 0.5
"""How often the polling fallback rescans the tree."""


class Watcher(Protocol):
    def close(self) -> None: ...


def _types_for(mask: int) -> list[str]:
    """fsnotify's mapping of one inotify mask to operations, in envd's reporting order."""
    out = []
    if mask & (IN_CREATE | IN_MOVED_TO):
        out.append("CREATE")
    if mask & (IN_MOVED_FROM | IN_MOVE_SELF):
        out.append("RENAME")
    if mask & IN_ATTRIB:
        out.append("CHMOD")
    if mask & IN_MODIFY:
        out.append("WRITE")
    if mask & (IN_DELETE | IN_DELETE_SELF):
        out.append("REMOVE")
    return out


def _subdirs(root: str) -> list[str]:
    """Every directory below ``root`` (not following symlinks), parents first."""
    out: list[str] = []
    stack = [root]
    while stack:
        cur = stack.pop()
        try:
            with os.scandir(cur) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            out.append(entry.path)
                            stack.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return out


class InotifyWatcher:
    """inotify via ctypes on the event loop (``add_reader``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, root: str, recursive: bool, sink: EventSink) -> None:
        import ctypes

        self._loop = loop
        self._root = root
        self._recursive = recursive
        self._sink = sink
        libc = ctypes.CDLL(None, use_errno=True)
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm_watch = libc.inotify_rm_watch
        self._rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self._get_errno = ctypes.get_errno
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._fd: int | None = fd
        self._dirs: dict[int, str] = {}
        try:
            self._watch(root)
            if recursive:
                for d in _subdirs(root):
                    self._watch(d, missing_ok=True)
        except BaseException:
            self.close()
            raise
        loop.add_reader(fd, self._on_readable)

    def _watch(self, path: str, *, missing_ok: bool = False) -> None:
        assert self._fd is not None
        wd = self._add_watch(self._fd, os.fsencode(path), _WATCH_MASK | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            err = self._get_errno()
            if missing_ok and err in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                return
            raise OSError(err, os.strerror(err), path)
        self._dirs[wd] = path

    def _on_readable(self) -> None:
        if self._fd is None:
            return
        try:
            buf = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("inotify read failed: %s", exc)
            self.close()
            return
        off = 0
        while off + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
            name = buf[off + _EVENT.size : off + _EVENT.size + length].rstrip(b"\0")
            off += _EVENT.size + length
            self._handle(wd, mask, os.fsdecode(name))

    def _handle(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            log.warning("inotify queue overflow: events were lost")
            return
        base = self._dirs.get(wd)
        if base is None:
            return
        if mask & IN_IGNORED:
            self._dirs.pop(wd, None)
            return
        is_self = not name
        if is_self and base != self._root:
            # A subdirectory's own delete/move is also reported by its parent's watch.
            return
        path = os.path.join(base, name) if name else base
        for kind in _types_for(mask):
            self._sink(path, kind)
        if self._recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            self._watch_new_dir(path)

    def _watch_new_dir(self, path: str) -> None:
        try:
            self._watch(path, missing_ok=True)
        except OSError as exc:
            log.warning("cannot watch %s: %s", path, exc)
            return
        # Entries made before the watch existed would otherwise go unreported.
        stack = [path]
        while stack:
            cur = stack.pop()
            try:
                entries = list(os.scandir(cur))
            except OSError:
                continue
            for entry in entries:
                self._sink(entry.path, "CREATE")
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    try:
                        self._watch(entry.path, missing_ok=True)
                    except OSError:
                        continue
                    stack.append(entry.path)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self._loop.remove_reader(fd)
        except (ValueError, RuntimeError):
            pass
        os.close(fd)
        self._dirs.clear()


_Snapshot = dict[str, tuple[bool, int, int, int, int]]


class PollingWatcher:
    """Rescans the tree every ``POLL_INTERVAL_S`` and reports the differences."""

    def __init__(self, loop: asyncio.AbstractEventLoop, root: str, recursive: bool, sink: EventSink) -> None:
        self._loop = loop
        self._root = root
        self._recursive = recursive
        self._sink = sink
        if not os.path.isdir(root):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", root)
        self._snap = self._scan()
        self._handle: asyncio.TimerHandle | None = loop.call_later(POLL_INTERVAL_S, self._tick)

    def _scan(self) -> _Snapshot:
        snap: _Snapshot = {}
        stack = [self._root]
        while stack:
            cur = stack.pop()
            try:
                entries = list(os.scandir(cur))
            except OSError:
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                is_dir = stat.S_ISDIR(st.st_mode)
                snap[entry.path] = (is_dir, st.st_mtime_ns, st.st_size, st.st_mode, st.st_ino)
                if is_dir and self._recursive:
                    stack.append(entry.path)
        return snap

    def _tick(self) -> None:
        new = self._scan()
        old = self._snap
        self._snap = new
        for path, (is_dir, mtime, size, mode, ino) in new.items():
            before = old.get(path)
            if before is None or before[4] != ino:
                self._sink(path, "CREATE")
                continue
            if before[3] != mode:
                self._sink(path, "CHMOD")
            if not is_dir and (before[1] != mtime or before[2] != size):
                self._sink(path, "WRITE")
        for path in old:
            if path not in new:
                self._sink(path, "REMOVE")
        self._handle = self._loop.call_later(POLL_INTERVAL_S, self._tick)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def start_watcher(
    loop: asyncio.AbstractEventLoop, root: str, recursive: bool, sink: EventSink, *, poll: bool = False
) -> Watcher:
    """An inotify watcher, or a polling one when inotify (or ctypes) is unavailable or ``poll``."""
    if poll:
        return PollingWatcher(loop, root, recursive, sink)
    try:
        return InotifyWatcher(loop, root, recursive, sink)
    except (ImportError, AttributeError) as exc:
        log.info("inotify unavailable (%s); polling %s", exc, root)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EINVAL):
            raise
        log.info("inotify unavailable (%s); polling %s", exc, root)
    return PollingWatcher(loop, root, recursive, sink)
