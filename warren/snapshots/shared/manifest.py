"""A bundle's manifest: which data object holds the bundle, its sha256 and size, and the caller's meta.

Like a local snapshot's manifest (``warren/snapshots/manifest.py``) it carries a magic string, a format
version and the sha256 of its own canonical body, so a truncated, hand-edited or foreign file is refused
rather than half-trusted::

    {"magic": "warren-shared-bundle", "version": 1, "sha256": "<of the canonical body>",
     "bundle": {"key": ..., "data_object": ..., "sha256": ..., "size": ..., "created_at": ..., "meta": {...}}}
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from ...errors import HostError, InvalidRequestError
from .objects import MAX_KEY_LENGTH, check_key

__all__ = ["MANIFEST", "MAX_MANIFEST_BYTES", "BundleError", "BundleManifest", "check_bundle_key", "data_object_re"]

MAGIC = "warren-shared-bundle"
VERSION = 1
MANIFEST = "manifest.json"
"""The manifest of bundle ``k`` is object ``k/manifest.json``; its data objects are ``k/data-<16 hex>.tar``."""
MAX_MANIFEST_BYTES = 1 << 20
_DATA_NAME = re.compile(r"data-[0-9a-f]{16}\.tar")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DATA_NAME_LENGTH = len("/data-0123456789abcdef.tar")


class BundleError(HostError):
    """A bundle that cannot be trusted or unpacked: a bad manifest, a checksum or size mismatch, missing
    data, or a tar that failed. The message says which."""


def check_bundle_key(key: str) -> str:
    """``key`` when it can name a bundle: a valid object key (:func:`~.objects.check_key`) with room for
    its data objects' names, no component of which looks like a bundle's own object names."""
    check_key(key)
    if len(key) > MAX_KEY_LENGTH - _DATA_NAME_LENGTH:
        raise InvalidRequestError(f"bundle key is longer than {MAX_KEY_LENGTH - _DATA_NAME_LENGTH} characters")
    for part in key.split("/"):
        if part == MANIFEST or (part.startswith("data-") and part.endswith(".tar")):
            raise InvalidRequestError(f"bundle key {key[:80]!r} has a component named like a bundle's objects")
    return key


def data_object_re(key: str) -> re.Pattern[str]:
    """The names of ``key``'s data objects (direct children only: ``key/sub``'s are another bundle's)."""
    return re.compile(re.escape(key) + "/" + _DATA_NAME.pattern)


@dataclass(frozen=True)
class BundleManifest:
    key: str
    data_object: str
    """The object holding the tar archive: ``<key>/data-<16 hex>.tar``, a new name on every push."""
    sha256: str
    """Of the data object's bytes (hex)."""
    size: int
    """Of the data object, in bytes: a pull reads no more."""
    created_at: float
    meta: dict[str, Any]
    """Whatever the caller pushed with it (JSON): runtime hash, sandbox record, ..."""

    def body(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> bytes:
        body = self.body()
        digest = hashlib.sha256(_canonical(body)).hexdigest()
        return json.dumps({"magic": MAGIC, "version": VERSION, "sha256": digest, "bundle": body}, indent=1).encode()

    @classmethod
    def decode(cls, raw: bytes) -> BundleManifest:
        """Parse and verify a manifest (magic, version, checksum, field types, data object name)."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise BundleError("bundle manifest is too large")
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("magic") != MAGIC:
                raise BundleError("not a warren bundle manifest")
            if doc.get("version") != VERSION:
                raise BundleError(f"unsupported bundle manifest version {doc.get('version')!r}")
            body = doc["bundle"]
            if hashlib.sha256(_canonical(body)).hexdigest() != doc.get("sha256"):
                raise BundleError("bundle manifest checksum mismatch")
            manifest = cls(**body)
        except BundleError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BundleError(f"malformed bundle manifest: {exc}") from exc
        manifest.check()
        return manifest

    def check(self) -> None:
        """Field types and names, beyond the checksum (a manifest can be well-formed and still wrong)."""
        try:
            check_bundle_key(self.key)
        except InvalidRequestError as exc:
            raise BundleError(f"bundle manifest names a bad key: {exc}") from exc
        if not isinstance(self.data_object, str) or not data_object_re(self.key).fullmatch(self.data_object):
            raise BundleError(f"bundle manifest of {self.key!r} names a foreign data object {self.data_object!r}")
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise BundleError("bundle manifest has a malformed sha256")
        if type(self.size) is not int or self.size < 0:
            raise BundleError("bundle manifest has a malformed size")
        if type(self.created_at) not in (int, float) or not isinstance(self.meta, dict):
            raise BundleError("bundle manifest has a malformed created_at or meta")


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
