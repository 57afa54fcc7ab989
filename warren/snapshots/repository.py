"""The snapshot repository: a directory layout on local disk or a shared mount.

    <root>/<snapshot_id>/data/...        what the runtime wrote (upper/, checkpoint/, meta.json)
    <root>/<snapshot_id>/manifest.json   written last, fsynced: a snapshot without it does not exist
    <root>/.tmp/<random>/                snapshots being written; emptied when the repository opens

Writes are atomic: data first (fsynced), then the manifest (temp file, fsync, rename, directory
fsync), then the staging dir is renamed into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from ..errors import ConflictError, NotFoundError
from .manifest import ManifestError, SnapshotManifest

MANIFEST = "manifest.json"
DATA = "data"


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # sockets, fifos, whiteout char devices: nothing to sync
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotRepository:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._tmp = root / ".tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        for stale in self._tmp.iterdir():
            shutil.rmtree(stale, ignore_errors=True)

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
                await asyncio.to_thread(shutil.rmtree, staging, True)

    async def commit(self, data_dir: Path, manifest: SnapshotManifest) -> None:
        """Publish a staged snapshot: data fsynced, manifest last, then one rename into place."""
        staging = data_dir.parent

        def publish() -> None:
            _fsync_tree(data_dir)
            tmp = staging / (MANIFEST + ".tmp")
            with open(tmp, "wb") as f:
                f.write(manifest.encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, staging / MANIFEST)
            _fsync_dir(staging)
            os.rename(staging, self.root / manifest.snapshot_id)
            _fsync_dir(self.root)

        await asyncio.to_thread(publish)

    def get(self, snapshot_id: str) -> SnapshotManifest:
        if snapshot_id.startswith(".") or "/" in snapshot_id:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        try:
            raw = (self.root / snapshot_id / MANIFEST).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"snapshot {snapshot_id} not found") from None
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
            _fsync_dir(self.root)
            shutil.rmtree(trash, ignore_errors=True)

        await asyncio.to_thread(remove)
