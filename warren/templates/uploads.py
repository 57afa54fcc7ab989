"""Build-context uploads, content-addressed by the SDK's ``filesHash``.

    state_dir/uploads/
        <filesHash>.tar     one COPY step's files as the SDK sent them (a tar, usually gzipped)
        tmp/                uploads in progress (emptied when the store opens)

``GET /templates/{id}/files/{hash}`` answers ``present`` from here, so a context that did not change
is never uploaded twice, for any template. The hash covers ``COPY <src> <dest>`` and the files, not
the tar bytes: it is checked when a build uses the upload (``steps.files_hash_of_tar``), and an
upload that fails the check is removed so that the next attempt sends it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import IO

from warren.errors import HostError, InvalidRequestError, PayloadTooLargeError
from warren.trees import QUARANTINE, move_aside, remove_tree

_HASH = re.compile(r"^[0-9a-f]{64}$")
MAX_UPLOAD_BYTES = 4 << 30
_FLUSH_BYTES = 1 << 20
UNUSED_GRACE_S = 3600.0
"""An upload no template refers to is kept this long: the build that will use it may not have started."""


def upload_too_large(max_bytes: int) -> str:
    return f"upload larger than this node accepts ({max_bytes} bytes; WARREN_MAX_UPLOAD_BYTES)"


def check_hash(files_hash: str) -> str:
    if not _HASH.match(files_hash):
        raise InvalidRequestError(f"invalid files hash {files_hash!r}: expected 64 lower-case hex digits")
    return files_hash


def _sync(fh: IO[bytes]) -> None:
    fh.flush()
    os.fsync(fh.fileno())


class UploadStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / "tmp"
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)
            for leftover in sorted(self.tmp.iterdir()):
                try:
                    remove_tree(leftover)  # a file normally; whatever it is, it must not stop the node
                except (OSError, ValueError) as exc:
                    move_aside(leftover, root.parent / QUARANTINE, f"an upload temp entry that cannot go ({exc})")
        except OSError as exc:
            raise HostError(f"cannot open the upload store {root}: {exc}") from exc

    def path(self, files_hash: str) -> Path:
        return self.root / f"{check_hash(files_hash)}.tar"

    def has(self, files_hash: str) -> bool:
        return self.path(files_hash).is_file()

    async def receive(
        self, files_hash: str, chunks: AsyncIterator[bytes], *, max_bytes: int = MAX_UPLOAD_BYTES
    ) -> int:
        """Store an upload (replacing an earlier one); returns its size. It appears only complete."""
        final = self.path(files_hash)
        tmp = self.tmp / f"{files_hash}-{secrets.token_hex(4)}"
        size = 0
        try:
            out = await asyncio.to_thread(tmp.open, "wb")
            try:
                pending: list[bytes] = []
                buffered = 0
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:  # counted as it arrives: a declared length is never trusted
                        raise PayloadTooLargeError(upload_too_large(max_bytes))
                    pending.append(chunk)
                    buffered += len(chunk)
                    if buffered >= _FLUSH_BYTES:
                        await asyncio.to_thread(out.write, b"".join(pending))
                        pending, buffered = [], 0
                await asyncio.to_thread(out.write, b"".join(pending))
                await asyncio.to_thread(_sync, out)
            finally:
                out.close()
            if size == 0:
                raise InvalidRequestError("empty upload: expected a tar archive of the build files")
            os.replace(tmp, final)
        except OSError as exc:
            raise HostError(f"cannot store upload {files_hash}: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        return size

    def remove(self, files_hash: str) -> None:
        with contextlib.suppress(OSError):
            self.path(files_hash).unlink(missing_ok=True)

    def gc(self, keep: Iterable[str], *, grace_s: float = UNUSED_GRACE_S) -> list[str]:
        """Remove uploads not in ``keep`` and older than ``grace_s``; returns their hashes."""
        wanted = set(keep)
        now = time.time()
        removed = []
        for entry in self.root.glob("*.tar"):
            name = entry.name.removesuffix(".tar")
            if not _HASH.match(name) or name in wanted:
                continue
            try:
                if now - entry.stat().st_mtime < grace_s:
                    continue
                entry.unlink()
            except OSError:
                continue
            removed.append(name)
        return removed


__all__ = ["MAX_UPLOAD_BYTES", "UploadStore", "check_hash", "upload_too_large"]
