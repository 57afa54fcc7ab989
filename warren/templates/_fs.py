"""Filesystem and process helpers shared by the template builders and the importer.

Everything here translates ``OSError`` / ``CalledProcessError`` into ``HostError`` at its edge.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from warren import trees
from warren.errors import HostError
from warren.mountinfo import parse_mounts, points_under, read_mounts

STDERR_TAIL_CHARS = 2000
"""How much of a failed command's output goes into the error message: enough for the cause."""


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run ``argv`` (never through a shell), return its stdout; raise ``HostError`` on any failure."""
    args = [os.fspath(a) for a in argv]
    try:
        proc = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise HostError(f"{args[0]} timed out after {timeout:.0f}s") from exc
    except OSError as exc:
        raise HostError(f"cannot run {args[0]}: {exc}") from exc
    if proc.returncode != 0:
        output = (proc.stderr.strip() or proc.stdout.strip())[-STDERR_TAIL_CHARS:]
        raise HostError(f"{' '.join(args[:3])} failed with exit code {proc.returncode}: {output}")
    return proc.stdout


def mountpoints_under(path: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below ``path``, deepest first (the order to unmount them in)."""
    try:
        mounts = read_mounts() if mountinfo is None else parse_mounts(mountinfo)
    except OSError:
        return []
    found = points_under(os.path.realpath(path), mounts)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """Remove ``path`` recursively without ever reaching outside it.

    A failed debootstrap can leave /proc, /sys or a bind-mounted /dev inside its target, and a
    plain recursive delete would then descend into the host's. So: unmount everything below
    ``path`` first, then delete with :func:`warren.trees.remove_tree`, which never crosses into
    another filesystem nor follows a symlink, and copes with any depth.
    """
    if not path.exists() and not path.is_symlink():
        return
    for point in mountpoints_under(path):
        with contextlib.suppress(HostError):
            run(["umount", "--lazy", point], timeout=60)
    left = mountpoints_under(path)
    if left:
        raise HostError(f"refusing to delete {path}: still mounted below it: {', '.join(map(str, left))}")
    try:
        trees.remove_tree(path)
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot remove {path}: {exc}") from exc


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON durably: temp file, fsync, rename, directory fsync."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        trees.fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise HostError(f"cannot write {path}: {exc}") from exc


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing) for the block.

    The lock is tied to the open file, so a crashed holder releases it automatically.
    """
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise HostError(f"cannot open lock file {lock_path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock
