"""A content-addressed cache of runtime assets (runsc, kernels, ...), fetched on demand.

Layout: ``root/sha256/<hex>``, read-only files whose name is the sha256 of their bytes. A download
streams into a temp file in that same directory while hashing and counting; only a file whose
digest matches and whose size is within ``max_bytes`` is renamed to its final name (file fsynced
first, the directory after), so a present final file *is* a verified file and a hit is just an
existence check. Anything else removes the temp file before the error propagates.

Schemes: ``file://`` and ``http(s)://`` are built in; anything else (``s3://``, ``gs://``) needs a
:class:`SchemeFetcher` passed in ``fetchers`` (this module has no object-store SDK dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httpx

from warren.errors import HostError, WarrenError
from warren.trees import fsync_dir

from .records import Asset, is_sha256_hex

log = logging.getLogger("warren.runtime.assets")

_CHUNK = 1 << 20
_TMP_SUFFIX = ".part"
_HTTP_TIMEOUT = httpx.Timeout(30.0, read=120.0)


class AssetError(HostError):
    """An asset could not be fetched into the cache."""


class UnsupportedScheme(AssetError):
    """The asset URL's scheme has no fetcher on this node."""


class AssetIntegrityError(AssetError):
    """The fetched bytes do not have the sha256 the asset names."""


class AssetTooLarge(AssetError):
    """The asset is larger than the cache's per-asset cap."""


class SchemeFetcher(Protocol):
    """Streams the bytes behind a URL of one scheme (e.g. an S3 client wrapper for ``s3://``).

    ``stream`` is an async generator function: the cache iterates it and always closes it (also on
    error or cancellation). Failures should raise :class:`~warren.errors.HostError` or ``OSError``.
    """

    def stream(self, url: str) -> AsyncGenerator[bytes, None]: ...


class _OwnerGone(Exception):
    """The fetch that others were waiting on was cancelled; one of the waiters takes over."""


class AssetCache:
    """Content-addressed asset cache under ``root``; ``max_bytes`` caps each asset's size.

    ``http_client`` (optional, owned by the caller) is used for ``http(s)://``; without one each
    download opens its own client. ``fetchers`` maps extra URL schemes to their fetcher.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        fetchers: Mapping[str, SchemeFetcher] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = root
        self.max_bytes = max_bytes
        self._dir = root / "sha256"
        self._fetchers = dict(fetchers or {})
        self._http = http_client
        self._inflight: dict[str, asyncio.Future[Path]] = {}
        self._swept = False

    def path_for(self, sha256: str) -> Path:
        """Where the asset with this digest lives once cached (it may not be there)."""
        if not is_sha256_hex(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self._dir / sha256

    def contains(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    async def fetch(self, asset: Asset) -> Path:
        """The cached file for ``asset``, downloading and verifying it first if it is not cached.

        Concurrent fetches of one digest do the work once; the others wait for it (if the one doing
        it is cancelled, a waiter takes over). Raises :class:`AssetError` subclasses.
        """
        final = self.path_for(asset.sha256)
        while True:
            if final.is_file():
                return final
            pending = self._inflight.get(asset.sha256)
            if pending is None:
                break
            try:
                return await asyncio.shield(pending)
            except _OwnerGone:
                continue
        future: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
        self._inflight[asset.sha256] = future
        try:
            path = await self._download(asset, final)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else _OwnerGone())
            future.exception()  # retrieved: waiters are optional
            raise
        else:
            future.set_result(path)
            return path
        finally:
            del self._inflight[asset.sha256]

    async def _download(self, asset: Asset, final: Path) -> Path:
        stream = self._open(asset.url)  # refuses an unknown scheme before any file is made
        try:
            self._prepare_dir()
            fd, tmp_name = tempfile.mkstemp(dir=self._dir, prefix=f".{asset.sha256}.", suffix=_TMP_SUFFIX)
        except OSError as exc:
            await stream.aclose()
            raise AssetError(f"asset cache {self._dir} is not writable: {exc}") from exc
        tmp = Path(tmp_name)
        try:
            async with contextlib.aclosing(stream):
                with os.fdopen(fd, "wb") as out:
                    digest, size = hashlib.sha256(), 0
                    async for chunk in stream:
                        size += len(chunk)
                        if size > self.max_bytes:
                            raise AssetTooLarge(
                                f"asset {asset.url} is larger than the {self.max_bytes}-byte cap; not cached"
                            )
                        digest.update(chunk)
                        out.write(chunk)
                    if digest.hexdigest() != asset.sha256:
                        raise AssetIntegrityError(
                            f"asset {asset.url} has sha256 {digest.hexdigest()}, expected {asset.sha256}; not cached"
                        )
                    out.flush()
                    await asyncio.to_thread(os.fsync, out.fileno())
            os.chmod(tmp, 0o555)
            os.replace(tmp, final)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise AssetError(f"fetching asset {asset.url} into {self._dir}: {exc}") from exc
            if isinstance(exc, Exception) and not isinstance(exc, WarrenError):
                raise AssetError(f"fetching asset {asset.url}: {type(exc).__name__}: {exc}") from exc
            raise
        try:
            await asyncio.to_thread(fsync_dir, self._dir)
        except OSError as exc:
            raise AssetError(f"cannot sync asset cache dir {self._dir}: {exc}") from exc
        log.info("cached asset %s (%d bytes) from %s", asset.sha256, size, asset.url)
        return final

    def _prepare_dir(self) -> None:
        """Create the cache dir; the first time, remove temp files a crash left behind."""
        self._dir.mkdir(parents=True, exist_ok=True)
        if self._swept:
            return
        self._swept = True
        for leftover in self._dir.glob(f".*{_TMP_SUFFIX}"):
            with contextlib.suppress(OSError):
                leftover.unlink()

    def _open(self, url: str) -> AsyncGenerator[bytes, None]:
        scheme = urlsplit(url).scheme.lower()
        fetcher = self._fetchers.get(scheme)
        if fetcher is not None:
            return fetcher.stream(url)
        if scheme == "file":
            return self._file_chunks(url)
        if scheme in ("http", "https"):
            return self._http_chunks(url)
        known = sorted({"file", "http", "https", *self._fetchers})
        raise UnsupportedScheme(
            f"asset {url}: no fetcher for scheme {scheme!r} on this node (configured: {', '.join(known)})"
        )

    async def _file_chunks(self, url: str) -> AsyncGenerator[bytes, None]:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise AssetError(f"asset {url}: file:// URLs must name a local path")
        src = await asyncio.to_thread(open, unquote(parts.path), "rb")
        try:
            while chunk := await asyncio.to_thread(src.read, _CHUNK):
                yield chunk
        finally:
            src.close()

    async def _http_chunks(self, url: str) -> AsyncGenerator[bytes, None]:
        async with contextlib.AsyncExitStack() as stack:
            client = self._http
            if client is None:
                client = await stack.enter_async_context(httpx.AsyncClient(timeout=_HTTP_TIMEOUT))
            response = await stack.enter_async_context(client.stream("GET", url, follow_redirects=True))
            if response.status_code != 200:
                raise AssetError(f"asset {url}: HTTP {response.status_code}")
            length = response.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.max_bytes:
                raise AssetTooLarge(f"asset {url} is {length} bytes, over the {self.max_bytes}-byte cap; not cached")
            async for chunk in response.aiter_bytes(_CHUNK):
                yield chunk


__all__ = [
    "AssetCache",
    "AssetError",
    "AssetIntegrityError",
    "AssetTooLarge",
    "SchemeFetcher",
    "UnsupportedScheme",
]
