"""The shared snapshot store: snapshot dirs as verified bundles in storage every node reaches.

    objects = open_object_store("s3://bucket/warren")        # or a shared mount: "/mnt/warren-shared"
    bundles = SharedSnapshots(objects, scratch=Path("/var/lib/warren/tmp/shared"))
    await bundles.push("sandboxes/<id>", snapshot_dir, meta)  # one node parks a paused sandbox
    await bundles.pull("sandboxes/<id>", empty_dir)           # any node with its runtime takes it up

``objects.py`` the :class:`ObjectStore` seam and key rules; ``dirstore.py`` and ``s3store.py`` its two
backends; ``bundles.py`` the bundle protocol (data first, manifest last) over any of them;
``manifest.py`` the verified manifest; ``archive.py`` GNU tar in a child process; ``config.py`` store
URLs. boto3 is imported only when an S3 store is made (``S3ObjectStore`` here is imported lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .bundles import SharedSnapshots
from .config import open_object_store
from .dirstore import DirObjectStore
from .manifest import BundleError, BundleManifest
from .objects import LIST_LIMIT, MAX_KEY_LENGTH, ObjectStore, ObjectTooLargeError, check_key, check_prefix

if TYPE_CHECKING:
    from .s3store import S3ObjectStore

__all__ = [
    "LIST_LIMIT",
    "MAX_KEY_LENGTH",
    "BundleError",
    "BundleManifest",
    "DirObjectStore",
    "ObjectStore",
    "ObjectTooLargeError",
    "S3ObjectStore",
    "SharedSnapshots",
    "check_key",
    "check_prefix",
    "open_object_store",
]


def __getattr__(name: str) -> Any:
    if name == "S3ObjectStore":
        from .s3store import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
