"""Which object store a URL names (``--shared-store``, ``WARREN_SHARED_STORE``).

    file:///mnt/warren-shared     a directory every node mounts at that path (NFS, CephFS, ...)
    /mnt/warren-shared            the same
    s3://bucket                   an S3 bucket (AWS, or any S3-compatible server: MinIO, Ceph RGW)
    s3://bucket/some/prefix       keys under that prefix in the bucket
    s3://bucket/p?endpoint=http://minio:9000&region=eu-west-1

For S3 the endpoint is ``?endpoint=`` or else ``WARREN_S3_ENDPOINT`` (none: AWS), the region
``?region=`` or else ``AWS_DEFAULT_REGION``; credentials come from boto3's standard chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile, an instance or pod role).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ...errors import InvalidRequestError, WarrenError
from .objects import ObjectStore

__all__ = ["open_object_store"]


def open_object_store(url: str, *, environ: Mapping[str, str] | None = None) -> ObjectStore:
    """The :class:`~.objects.ObjectStore` ``url`` names (see the module docstring); anything else is an
    :class:`~warren.errors.InvalidRequestError` that says what is accepted."""
    env = os.environ if environ is None else environ
    if url.startswith("/"):
        return _dir_store(url)
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise InvalidRequestError(f"shared store {url!r}: a file URL is file:///absolute/path")
        return _dir_store(unquote(parts.path))
    if parts.scheme == "s3":
        from .s3store import S3ObjectStore  # boto3 is imported only by nodes that use S3

        if not parts.netloc or parts.fragment or "@" in parts.netloc:
            raise InvalidRequestError(f"shared store {url!r}: expected s3://bucket[/prefix][?endpoint=URL&region=R]")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise InvalidRequestError(f"shared store {url!r}: unknown parameter {sorted(unknown)[0]!r} "
                                      "(known: endpoint, region)")  # fmt: skip
        endpoint = query.get("endpoint", [env.get("WARREN_S3_ENDPOINT", "")])[-1] or None
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise InvalidRequestError(f"shared store {url!r}: the S3 endpoint {endpoint!r} is not an http(s) URL")
        region = query.get("region", [env.get("AWS_DEFAULT_REGION", "")])[-1] or None
        try:
            return S3ObjectStore(parts.netloc, unquote(parts.path).strip("/"), endpoint_url=endpoint, region=region)
        except WarrenError as exc:
            raise InvalidRequestError(f"shared store {url!r}: {exc}") from exc
    raise InvalidRequestError(
        f"shared store {url!r}: expected an absolute path, file:///absolute/path or s3://bucket[/prefix]"
    )


def _dir_store(path: str) -> ObjectStore:
    from .dirstore import DirObjectStore

    if not path.startswith("/") or "\x00" in path or any(p == ".." for p in path.split("/")):
        raise InvalidRequestError(f"shared store path {path!r} must be absolute, without '..'")
    return DirObjectStore(Path(path))
