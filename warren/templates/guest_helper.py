"""Build operations that run *inside* a build sandbox, with the agent bundle's Python (stdlib only).

The build service runs this file's source as ``/.agent/bin/python3 -S -E -B -c <source> <op> <json>``
as root. Nothing here depends on the image's own tools (a distroless image has no shell, tar or
useradd), and every path it touches is inside the sandbox: a hostile tar can at most damage the
template being built. It prints one JSON object on its last stdout line; failures exit 1 with the
reason on stderr.

ops:
    prepare                          {"bash": bool}: which shell RUN steps get
    ensure_user  {name}              create the account (and its home) unless it exists
    mkdir        {path, owner}       mkdir -p; the directories it creates belong to ``owner``
    copy         {tar, src, dest, owner, mode, glob}   unpack an uploaded context tar and move it into place
    cleanup                          remove the build scratch directory
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import shutil
import sys
import tarfile
from typing import Any

SCRATCH = "/.warren-build"
PASSWD = "/etc/passwd"
GROUP = "/etc/group"
SHADOW = "/etc/shadow"
FIRST_UID = 1000
HOME_ROOT = "/home"


class Failure(Exception):
    pass


def _rows(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [line.rstrip("\n").split(":") for line in fh if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        return []


def _lookup_user(name: str) -> tuple[int, int, str] | None:
    """(uid, gid, home) of a passwd name or a numeric uid."""
    for row in _rows(PASSWD):
        if len(row) >= 6 and (row[0] == name or row[2] == name):
            return int(row[2]), int(row[3]), row[5]
    if name.isdigit():
        return int(name), int(name), "/"
    return None


def _lookup_group(name: str) -> int | None:
    for row in _rows(GROUP):
        if len(row) >= 3 and (row[0] == name or row[2] == name):
            return int(row[2])
    return int(name) if name.isdigit() else None


def owner_ids(owner: str) -> tuple[int, int]:
    """``user`` or ``user:group`` (names or numbers) as (uid, gid); the user's group when none is given."""
    user, _, group = owner.partition(":")
    found = _lookup_user(user)
    if found is None:
        raise Failure(f"unknown user {user!r}")
    uid, gid, _ = found
    if group:
        resolved = _lookup_group(group)
        if resolved is None:
            raise Failure(f"unknown group {group!r}")
        gid = resolved
    return uid, gid


def _append(path: str, line: str) -> None:
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    prefix = ""
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            prefix = "" if fh.read(1) == b"\n" else "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(prefix + line + "\n")
    if path == PASSWD or path == GROUP:
        os.chmod(path, 0o644)


def op_prepare(_: dict[str, Any]) -> dict[str, Any]:
    return {"bash": os.access("/bin/bash", os.X_OK), "sh": os.access("/bin/sh", os.X_OK)}


def op_ensure_user(args: dict[str, Any]) -> dict[str, Any]:
    name = str(args["name"])
    existing = _lookup_user(name)
    if existing is not None and (not name.isdigit() or any(r[2] == name for r in _rows(PASSWD) if len(r) > 2)):
        return {"created": False, "uid": existing[0], "home": existing[2]}
    if name.isdigit() or not name or any(c in name for c in ":\n/ "):
        raise Failure(f"cannot create a user named {name!r}")
    used_uids = {int(r[2]) for r in _rows(PASSWD) if len(r) > 2 and r[2].isdigit()}
    used_gids = {int(r[2]) for r in _rows(GROUP) if len(r) > 2 and r[2].isdigit()}
    uid = FIRST_UID
    while uid in used_uids or uid in used_gids:
        uid += 1
    gid = _lookup_group(name)
    if gid is None:
        gid = uid
        _append(GROUP, f"{name}:x:{gid}:")
    home = posixpath.join(HOME_ROOT, name)
    shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
    _append(PASSWD, f"{name}:x:{uid}:{gid}::{home}:{shell}")
    if os.path.exists(SHADOW):
        _append(SHADOW, f"{name}:!:19000:0:99999:7:::")
        os.chmod(SHADOW, 0o640)
    os.makedirs(home, exist_ok=True)
    os.chown(home, uid, gid)
    os.chmod(home, 0o755)
    return {"created": True, "uid": uid, "home": home}


def _makedirs(path: str, uid: int, gid: int) -> None:
    """mkdir -p; only the directories created here are given to (uid, gid)."""
    missing = []
    current = path
    while current not in ("/", "") and not os.path.lexists(current):
        missing.append(current)
        current = posixpath.dirname(current)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)
        os.chown(directory, uid, gid)
    if not os.path.isdir(path):
        raise Failure(f"{path} exists and is not a directory")


def op_mkdir(args: dict[str, Any]) -> dict[str, Any]:
    path = posixpath.normpath(str(args["path"]))
    uid, gid = owner_ids(str(args["owner"]))
    _makedirs(path, uid, gid)
    return {"path": path}


def _safe_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """``tarfile.tar_filter``'s refusals (absolute names, names or writes escaping ``dest``) and no device
    nodes; modes are kept as uploaded (the SDK hashed them), owners are set by the step afterwards."""
    if member.ischr() or member.isblk():
        raise tarfile.FilterError(f"{member.name!r} is a device node")
    checked = tarfile.tar_filter(member, dest)  # leading "/" stripped, escapes refused
    return checked.replace(mode=member.mode, uid=0, gid=0, uname="root", gname="root", deep=False)


def _chown_chmod(path: str, uid: int, gid: int, mode: int | None) -> None:
    paths = [path]
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            paths.extend(os.path.join(root, n) for n in dirs + files)
    for p in paths:
        os.lchown(p, uid, gid)
        if mode is not None and not os.path.islink(p):
            os.chmod(p, mode)


def _move(src: str, dest: str) -> None:
    """Move ``src`` to ``dest``, merging into an existing directory and replacing anything else."""
    if os.path.isdir(src) and not os.path.islink(src) and os.path.isdir(dest) and not os.path.islink(dest):
        for name in os.listdir(src):
            _move(os.path.join(src, name), os.path.join(dest, name))
        shutil.copystat(src, dest)
        os.chown(dest, os.stat(src).st_uid, os.stat(src).st_gid)
        return
    if os.path.lexists(dest):
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        else:
            os.unlink(dest)
    shutil.move(src, dest)


def op_copy(args: dict[str, Any]) -> dict[str, Any]:
    tar_path, src, dest = str(args["tar"]), str(args["src"]), str(args["dest"])
    uid, gid = owner_ids(str(args["owner"]))
    mode = int(str(args["mode"]), 8) if args.get("mode") else None
    unpack = os.path.join(SCRATCH, "unpack-" + secrets.token_hex(6))
    os.makedirs(unpack)
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            tar.extractall(unpack, filter=_safe_member)
        source = os.path.normpath(os.path.join(unpack, src)) if src else unpack
        if not (source == unpack or source.startswith(unpack + "/")) or not os.path.lexists(source):
            raise Failure(f"the uploaded files do not contain {src or '.'!r}")
        is_dir = os.path.isdir(source) and not os.path.islink(source)
        _chown_chmod(source, uid, gid, mode)
        if is_dir or args.get("glob"):
            # A directory's contents (or a glob's matches) go into dest, which becomes a directory.
            target = posixpath.normpath(dest)
            if not os.path.lexists(target):
                _makedirs(posixpath.dirname(target) or "/", 0, 0)
                os.mkdir(target, 0o755)
                os.chown(target, uid, gid)
            elif not os.path.isdir(target):
                raise Failure(f"{target} exists and is not a directory")
            for name in sorted(os.listdir(source)):
                _move(os.path.join(source, name), os.path.join(target, name))
        else:
            target = dest
            if dest.endswith("/") or (os.path.isdir(dest) and not os.path.islink(dest)):
                target = os.path.join(dest, os.path.basename(source))
            _makedirs(posixpath.dirname(target) or "/", 0, 0)
            _move(source, target)
        return {"target": posixpath.normpath(target)}
    finally:
        shutil.rmtree(unpack, ignore_errors=True)
        try:
            os.unlink(tar_path)
        except FileNotFoundError:
            pass


def op_cleanup(_: dict[str, Any]) -> dict[str, Any]:
    shutil.rmtree(SCRATCH, ignore_errors=True)
    return {}


OPS = {
    "prepare": op_prepare,
    "ensure_user": op_ensure_user,
    "mkdir": op_mkdir,
    "copy": op_copy,
    "cleanup": op_cleanup,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in OPS:
        print(f"usage: helper {{{','.join(OPS)}}} [json]", file=sys.stderr)
        return 2
    args = json.loads(argv[2]) if len(argv) > 2 else {}
    try:
        result = OPS[argv[1]](args)
    except (Failure, OSError, tarfile.TarError, KeyError, ValueError) as exc:
        print(f"{argv[1]}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
