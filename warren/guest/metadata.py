"""User-defined file metadata (envd >= 0.6.2): ``X-Metadata-<key>`` upload headers stored as
``user.e2b.<key>`` extended attributes, keys lower-cased, returned in ``EntryInfo.metadata``.

Each upload replaces the file's whole set (keys it does not name are removed, so an upload without
metadata clears it). Keys and values are printable US-ASCII; a key is at most 246 bytes (the VFS
name limit minus the prefix) and a file's set at most 4096 bytes, prefixes counted, as envd checks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping

__all__ = [
    "HEADER_PREFIX", "MAX_KEY_LEN", "MAX_TOTAL_LEN", "XATTR_PREFIX", "MetadataError", "from_headers", "read",
    "validate", "write",
]

HEADER_PREFIX = "x-metadata-"
XATTR_PREFIX = "user.e2b."
MAX_KEY_LEN = 255 - len(XATTR_PREFIX)
MAX_TOTAL_LEN = 4096
_UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP)


class MetadataError(ValueError):
    """Metadata a client sent that cannot be stored (the message says why)."""


def from_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``X-Metadata-*`` headers (names already lower-cased), prefix stripped; empty keys skipped."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if key.startswith(HEADER_PREFIX) and len(key) > len(HEADER_PREFIX):
            out.setdefault(key[len(HEADER_PREFIX):], value)
    return out


def _printable(label: str, text: str) -> None:
    for i, ch in enumerate(text):
        if not " " <= ch <= "~":
            raise MetadataError(f"metadata {label} contains non-printable-ASCII byte 0x{ord(ch):02x} at offset {i}")


def validate(metadata: Mapping[str, str]) -> None:
    """Raise :class:`MetadataError` for a set envd would refuse (HTTP 400)."""
    total = 0
    for key, value in metadata.items():
        if not key:
            raise MetadataError("metadata key must not be empty")
        if len(key) > MAX_KEY_LEN:
            raise MetadataError(f"metadata key {key!r} exceeds {MAX_KEY_LEN} bytes")
        _printable("key", key)
        _printable(f"value for key {key!r}", value)
        total += len(XATTR_PREFIX) + len(key) + len(value)
    if total > MAX_TOTAL_LEN:
        raise MetadataError(f"total metadata size {total} exceeds {MAX_TOTAL_LEN} bytes")


def write(fd: int, metadata: Mapping[str, str]) -> bool:
    """Replace the metadata of the open file ``fd``; False when its filesystem has no xattrs.

    Other ``OSError`` propagate (``ENOSPC``/``EDQUOT`` when the inode has no room)."""
    try:
        existing = os.listxattr(fd)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    for name in existing:
        if name.startswith(XATTR_PREFIX) and name[len(XATTR_PREFIX):] not in metadata:
            try:
                os.removexattr(fd, name)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise
    for key, value in metadata.items():
        try:
            os.setxattr(fd, XATTR_PREFIX + key, value.encode("ascii"))
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                return False
            raise
    return True


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in the name (surrogate escapes)
        return False
    return True


def read(path: str) -> dict[str, str]:
    """The ``user.e2b.*`` attributes of ``path`` (through a final symlink, as envd reads them); entries
    that are not UTF-8 (set in the sandbox with setfattr, say) are skipped; {} when there are none."""
    try:
        names = os.listxattr(path)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if not name.startswith(XATTR_PREFIX) or not name.isprintable() or not _utf8(name):
            continue
        try:
            value = os.getxattr(path, name)
        except OSError:
            continue
        try:
            out[name[len(XATTR_PREFIX):]] = value.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out
