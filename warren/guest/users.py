"""Users from the passwd and group files (parsed here: no NSS), and paths resolved against a home.

The files are re-read when they change (size, mtime or inode), so accounts a command adds with
``useradd`` are visible to the next request without restarting the agent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ROOT = "root"
PREFERRED_DEFAULT_USER = "user"
"""E2B's default user; used when /init named none and it exists in passwd."""


@dataclass(frozen=True, slots=True)
class User:
    """One passwd entry plus the ids of the groups that list it as a member."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str
    groups: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Group:
    name: str
    gid: int
    members: tuple[str, ...]


class PathError(ValueError):
    """A path that cannot be resolved for the user (``~other`` forms)."""


class _Table:
    """One parsed colon-separated file, cached until the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self.rows: list[list[str]] = []

    def load(self) -> list[list[str]]:
        try:
            st = os.stat(self.path)
        except OSError:
            self._key = None
            self.rows = []
            return self.rows
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._key:
            rows: list[list[str]] = []
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        line = line.rstrip("\n")
                        if not line or line[0] in "#+-":
                            continue
                        rows.append(line.split(":"))
            except OSError:
                rows = []
            self.rows = rows
            self._key = key
        return self.rows


class Accounts:
    """Look-ups in a passwd file and a group file."""

    def __init__(self, passwd_path: str = "/etc/passwd", group_path: str = "/etc/group") -> None:
        self._passwd = _Table(passwd_path)
        self._group = _Table(group_path)

    def _users(self) -> list[tuple[str, int, int, str, str]]:
        out: list[tuple[str, int, int, str, str]] = []
        for row in self._passwd.load():
            if len(row) < 7:
                continue
            try:
                out.append((row[0], int(row[2]), int(row[3]), row[5], row[6]))
            except ValueError:
                continue
        return out

    def _groups(self) -> list[_Group]:
        out: list[_Group] = []
        for row in self._group.load():
            if len(row) < 4:
                continue
            try:
                gid = int(row[2])
            except ValueError:
                continue
            members = tuple(m for m in row[3].split(",") if m)
            out.append(_Group(row[0], gid, members))
        return out

    def user(self, name: str) -> User | None:
        """The user called ``name``, or None. ``root`` always exists (an image may lack /etc/passwd)."""
        for uname, uid, gid, home, shell in self._users():
            if uname == name:
                groups = [gid]
                for g in self._groups():
                    if name in g.members and g.gid not in groups:
                        groups.append(g.gid)
                return User(uname, uid, gid, home or "/", shell, tuple(groups))
        if name == ROOT:
            return User(ROOT, 0, 0, "/root", "/bin/sh", (0,))
        return None

    def exists(self, name: str) -> bool:
        return name == ROOT or any(u[0] == name for u in self._users())

    def user_name(self, uid: int) -> str:
        """The name of ``uid``, or the number as a string (like envd)."""
        for uname, u, _gid, _home, _shell in self._users():
            if u == uid:
                return uname
        return str(uid)

    def group_name(self, gid: int) -> str:
        for g in self._groups():
            if g.gid == gid:
                return g.name
        return str(gid)


def resolve_path(path: str, user: User, default_workdir: str | None) -> str:
    """Resolve ``path`` like envd: empty -> the default workdir, ``~`` -> home, relative -> under home."""
    if not path:
        path = default_workdir or ""
    if path.startswith("~"):
        if len(path) > 1 and path[1] != "/":
            raise PathError(f"cannot expand user-specific home dir in '{path}'")
        path = os.path.normpath(os.path.join(user.home, path[1:].lstrip("/")))
    if os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(user.home, path))


def ensure_dirs(path: str, uid: int, gid: int) -> None:
    """Create ``path`` and any missing parents (mode 0755), chowning each created one to uid:gid."""
    missing: list[str] = []
    cur = os.path.abspath(path)
    while True:
        try:
            st = os.stat(cur)
        except FileNotFoundError:
            missing.append(cur)
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
            continue
        if not _is_dir(st.st_mode):
            raise NotADirectoryError(20, "path is a file", cur)
        break
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            continue
        chown(d, uid, gid)


def _is_dir(mode: int) -> bool:
    return (mode & 0o170000) == 0o040000


def chown(path: str, uid: int, gid: int) -> None:
    """chown, skipped when the agent cannot (not root) and the ids are not its own."""
    try:
        os.chown(path, uid, gid)
    except PermissionError:
        if os.geteuid() == 0:
            raise
