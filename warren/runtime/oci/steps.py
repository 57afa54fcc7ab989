"""Small building blocks of :class:`~warren.runtime.oci.runtime.OciRuntime` that need no backend state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from warren import trees
from warren.errors import RuntimeFailure, WarrenError
from warren.runtime.oci.layout import SandboxPaths, SandboxRecord
from warren.runtime.rootfs import mounts_under

__all__ = [
    "as_runtime_failure",
    "load_record",
    "read_pid",
    "remove_tree",
    "set_aside_unreadable",
    "thread_to_end",
    "undo_step",
]

T = TypeVar("T")

_log = logging.getLogger(__name__)


async def undo_step(what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Run one undo step of a failed operation; log its failure instead of masking the original error."""
    try:
        await fn(*args)
    except Exception:
        _log.exception("undo of %s after a failed operation failed", what)


async def thread_to_end(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread that a cancellation does not outrun: a cancelled caller waits for
    the thread to end before the cancellation goes on, so the next step (an undo) sees its effect."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # retrieved: the caller sees the cancellation
        raise


def remove_tree(root: Path) -> None:
    """rm -r, but never through a mount point (an overlay still mounted would be emptied); iterative
    and symlink-safe (:func:`warren.trees.remove_tree`), so any tree a sandbox made goes."""
    if not root.exists():
        return
    mounted = mounts_under(root)
    if mounted:
        raise RuntimeFailure(f"refusing to delete {root}: still mounted: {', '.join(map(str, mounted))}")
    trees.remove_tree(root)


def set_aside_unreadable(paths: SandboxPaths, quarantine: Path) -> bool:
    """At start-up: move a sandbox dir whose record exists but cannot be read (or a stray non-directory)
    into ``quarantine`` (logged), so that it neither stops the node nor lingers. A dir without a record
    (a crash between mkdir and the record) is left to the orphan reaper, and so is one with something
    mounted below it (the reaper unmounts first). Returns whether it was moved."""
    root = paths.root
    if root.is_dir() and not root.is_symlink():
        if not os.path.lexists(paths.record):
            return False
        reason = f"unreadable sandbox record {paths.record.name}"
    else:
        reason = "not a sandbox directory"
    if mounts_under(root):
        _log.warning("%s: %s, but something is mounted below it; left to the orphan reaper", root, reason)
        return False
    return trees.move_aside(root, quarantine, reason) is not None


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def load_record(paths: SandboxPaths) -> SandboxRecord | None:
    """The record on disk, or None when there is none (or it cannot be read: logged)."""
    try:
        return SandboxRecord.from_json(paths.record.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("unreadable sandbox record %s: %s", paths.record, exc)
        return None


@contextlib.asynccontextmanager
async def as_runtime_failure(what: str) -> AsyncIterator[None]:
    """Turn stray OS errors (mkdir, writes, mount) into ``RuntimeFailure``; warren errors pass through."""
    try:
        yield
    except WarrenError:
        raise
    except OSError as exc:
        raise RuntimeFailure(f"{what} failed: {exc}") from exc
