"""Deep directory trees for the hostile-tree tests (issue 9), and temp dirs that can hold them.

A deep tree must never be left under pytest's shared basetemp: pytest removes old basetemps with a
recursive ``shutil.rmtree``, which dies on it (RecursionError) in every later pytest run on the host.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from warren import trees

__all__ = ["make_deep", "private_dir"]


def make_deep(root: Path, depth: int, *, name: str = "d", leaf: str = "f", data: bytes = b"") -> None:
    """``root/d/d/.../d/f``: ``depth`` directories below ``root`` (made if missing) and a file ``leaf``
    holding ``data`` at the bottom, made through directory fds (the path may exceed PATH_MAX)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(leaf, os.O_WRONLY | os.O_CREAT, 0o640, dir_fd=fd)
        try:
            os.write(out, data)
        finally:
            os.close(out)
    finally:
        os.close(fd)


@contextlib.contextmanager
def private_dir(parent: str | None = None) -> Iterator[Path]:
    """A temp dir outside pytest's basetemp, removed afterwards with ``trees.remove_tree`` (``rm -rf``,
    which is iterative too, if that fails)."""
    top = Path(tempfile.mkdtemp(prefix="warren-deep-", dir=parent))
    try:
        yield top
    finally:
        try:
            trees.remove_tree(top)
        except Exception:
            subprocess.run(["rm", "-rf", "--one-file-system", "--", str(top)], check=False)
