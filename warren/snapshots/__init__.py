"""Snapshot repository: directory layout, atomic writes, verified manifests."""

from .manifest import ManifestError, SnapshotManifest
from .repository import SnapshotRepository

__all__ = ["ManifestError", "SnapshotManifest", "SnapshotRepository"]
