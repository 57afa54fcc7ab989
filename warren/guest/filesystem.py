"""The ``filesystem.Filesystem`` service and the ``EntryInfo`` message.

Like envd, operations run with the agent's privileges on behalf of the caller's user: paths resolve
against that user's home, and directories the agent creates are chowned to the user.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .connect import Call, Message, Method, get_bool, get_int, get_str, server_stream, unary
from .errors import RpcError, rpc_error_from_os
from .metadata import read as read_metadata
from .mounts import is_network_mount
from .users import Accounts, PathError, User, ensure_dirs, resolve_path
from .watch import Watcher, start_watcher

if TYPE_CHECKING:
    from .state import Agent

MAX_STORED_EVENTS = 10_000
"""Events a watcher holds for its client: a CreateWatcher watcher keeps the newest this many between
two GetWatcherEvents; a WatchDir stream drops new events while this many wait to be sent."""

_TYPE_FILE = "FILE_TYPE_FILE"
_TYPE_DIR = "FILE_TYPE_DIRECTORY"
_TYPE_SYMLINK = "FILE_TYPE_SYMLINK"


# --------------------------------------------------------------------------- EntryInfo


def file_type(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return _TYPE_FILE
    if stat.S_ISDIR(mode):
        return _TYPE_DIR
    if stat.S_ISLNK(mode):
        return _TYPE_SYMLINK
    return None


def go_mode_string(mode: int) -> str:
    """Go's ``os.FileMode.String()`` (``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``)."""
    letters = ""
    if stat.S_ISDIR(mode):
        letters += "d"
    if stat.S_ISLNK(mode):
        letters += "L"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        letters += "D"
    if stat.S_ISFIFO(mode):
        letters += "p"
    if stat.S_ISSOCK(mode):
        letters += "S"
    if mode & stat.S_ISUID:
        letters += "u"
    if mode & stat.S_ISGID:
        letters += "g"
    if stat.S_ISCHR(mode):
        letters += "c"
    if mode & stat.S_ISVTX:
        letters += "t"
    perms = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return (letters or "-") + perms


def rfc3339(ns: int) -> str:
    """A proto3 JSON Timestamp: UTC, 'Z', 0/3/6/9 fractional digits."""
    secs, nanos = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    if nanos:
        if nanos % 1_000_000 == 0:
            text += f".{nanos // 1_000_000:03d}"
        elif nanos % 1000 == 0:
            text += f".{nanos // 1000:06d}"
        else:
            text += f".{nanos:09d}"
    return text + "Z"


def entry_info(accounts: Accounts, path: str, *, report_path: str | None = None) -> Message:
    """The EntryInfo of ``path`` (not following a final symlink; its target's type is reported)."""
    st = os.lstat(path)
    shown = report_path or path
    mode = st.st_mode
    info: Message = {"name": os.path.basename(shown.rstrip("/")) or "/"}
    ftype = file_type(mode)
    perm = stat.S_IMODE(mode) & 0o777
    target: str | None = None
    if stat.S_ISLNK(mode):
        target = os.path.realpath(path)
        try:
            tst = os.stat(path)
            ftype = file_type(tst.st_mode) or _TYPE_SYMLINK
            perm = tst.st_mode & 0o777
        except OSError:
            ftype = _TYPE_SYMLINK
            perm = 0
    if ftype:
        info["type"] = ftype
    info["path"] = shown
    if st.st_size:
        info["size"] = str(st.st_size)
    if perm:
        info["mode"] = perm
    info["permissions"] = go_mode_string(mode)
    info["owner"] = accounts.user_name(st.st_uid)
    info["group"] = accounts.group_name(st.st_gid)
    info["modifiedTime"] = rfc3339(st.st_mtime_ns)
    if target is not None:
        info["symlinkTarget"] = target
        info["isSymlink"] = True
    metadata = read_metadata(path)  # through a final symlink, as envd reads them
    if metadata:
        info["metadata"] = metadata
    return info


# --------------------------------------------------------------------------- helpers


def _resolve(call: Call, path: str) -> str:
    try:
        return resolve_path(path, call.user, call.agent.default_workdir)
    except PathError as exc:
        raise RpcError("invalid_argument", str(exc)) from None


def _entry(call: Call, path: str, what: str, report_path: str | None = None) -> Message:
    try:
        return entry_info(call.agent.accounts, path, report_path=report_path)
    except FileNotFoundError:
        raise RpcError("not_found", f"file not found: '{path}'") from None
    except OSError as exc:
        raise rpc_error_from_os(exc, what) from None


def remove_tree(path: str) -> None:
    """Remove a file, symlink or directory tree (never following symlinks)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    with os.scandir(path) as it:
        entries = list(it)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
    os.rmdir(path)


# --------------------------------------------------------------------------- unary methods


async def stat_(call: Call, msg: Message) -> Message:
    path = _resolve(call, get_str(msg, "path"))
    return {"entry": _entry(call, path, "error statting file")}


async def make_dir(call: Call, msg: Message) -> Message:
    path = _resolve(call, get_str(msg, "path"))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise rpc_error_from_os(exc, "error getting file info") from None
    else:
        if stat.S_ISDIR(st.st_mode):
            raise RpcError("already_exists", f"directory already exists: {path}")
        raise RpcError("invalid_argument", f"path already exists but it is not a directory: {path}")
    user: User = call.user
    try:
        ensure_dirs(path, user.uid, user.gid)
    except OSError as exc:
        raise rpc_error_from_os(exc, "error creating directory") from None
    return {"entry": _entry(call, path, "error statting directory")}


async def move(call: Call, msg: Message) -> Message:
    source = _resolve(call, get_str(msg, "source"))
    destination = _resolve(call, get_str(msg, "destination"))
    user: User = call.user
    try:
        ensure_dirs(os.path.dirname(destination) or "/", user.uid, user.gid)
        os.rename(source, destination)
    except FileNotFoundError:
        raise RpcError("not_found", f"source file not found: '{source}'") from None
    except OSError as exc:
        raise rpc_error_from_os(exc, "error renaming") from None
    return {"entry": _entry(call, destination, "error statting destination")}


def _real_dir(requested: str) -> str:
    """``requested`` with symlinks resolved; it must be a directory."""
    real = os.path.realpath(requested)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise RpcError("not_found", f"path not found: '{requested}'") from None
    except OSError as exc:
        raise rpc_error_from_os(exc, "error resolving path") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RpcError("invalid_argument", f"path is not a directory: {requested}")
    return real


async def list_dir(call: Call, msg: Message) -> Message:
    depth = get_int(msg, "depth") or 1
    if depth < 1:
        raise RpcError("invalid_argument", "depth must be at least 1")
    requested = _resolve(call, get_str(msg, "path"))
    real = _real_dir(requested)
    accounts = call.agent.accounts
    entries: list[Message] = []

    def walk(fs_dir: str, shown_dir: str, level: int, top: bool) -> None:
        try:
            with os.scandir(fs_dir) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            if top:
                raise rpc_error_from_os(exc, "error reading directory") from None
            return
        for child in children:
            shown = os.path.join(shown_dir, child.name)
            try:
                entries.append(entry_info(accounts, child.path, report_path=shown))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise rpc_error_from_os(exc, "error reading directory") from None
            try:
                is_dir = child.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and level < depth:
                walk(child.path, shown, level + 1, False)

    walk(real, requested, 1, True)
    return {"entries": entries} if entries else {}


async def remove(call: Call, msg: Message) -> Message:
    path = _resolve(call, get_str(msg, "path"))
    try:
        remove_tree(path)
    except FileNotFoundError:
        pass  # envd uses os.RemoveAll: removing what is not there succeeds
    except OSError as exc:
        raise rpc_error_from_os(exc, "error removing file or directory") from None
    return {}


# --------------------------------------------------------------------------- watching


def _watch_args(call: Call, msg: Message) -> tuple[str, bool, bool]:
    path = _resolve(call, get_str(msg, "path"))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RpcError("not_found", f"path {path} not found") from None
    except OSError as exc:
        raise rpc_error_from_os(exc, "error statting path") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RpcError("invalid_argument", f"path {path} not a directory")
    if not get_bool(msg, "allow_network_mounts") and is_network_mount(path):
        raise RpcError("invalid_argument", f"cannot watch path on network filesystem: {path}")
    return path, bool(get_bool(msg, "recursive")), bool(get_bool(msg, "include_entry"))


_CARRY_ENTRY = frozenset({"CREATE", "WRITE", "CHMOD"})
"""Events whose path still names their entry (envd's opCarriesEntry): a remove or rename never carries
one, as a stat could find a replacement made at the same path since."""


def _event(accounts: Accounts, root: str, path: str, kind: str, include_entry: bool) -> Message:
    event: Message = {"name": os.path.relpath(path, root), "type": f"EVENT_TYPE_{kind}"}
    if include_entry and kind in _CARRY_ENTRY:
        try:
            event["entry"] = entry_info(accounts, path)
        except OSError:
            pass  # gone already (removed or renamed since)
    return event


def _open_watcher(agent: Agent, root: str, recursive: bool, sink: Any) -> Watcher:
    try:
        return start_watcher(agent.loop, root, recursive, sink, poll=agent.poll_watch)
    except OSError as exc:
        raise rpc_error_from_os(exc, "error creating watcher") from None


async def watch_dir(call: Call, msg: Message) -> AsyncIterator[Any]:
    root, recursive, include_entry = _watch_args(call, msg)
    accounts = call.agent.accounts
    queue: asyncio.Queue[Message] = asyncio.Queue(MAX_STORED_EVENTS)

    def sink(path: str, kind: str) -> None:
        try:
            queue.put_nowait(_event(accounts, root, path, kind, include_entry))
        except asyncio.QueueFull:
            pass  # the client reads slower than the filesystem changes: drop, like a full inotify queue

    watcher = _open_watcher(call.agent, root, recursive, sink)
    try:
        yield {"start": {}}
        while True:
            try:
                async with asyncio.timeout(call.keepalive_s):
                    event = await queue.get()
            except TimeoutError:
                yield {"keepalive": {}}
                continue
            yield {"filesystem": event}
    finally:
        watcher.close()


class StoredWatcher:
    """A CreateWatcher watcher: events accumulate until GetWatcherEvents drains them."""

    def __init__(self, agent: Agent, root: str, recursive: bool, include_entry: bool) -> None:
        self.events: deque[Message] = deque(maxlen=MAX_STORED_EVENTS)
        accounts = agent.accounts

        def sink(path: str, kind: str) -> None:
            self.events.append(_event(accounts, root, path, kind, include_entry))

        self._watcher = _open_watcher(agent, root, recursive, sink)

    def drain(self) -> list[Message]:
        out = list(self.events)
        self.events.clear()
        return out

    def close(self) -> None:
        self._watcher.close()


async def create_watcher(call: Call, msg: Message) -> Message:
    root, recursive, include_entry = _watch_args(call, msg)
    watcher_id = "w" + os.urandom(9).hex()
    call.agent.watchers[watcher_id] = StoredWatcher(call.agent, root, recursive, include_entry)
    return {"watcherId": watcher_id}


def _stored(call: Call, msg: Message) -> tuple[str, StoredWatcher]:
    watcher_id = get_str(msg, "watcher_id")
    watcher = call.agent.watchers.get(watcher_id)
    if watcher is None:
        raise RpcError("not_found", f"watcher with id {watcher_id} not found")
    return watcher_id, watcher


async def get_watcher_events(call: Call, msg: Message) -> Message:
    _, watcher = _stored(call, msg)
    events = watcher.drain()
    return {"events": events} if events else {}


async def remove_watcher(call: Call, msg: Message) -> Message:
    watcher_id, watcher = _stored(call, msg)
    watcher.close()
    del call.agent.watchers[watcher_id]
    return {}


METHODS: dict[str, Method] = {
    "filesystem.Filesystem/Stat": unary(stat_),
    "filesystem.Filesystem/MakeDir": unary(make_dir),
    "filesystem.Filesystem/Move": unary(move),
    "filesystem.Filesystem/ListDir": unary(list_dir),
    "filesystem.Filesystem/Remove": unary(remove),
    "filesystem.Filesystem/WatchDir": server_stream(watch_dir),
    "filesystem.Filesystem/CreateWatcher": unary(create_watcher),
    "filesystem.Filesystem/GetWatcherEvents": unary(get_watcher_events),
    "filesystem.Filesystem/RemoveWatcher": unary(remove_watcher),
}
