"""Tree copies a cancellation stops at once: :func:`warren.trees.copy_tree` in a child process.

A copy in a worker thread can only be asked to stop (at its next entry), and one large file or a slow
disk keeps the thread, the destination and the caller's cancellation waiting. A child process is
killed. Usage::

    await copy_tree(src, dst)    # dst must not exist; after any failure or cancellation it does not

The child is ``python -m warren.treecopy SRC DST``: :func:`warren.trees.copy_tree` (symlinks never
followed, overlay whiteouts, xattrs, owners and hard links kept), which removes its partial copy when
it fails. When the calling task is cancelled the child gets ``SIGKILL`` and the parent removes the
partial ``dst`` (shielded from a second cancellation) before the cancellation propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import warren
from warren import trees
from warren.errors import HostError

__all__ = ["copy_tree", "main"]

STDERR_TAIL_CHARS = 2000
_PACKAGE_ROOT = str(Path(warren.__file__).resolve().parent.parent)
"""The directory holding the ``warren`` package the parent runs: the child imports the same code."""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


async def copy_tree(src: Path, dst: Path) -> None:
    """Copy directory ``src`` to the new directory ``dst`` in a child process (see the module docstring).

    Raises ``HostError`` when ``dst`` exists or the copy fails; on cancellation the child is killed and
    ``dst`` removed before ``CancelledError`` propagates.
    """
    if await asyncio.to_thread(os.path.lexists, dst):
        raise HostError(f"cannot copy {src} to {dst}: the destination exists")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "warren.treecopy", os.fspath(src), os.fspath(dst),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=_child_env(),
    )  # fmt: skip
    try:
        _, err = await proc.communicate()
    except BaseException:
        await asyncio.shield(_kill_and_remove(proc, dst))
        raise
    if proc.returncode != 0:
        await asyncio.shield(_remove(dst))
        detail = err.decode(errors="replace").strip()[-STDERR_TAIL_CHARS:] or f"exit status {proc.returncode}"
        raise HostError(f"copying {src} to {dst} failed: {detail}")


async def _kill_and_remove(proc: asyncio.subprocess.Process, dst: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
    await _remove(dst)


async def _remove(dst: Path) -> None:
    await asyncio.to_thread(_remove_now, dst)


def _remove_now(dst: Path) -> None:
    if os.path.lexists(dst):
        trees.remove_tree(dst)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m warren.treecopy SRC DST``: exit 0 when copied, 1 (reason on stderr) when not."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m warren.treecopy SRC DST", file=sys.stderr)
        return 2
    try:
        trees.copy_tree(args[0], args[1])
    except (OSError, ValueError, trees.TreeLimitExceeded) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
