"""Errors of image pulls, each a subclass of the warren error tree (``warren/errors.py``).

    RegistryError(HostError)                the registry is unreachable, failing (5xx) or answers garbage
    RegistryAuthError(AuthenticationError)  the registry refused our credentials, or we have none (401/403)
    DigestMismatchError(HostError)          a blob, manifest or unpacked layer does not match its digest
    UnsafeLayerError(InvalidRequestError)   a layer tar tries to escape its directory or create a device
    UnsupportedImageError(InvalidRequestError)  schema-1 manifests, zstd layers, foreign layers, ...
    LayerTooLargeError(InvalidRequestError)     a layer over the node's compressed or unpacked size cap

Unknown repositories, tags and platforms raise plain ``NotFoundError``.
"""

from __future__ import annotations

from warren.errors import AuthenticationError, HostError, InvalidRequestError


class RegistryError(HostError):
    """The registry could not be reached, failed (5xx, 429) or sent something we cannot use."""


class RegistryAuthError(AuthenticationError):
    """The registry answered 401/403: credentials missing, wrong, or not allowed to pull this repository.

    These are *registry* credentials (docker ``config.json`` or warren's registry config), not the
    caller's warren API key.
    """


class DigestMismatchError(HostError):
    """Downloaded or unpacked content does not hash to the digest that names it."""


class UnsafeLayerError(InvalidRequestError):
    """A layer tar member would escape the layer directory, or is a device node / unsafe link."""


class UnsupportedImageError(InvalidRequestError):
    """The image uses a format warren does not handle (schema 1, zstd, foreign/non-distributable layers)."""


class LayerTooLargeError(InvalidRequestError):
    """A layer is larger (compressed, or as an uncompressed tar stream) than the node accepts.

    Counted from the bytes that arrive, never from the size a manifest declares."""


__all__ = [
    "DigestMismatchError",
    "LayerTooLargeError",
    "RegistryAuthError",
    "RegistryError",
    "UnsafeLayerError",
    "UnsupportedImageError",
]
