"""The snapshot repository: a directory layout on local disk or a shared mount.

    <root>/<snapshot_id>/data/...        what the runtime wrote (upper/, checkpoint/, meta.json)
    <root>/<snapshot_id>/manifest.json   written last, fsynced: a snapshot without it does not exist
    <root>/.tmp/<random>/                snapshots being written; emptied when the repository opens

Writes are atomic: data first (fsynced), then the manifest (temp file, fsync, rename, directory
fsync), then the staging dir is renamed into place.

Snapshot data is whatever the sandbox wrote: every walk, fsync and removal of it goes through
:mod:`warren.trees` (iterative, descriptor-based, never following symlinks). Opening the repository
never fails on garbage in it: a directory that is not a complete snapshot (no or an unreadable
manifest, e.g. half-written by an older version or by hand) is logged and moved aside into the
quarantine dir (``<root>/../quarantine`` unless given); a temp dir that cannot be removed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from .. import trees
from ..errors import ConflictError, NotFoundError
from .manifest import ManifestError, SnapshotManifest

MANIFEST = "manifest.json"
DATA = "data"
QUARANTINE = trees.QUARANTINE

log = logging.getLogger(__name__)


def _remove_or_move_aside(path: Path, quarantine: Path, what: str) -> None:
    """Remove a temp tree; if that fails, move it aside (logged): never raises ``OSError``."""
    try:
        trees.remove_tree(path)
    except (OSError, ValueError) as exc:
        trees.move_aside(path, quarantine, f"{what} that cannot be removed ({exc})")


class SnapshotRepository:
    def __init__(self, root: Path, quarantine: Path | None = None) -> None:
        self.root = root
        self._tmp = root / ".tmp"
        self.quarantine = quarantine if quarantine is not None else root.parent / QUARANTINE
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._sweep()

    def _sweep(self) -> None:
        """At open: empty ``.tmp`` (writes a crash interrupted), move aside what is not a snapshot."""
        for stale in sorted(self._tmp.iterdir()):
            _remove_or_move_aside(stale, self.quarantine, "a leftover snapshot temp dir")
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):
                continue
            reason = _not_a_snapshot(entry)
            if reason is not None:
                trees.move_aside(entry, self.quarantine, reason)

    def path(self, snapshot_id: str) -> Path:
        return self.root / snapshot_id

    def data_dir(self, snapshot_id: str) -> Path:
        return self.root / snapshot_id / DATA

    @contextlib.asynccontextmanager
    async def writing(self, snapshot_id: str) -> AsyncIterator[Path]:
        """Yield an empty data dir to fill; :meth:`commit` publishes it; leaving without commit discards."""
        if (self.root / snapshot_id).exists():
            raise ConflictError(f"snapshot {snapshot_id} exists already")
        staging = self._tmp / f"{snapshot_id}-{secrets.token_hex(4)}"
        (staging / DATA).mkdir(parents=True)
        try:
            yield staging / DATA
        finally:
            if staging.exists():
                await asyncio.shield(asyncio.to_thread(
                    _remove_or_move_aside, staging, self.quarantine, "the temp dir of a failed snapshot"))

    async def commit(self, data_dir: Path, manifest: SnapshotManifest) -> None:
        """Publish a staged snapshot: data fsynced, manifest last, then one rename into place."""
        staging = data_dir.parent

        def publish() -> None:
            trees.fsync_tree(data_dir)
            tmp = staging / (MANIFEST + ".tmp")
            with open(tmp, "wb") as f:
                f.write(manifest.encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, staging / MANIFEST)
            trees.fsync_dir(staging)
            os.rename(staging, self.root / manifest.snapshot_id)
            trees.fsync_dir(self.root)

        await asyncio.to_thread(publish)

    def get(self, snapshot_id: str) -> SnapshotManifest:
        if not snapshot_id or snapshot_id.startswith(".") or "/" in snapshot_id or "\x00" in snapshot_id:
            raise NotFoundError(f"snapshot {snapshot_id!r} not found")
        try:
            raw = (self.root / snapshot_id / MANIFEST).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"snapshot {snapshot_id} not found") from None
        except (UnicodeError, OSError) as exc:  # a name no file can have (too long, not encodable): none here
            if isinstance(exc, OSError) and exc.errno not in (errno.ENAMETOOLONG, errno.EILSEQ):
                raise
            raise NotFoundError(f"snapshot {snapshot_id!r} not found") from None
        return SnapshotManifest.decode(raw)

    def find(self, id_or_name: str) -> SnapshotManifest | None:
        """By id, then by name; None when neither matches."""
        try:
            return self.get(id_or_name)
        except NotFoundError:
            pass
        for manifest in self.list():
            if id_or_name in manifest.names:
                return manifest
        return None

    def list(self) -> list[SnapshotManifest]:
        """Every complete, verifiable snapshot, oldest first."""
        out = []
        for entry in self.root.iterdir() if self.root.is_dir() else []:
            if entry.name.startswith(".") or not (entry / MANIFEST).is_file():
                continue
            try:
                out.append(SnapshotManifest.decode((entry / MANIFEST).read_bytes()))
            except ManifestError:
                continue
        return sorted(out, key=lambda m: (m.created_at, m.snapshot_id))

    async def delete(self, snapshot_id: str) -> None:
        self.get(snapshot_id)
        trash = self._tmp / f"deleted-{snapshot_id}-{secrets.token_hex(4)}"

        def remove() -> None:
            os.rename(self.root / snapshot_id, trash)  # atomic: the snapshot is gone at once
            trees.fsync_dir(self.root)
            _remove_or_move_aside(trash, self.quarantine, "a deleted snapshot")

        await asyncio.to_thread(remove)


def _not_a_snapshot(entry: Path) -> str | None:
    """Why ``entry`` (in the repository root) is not a complete snapshot, or None when it is one."""
    if entry.is_symlink() or not entry.is_dir():
        return "not a snapshot directory"
    try:
        SnapshotManifest.decode((entry / MANIFEST).read_bytes())
    except FileNotFoundError:
        return f"a snapshot dir without {MANIFEST} (half-written)"
    except (OSError, ManifestError) as exc:
        return f"a snapshot dir with an unreadable {MANIFEST}: {exc}"
    return None
