"""The layer store: every image layer unpacked once, keyed by diffID, shared by all images.

    <root>/
        layers/<diffid-hex>/     one unpacked layer (read-only once renamed into place)
        blobs/sha256/<hex>       verified compressed layer blobs, deleted once unpacked
        partial/sha256/<hex>     interrupted downloads, resumed by the next pull (HTTP Range)
        tmp/                     unpacks in progress, private downloads, trash; emptied on open

A layer directory appears only complete (unpacked under ``tmp/``, checked against its diffID,
synced, then renamed). One ``LayerStore`` per root per process: opening one empties ``tmp/``.
Only entries named by 64 hex digits are ever garbage-collected, so the root may be shared with
other data (but should not be).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from warren import trees
from warren.errors import HostError
from warren.images.blobs import BlobCache, Downloader, SingleFlight, digest_hex
from warren.images.errors import LayerTooLargeError
from warren.images.layers import describe_dropped, remove_tree, unpack_layer

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class LayerStore:
    """Unpacked layers and the blob cache under ``root``."""

    def __init__(self, root: Path, quarantine: Path | None = None) -> None:
        self.root = root
        self.layers_dir = root / "layers"
        self.tmp = root / "tmp"
        self.quarantine = quarantine if quarantine is not None else root.parent / trees.QUARANTINE
        """Where leftovers that cannot be removed at open are moved aside (never fatal)."""
        try:
            for d in (self.layers_dir, self.tmp):
                d.mkdir(parents=True, exist_ok=True)
            for leftover in sorted(self.tmp.iterdir()):
                try:
                    trees.remove_tree(leftover)
                except (OSError, ValueError) as exc:
                    trees.move_aside(leftover, self.quarantine, f"a layer store temp entry that cannot go ({exc})")
            self.blobs = BlobCache(root, self.tmp)
        except OSError as exc:
            raise HostError(f"cannot open layer store {root}: {exc}") from exc
        self._flights: SingleFlight[bool] = SingleFlight()
        self._pins: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._dropped: dict[str, list[str]] = {}
        """diffID -> device nodes its unpack dropped, until ``ensure_layer`` reports them."""

    def layer_path(self, diff_id: str) -> Path:
        """Where layer ``diff_id`` (``sha256:<hex>``) lives, whether or not it exists yet."""
        return self.layers_dir / digest_hex(diff_id)

    def has_layer(self, diff_id: str) -> bool:
        return self.layer_path(diff_id).is_dir()

    def layer_ids(self) -> list[str]:
        """The diffIDs of every layer present."""
        return sorted(f"sha256:{p.name}" for p in self.layers_dir.iterdir() if _HEX64.match(p.name))

    @contextlib.contextmanager
    def pinned(self, digests: Iterable[str]) -> Iterator[None]:
        """Protect layers/blobs ``digests`` from ``gc`` while a pull uses them."""
        keys = set(digests)
        with self._lock:
            self._pins.update(keys)
        try:
            yield
        finally:
            with self._lock:
                self._pins.subtract(keys)
                for key in keys:
                    if self._pins[key] <= 0:
                        del self._pins[key]

    def pin_count(self, digest: str) -> int:
        with self._lock:
            return self._pins[digest]

    async def ensure_layer(
        self,
        diff_id: str,
        blob_digest: str,
        download: Downloader,
        *,
        unpack_slots: asyncio.Semaphore,
        on_warning: Callable[[str], None] | None = None,
        on_wait: Callable[[], None] | None = None,
        on_unpack: Callable[[bool], None] | None = None,
        max_unpacked_bytes: int | None = None,
    ) -> bool:
        """Make layer ``diff_id`` present, downloading and unpacking blob ``blob_digest`` if needed.

        ``max_unpacked_bytes`` caps the uncompressed tar stream (``LayerTooLargeError``, nothing kept).

        Concurrent calls for one diffID share one download and unpack. Returns True if this call
        (or the call it waited for) created the layer, False if it was already there.
        """
        final = self.layer_path(diff_id)

        async def work() -> bool:
            if final.is_dir():
                return False
            blob = await self.blobs.fetch(blob_digest, download)
            async with unpack_slots:
                if on_unpack is not None:
                    on_unpack(False)
                try:
                    await self._unpack(blob, diff_id, final, max_unpacked_bytes)
                except LayerTooLargeError:
                    self.blobs.remove(blob_digest)  # never worth keeping: it would fail again
                    raise
                if on_unpack is not None:
                    on_unpack(True)
                dropped = self._dropped.pop(diff_id, [])
                if dropped and on_warning is not None:
                    on_warning(describe_dropped(dropped))
            self.blobs.remove(blob_digest)
            return True

        if final.is_dir():
            return False
        return await self._flights.run(diff_id, work, on_wait)

    async def _unpack(self, blob: Path, diff_id: str, final: Path, max_bytes: int | None = None) -> None:
        tmp = self.tmp / f"layer-{final.name}-{secrets.token_hex(4)}"
        cancel = threading.Event()
        fut = asyncio.get_running_loop().run_in_executor(None, unpack_layer, blob, tmp, diff_id, cancel, max_bytes)
        try:
            self._dropped[diff_id] = await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancel.set()  # the worker stops at its next member and removes its directory
            with contextlib.suppress(BaseException):
                await fut
            raise
        try:
            os.rename(tmp, final)
        except OSError as exc:
            remove_tree(tmp)
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):  # else: another process was faster
                raise HostError(f"cannot move layer {diff_id} into place: {exc}") from exc
        trees.fsync_dir(self.layers_dir)

    async def discard_layer(self, diff_id: str) -> None:
        """Remove layer ``diff_id`` (a failed pull rolling back what it created)."""
        trash = self._to_trash(self.layer_path(diff_id))
        if trash is not None:
            await asyncio.to_thread(remove_tree, trash)

    def _to_trash(self, path: Path) -> Path | None:
        trash = self.tmp / f"gc-{path.name}-{secrets.token_hex(4)}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HostError(f"cannot remove {path}: {exc}") from exc
        return trash

    def gc(self, referenced: set[str]) -> list[str]:
        """Remove every layer, blob and partial download not in ``referenced`` (nor in use by a pull).

        ``referenced`` holds digests (``sha256:<hex>``; bare hex is accepted): the diffIDs of layers
        that images, templates and snapshots still use. Returns what was removed, as paths relative
        to the store root (``layers/<hex>``, ``blobs/sha256/<hex>``, ``partial/sha256/<hex>``).
        A pull's layers are protected only while it runs: record them as referenced before the
        next ``gc``.
        """
        keep = {d if d.startswith("sha256:") else f"sha256:{d}" for d in referenced}
        removed: list[str] = []
        trash: list[Path] = []
        with self._lock:
            busy = {d for d, n in self._pins.items() if n > 0}
            for entry in sorted(self.layers_dir.iterdir()):
                digest = f"sha256:{entry.name}"
                if _HEX64.match(entry.name) and digest not in keep and digest not in busy:
                    if not self._flights.busy(digest) and (moved := self._to_trash(entry)) is not None:
                        trash.append(moved)
                        removed.append(f"layers/{entry.name}")
            for digest in self.blobs.digests():
                if digest not in keep and digest not in busy and self.blobs.remove(digest):
                    removed.append(f"blobs/sha256/{digest_hex(digest)}")
            for partial in self.blobs.partials():
                if f"sha256:{partial.name}" not in busy and _HEX64.match(partial.name) and _unlink_unlocked(partial):
                    removed.append(f"partial/sha256/{partial.name}")
            trash.extend(p for p in self.tmp.iterdir() if p.name.startswith("gc-") and p not in trash)
        for path in trash:
            remove_tree(path)
        return removed


def _unlink_unlocked(path: Path) -> bool:
    """Delete a partial download unless a download holds its lock."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        path.unlink()
    finally:
        os.close(fd)
    return True


__all__ = ["LayerStore"]
