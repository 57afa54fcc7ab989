"""A snapshot dir as one tar archive and back, with GNU tar in a child process (never Python's tarfile).

A snapshot dir is what a sandbox wrote: symlinks anywhere (absolute, dangling), overlay whiteouts (char
devices 0/0), ``trusted.overlay.opaque`` xattrs, files of any owner with any mode (setuid), sparse
files, hard links. GNU tar keeps all of these with the flags below and never follows a symlink (no
``-h``); ``--one-file-system`` keeps a mount inside the dir out. On extraction GNU tar refuses members
with ``..`` and creates a symlink whose target is absolute or has ``..`` only after every other
member, behind a placeholder, so nothing is ever written through one; ``--keep-old-files`` makes a
member that would replace an earlier one an error. The archive is only unpacked after its sha256
matched its manifest anyway, but the store may be writable by more than warren.

A cancelled pack or unpack kills its tar (SIGKILL) and reaps it before the cancellation propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from .manifest import BundleError

__all__ = ["hash_file", "pack", "unpack"]

_CHUNK = 1 << 20
STDERR_TAIL_CHARS = 2000
_COMMON = ["--format=posix", "--xattrs", "--xattrs-include=*", "--numeric-owner"]
_PACK = ["--create", "--file=-", *_COMMON, "--sparse", "--one-file-system"]
_UNPACK = ["--extract", *_COMMON, "--same-owner", "--same-permissions", "--keep-old-files",
           "--delay-directory-restore"]  # fmt: skip
_ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
"""A fixed locale: names are archived as the bytes they are, whatever the node's environment says."""


def _tar() -> str:
    found = shutil.which("tar", path=_ENV["PATH"])
    if found is None:
        raise BundleError("GNU tar is not installed (Debian package tar)")
    return found


async def pack(src: Path, out: Path) -> tuple[str, int]:
    """Archive directory ``src`` into the new file ``out``; returns the archive's sha256 (hex) and size.

    tar writes to a pipe; a thread hashes what it reads and writes it to ``out`` (one pass over the
    data). ``out`` is left for the caller to remove, whatever happens.
    """
    try:
        read_end, write_end = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                _tar(), *_PACK, "-C", os.fspath(src), ".",
                stdin=asyncio.subprocess.DEVNULL, stdout=write_end, stderr=asyncio.subprocess.PIPE, env=_ENV,
            )  # fmt: skip
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        # The thread owns read_end and closes it when done: tar then gets EPIPE if the thread failed first.
        drained = asyncio.get_running_loop().run_in_executor(None, _drain, read_end, out)
        try:
            _, err = await proc.communicate()
            digest, size = await drained
        except BaseException:
            await asyncio.shield(_stop(proc, drained))
            raise
    except OSError as exc:
        raise BundleError(f"could not pack {src} into {out}: {exc}") from exc
    if proc.returncode != 0:
        raise BundleError(f"tar could not pack {src} (exit {proc.returncode}): {_tail(err)}")
    return digest, size


async def unpack(archive: Path, dest: Path) -> None:
    """Extract ``archive`` into the existing directory ``dest``. On failure what tar made is left in
    ``dest`` for the caller to clear."""
    try:
        proc = await asyncio.create_subprocess_exec(
            _tar(), *_UNPACK, f"--file={os.fspath(archive)}", "-C", os.fspath(dest),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=_ENV,
        )  # fmt: skip
    except OSError as exc:
        raise BundleError(f"could not start tar: {exc}") from exc
    try:
        _, err = await proc.communicate()
    except BaseException:
        await asyncio.shield(_stop(proc, None))
        raise
    if proc.returncode != 0:
        raise BundleError(f"tar could not unpack the bundle (exit {proc.returncode}): {_tail(err)}")


def hash_file(path: Path) -> tuple[str, int]:
    """sha256 (hex) and size of a file, read once (synchronous: run it in a thread)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _drain(fd: int, out: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    try:
        with open(out, "xb") as f:
            while chunk := os.read(fd, _CHUNK):
                h.update(chunk)
                f.write(chunk)
                size += len(chunk)
            f.flush()
    finally:
        os.close(fd)
    return h.hexdigest(), size


async def _stop(proc: asyncio.subprocess.Process, drained: asyncio.Future[tuple[str, int]] | None) -> None:
    """Kill and reap tar; then wait for the drain thread, which sees end of file once tar is gone."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()
    if drained is not None:
        with contextlib.suppress(Exception):
            await drained


def _tail(err: bytes | None) -> str:
    text = (err or b"").decode("utf-8", "replace").strip()
    return text[-STDERR_TAIL_CHARS:] or "no message"
