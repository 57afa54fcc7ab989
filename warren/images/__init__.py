"""OCI image pulls into a shared, content-addressed layer store.

    store = LayerStore(state_dir / "images")
    image = await pull("busybox:latest", store, config=RegistryConfig())
    image.layers      # layer directories, lowest first (overlayfs lowerdirs in reverse order)
    store.gc(referenced={...diffIDs still in use...})

See ``store.py`` for the on-disk layout, ``layers.py`` for the extraction safety rules and
``errors.py`` for the errors.
"""

from __future__ import annotations

from warren.images.config import Credentials, RegistryConfig, load_docker_config
from warren.images.errors import (
    DigestMismatchError,
    LayerTooLargeError,
    RegistryAuthError,
    RegistryError,
    UnsafeLayerError,
    UnsupportedImageError,
)
from warren.images.layers import OPAQUE_XATTR, unpack_layer
from warren.images.pull import ProgressEvent, PulledImage, pull
from warren.images.reference import Reference, parse_reference
from warren.images.store import LayerStore

__all__ = [
    "OPAQUE_XATTR",
    "Credentials",
    "DigestMismatchError",
    "LayerStore",
    "LayerTooLargeError",
    "ProgressEvent",
    "PulledImage",
    "Reference",
    "RegistryAuthError",
    "RegistryConfig",
    "RegistryError",
    "UnsafeLayerError",
    "UnsupportedImageError",
    "load_docker_config",
    "parse_reference",
    "pull",
    "unpack_layer",
]
