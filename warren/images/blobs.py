"""Content-addressed blob files and single-flight de-duplication of concurrent work.

    blobs/sha256/<hex>     a complete blob whose digest has been verified
    partial/sha256/<hex>   an interrupted download, resumed (HTTP Range) by the next fetch
    tmp/                   private downloads when another process holds the partial file

A blob reaches its final name only by rename after verification, so a file under ``blobs/`` is
always complete and correct. A partial file is kept after a dropped connection or a cancelled
pull (so the next pull resumes), and removed after a digest mismatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO, Generic, TypeVar

from warren.errors import HostError, InvalidRequestError
from warren.images.errors import DigestMismatchError, LayerTooLargeError

T = TypeVar("T")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")

Downloader = Callable[[BinaryIO], Awaitable[None]]
"""Fills an ``r+b`` file (possibly holding a prefix already) with the complete, verified blob."""


def digest_hex(digest: str) -> str:
    """The hex part of a ``sha256:<hex>`` digest; ``InvalidRequestError`` for anything else."""
    m = _DIGEST.match(digest)
    if m is None:
        raise InvalidRequestError(f"not a sha256 digest: {digest!r}")
    return m.group(1)


class _LeaderGone(Exception):
    """The task doing the work was cancelled or failed; a waiter should try itself."""


class SingleFlight(Generic[T]):
    """At most one running ``fn`` per key within an event loop; concurrent callers share its result.

    A caller that waited gets the leader's result. If the leader fails or is cancelled, waiters do
    not inherit that: each retries and may become the next leader, so one pull's failure or
    cancellation never fails another pull.
    """

    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Future[T]] = {}

    def busy(self, key: str) -> bool:
        return key in self._flights

    async def run(self, key: str, fn: Callable[[], Awaitable[T]], on_wait: Callable[[], None] | None = None) -> T:
        while (flight := self._flights.get(key)) is not None:
            if on_wait is not None:
                on_wait()
            try:
                return await asyncio.shield(flight)
            except _LeaderGone:
                continue
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._flights[key] = fut
        try:
            result = await fn()
        except BaseException:
            fut.set_exception(_LeaderGone())
            fut.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            del self._flights[key]


class BlobCache:
    """Verified blobs under ``root/blobs``, resumable downloads under ``root/partial``."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.blobs = root / "blobs" / "sha256"
        self.partial = root / "partial" / "sha256"
        self._tmp = tmp
        for d in (self.blobs, self.partial):
            d.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.blobs / digest_hex(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def digests(self) -> list[str]:
        return sorted(f"sha256:{p.name}" for p in self.blobs.iterdir() if _DIGEST.match(f"sha256:{p.name}"))

    def partials(self) -> list[Path]:
        return sorted(self.partial.iterdir())

    async def fetch(self, digest: str, download: Downloader) -> Path:
        """The path of verified blob ``digest``, downloading it (resuming a partial file) if missing.

        Callers de-duplicate concurrent fetches of one digest (``SingleFlight``); a second
        process fetching the same blob finds the partial file locked and downloads privately.
        """
        final = self.path(digest)
        if final.is_file():
            return final
        partial = self.partial / final.name
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise HostError(f"cannot create {partial}: {exc}") from exc
        private = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            private = True
            partial = self._tmp / f"blob-{final.name}-{secrets.token_hex(4)}"
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        keep = not private
        try:
            with os.fdopen(fd, "r+b") as out:
                await download(out)
                out.flush()
                await asyncio.to_thread(os.fsync, out.fileno())
                os.rename(partial, final)
            keep = True
        except (DigestMismatchError, LayerTooLargeError):  # never resumed: it would fail again
            keep = False
            raise
        except OSError as exc:
            keep = False
            raise HostError(f"cannot store blob {digest}: {exc}") from exc
        finally:
            if not keep or (private and not final.exists()) or _empty(partial):
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()
        return final

    def remove(self, digest: str) -> bool:
        """Delete blob ``digest`` if present; True if it was."""
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise HostError(f"cannot remove blob {digest}: {exc}") from exc
        return True

    def remove_partial(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.partial / digest_hex(digest)).unlink()


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return False


__all__ = ["BlobCache", "Downloader", "SingleFlight", "digest_hex"]
