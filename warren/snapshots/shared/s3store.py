"""Objects in an S3 bucket (AWS S3 or any S3-compatible server: MinIO, Ceph RGW, ...), through boto3.

    S3ObjectStore("warren-snapshots", "prod/eu", endpoint_url="http://minio:9000")
    key "sandboxes/x/manifest.json"  ->  s3://warren-snapshots/prod/eu/sandboxes/x/manifest.json

Credentials come from boto3's standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a
profile, an instance or pod role); warren never sees them. boto3 blocks, so every call runs in a
thread (:func:`~.objects.run_in_thread`). Files go through boto3's transfer manager: multipart uploads
past ``multipart_threshold`` (S3 needs them past 5 GiB; parts upload in parallel) and ranged parallel
downloads; a cancelled caller cancels the transfer (a multipart upload is aborted, a partial download
removed) and waits for it to stop. A put is atomic in S3 (a reader sees the old object or the new one). Listings follow
continuation tokens page by page, up to :data:`~.objects.LIST_LIMIT` keys.

Every error boto3 or botocore raises is mapped in :func:`_mapped`, and nowhere else: a missing key is
``NotFoundError``, a server that cannot be reached, times out or says it is overloaded is
``UnavailableError``, anything else (no credentials, access denied, no such bucket) ``HostError``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

# No stubs for boto3/botocore in the lock (types-boto3 is not a dependency): their objects are Any here.
import boto3  # type: ignore[import-untyped]
import boto3.exceptions  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]
from boto3.s3.transfer import TransferConfig, create_transfer_manager  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]

from ...errors import HostError, NotFoundError, UnavailableError, WarrenError
from .objects import LIST_LIMIT, ObjectTooLargeError, check_key, check_prefix, run_in_thread

__all__ = ["S3ObjectStore"]

T = TypeVar("T")

DEFAULT_MULTIPART_THRESHOLD = 64 << 20
"""Files larger than this are uploaded in parts of this size (S3's minimum part is 5 MiB)."""
CONNECT_TIMEOUT_S = 5.0
"""A server that has not accepted the connection by then is unreachable (then retried: see ``_ATTEMPTS``)."""
READ_TIMEOUT_S = 60.0
_STOP_POLL_S = 0.1
"""How often a transfer's thread looks whether its caller was cancelled (then it cancels the transfer)."""
_ATTEMPTS = 3
"""botocore's "standard" retry mode: 3 attempts with jittered backoff for throttling and 5xx/connection errors."""
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_UNAVAILABLE = {"SlowDown", "ServiceUnavailable", "RequestTimeout", "InternalError", "Throttling", "503", "500"}


class S3ObjectStore:
    """An :class:`~.objects.ObjectStore` on ``bucket``, every key under ``prefix`` (see the module docstring)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        list_page_size: int = 1000,
    ) -> None:
        if not bucket or "/" in bucket:
            raise HostError(f"S3 store: {bucket!r} is not a bucket name")
        prefix = prefix.strip("/")
        self.bucket = bucket
        self.prefix = check_key(prefix) + "/" if prefix else ""
        self.endpoint_url = endpoint_url
        self._page_size = list_page_size
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": _ATTEMPTS, "mode": "standard"},
            # An endpoint of our own (MinIO, a test server) rarely has wildcard DNS for bucket names.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
        )
        region = region or os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        with _mapped("connect to", bucket, bucket):
            self._client: Any = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold, multipart_chunksize=multipart_threshold,
            preferred_transfer_client="classic",
        )  # fmt: skip

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix}{where})"

    # the ObjectStore protocol

    async def put_file(self, key: str, src: Path) -> None:
        name = self._name(key)
        await self._run("put", key, lambda stop: self._transfer_file(stop, "upload", os.fspath(src), name))

    async def put_bytes(self, key: str, data: bytes) -> None:
        name = self._name(key)
        await self._run("put", key, lambda stop: self._client.put_object(Bucket=self.bucket, Key=name, Body=data))

    async def get_file(self, key: str, dest: Path, *, max_bytes: int) -> None:
        name = self._name(key)

        def get(stop: threading.Event) -> None:
            size = int(self._client.head_object(Bucket=self.bucket, Key=name)["ContentLength"])
            if size > max_bytes:
                raise ObjectTooLargeError(f"S3 store: {key!r} has {size} bytes, more than {max_bytes}")
            try:
                self._transfer_file(stop, "download", os.fspath(dest), name)
                # Replaced by a larger object between the head and the download (warren never does that:
                # its data objects have unique names): refused, if only after the fact.
                if (got := os.stat(dest).st_size) > max_bytes:
                    raise ObjectTooLargeError(f"S3 store: {key!r} has {got} bytes, more than {max_bytes}")
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(dest)
                raise

        await self._run("get", key, get)

    async def get_bytes(self, key: str, *, max_bytes: int) -> bytes | None:
        name = self._name(key)

        def get(stop: threading.Event) -> bytes | None:
            try:
                answer = self._client.get_object(Bucket=self.bucket, Key=name)
            except botocore.exceptions.ClientError as exc:
                if _code(exc) in _NOT_FOUND:
                    return None
                raise
            body = answer["Body"]
            try:
                if int(answer.get("ContentLength", 0)) > max_bytes:
                    size = answer["ContentLength"]
                    raise ObjectTooLargeError(f"S3 store: {key!r} has {size} bytes, more than {max_bytes}")
                data = bytes(body.read(max_bytes + 1))
            finally:
                body.close()
            if len(data) > max_bytes:
                raise ObjectTooLargeError(f"S3 store: {key!r} has more than {max_bytes} bytes")
            return data

        return await self._run("get", key, get)

    async def delete(self, key: str) -> None:
        name = self._name(key)
        await self._run("delete", key, lambda stop: self._client.delete_object(Bucket=self.bucket, Key=name))

    async def list(self, prefix: str) -> builtins.list[str]:
        check_prefix(prefix)

        def list_keys(stop: threading.Event) -> builtins.list[str]:
            out: builtins.list[str] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix, PaginationConfig={"PageSize": self._page_size}
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    key = str(item["Key"])[len(self.prefix) :]
                    if _valid(key):
                        out.append(key)
                if len(out) > LIST_LIMIT:
                    raise HostError(f"S3 store: more than {LIST_LIMIT} keys under {prefix!r}")
            return out

        return await self._run("list", prefix, list_keys)

    # helpers

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    async def _run(self, op: str, key: str, fn: Callable[[threading.Event], T]) -> T:
        with _mapped(op, key, self.bucket):
            return await run_in_thread(fn)

    def _transfer_file(self, stop: threading.Event, direction: str, filename: str, name: str) -> None:
        """An upload or download through boto3's transfer manager (multipart, parallel parts), cancelled
        when ``stop`` is set: it aborts a multipart upload and removes a partial download itself."""
        manager = create_transfer_manager(self._client, self._transfer)
        try:
            if direction == "upload":
                future = manager.upload(filename, self.bucket, name)
            else:
                future = manager.download(self.bucket, name, filename)
            while not future.done():
                if stop.wait(_STOP_POLL_S):
                    future.cancel()
                    break
            future.result()
        finally:
            manager.shutdown()


@contextlib.contextmanager
def _mapped(op: str, key: str, bucket: str) -> Iterator[None]:
    """The one place a boto3/botocore error becomes a warren error (see the module docstring)."""
    what = f"S3 store: {op} {key!r} in bucket {bucket!r}"
    try:
        yield
    except WarrenError:
        raise
    except boto3.exceptions.S3UploadFailedError as exc:  # the transfer manager wraps the ClientError
        cause = exc.__context__
        if isinstance(cause, botocore.exceptions.ClientError):
            raise _from_client_error(what, cause) from exc
        raise HostError(f"{what}: {exc}") from exc
    except botocore.exceptions.ClientError as exc:
        raise _from_client_error(what, exc) from exc
    except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError,
            boto3.exceptions.RetriesExceededError) as exc:  # fmt: skip
        raise UnavailableError(f"{what}: the S3 endpoint cannot be reached: {exc}") from exc
    except botocore.exceptions.NoCredentialsError as exc:
        hint = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a role"
        raise HostError(f"{what}: no S3 credentials ({hint})") from exc
    except (botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error) as exc:
        raise HostError(f"{what}: {exc}") from exc


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _from_client_error(what: str, exc: botocore.exceptions.ClientError) -> WarrenError:
    code = _code(exc)
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code == "NoSuchBucket":
        return HostError(f"{what}: the bucket does not exist")
    if code in _NOT_FOUND:
        return NotFoundError(f"{what}: no such object")
    if code in _UNAVAILABLE or status >= 500:
        return UnavailableError(f"{what}: the S3 endpoint is unavailable ({code or status})")
    return HostError(f"{what}: {code or status}: {exc}")


def _valid(key: str) -> bool:
    try:
        check_key(key)
    except WarrenError:
        return False
    return True
