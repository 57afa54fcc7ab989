"""An async client for the registry HTTP API v2: manifests and blobs, with auth, mirrors and resume.

Every request goes to the registry's endpoints in order (configured mirrors first, then the registry
itself); a mirror that fails or lacks the content is skipped. Blob downloads are hashed while they
stream and resume with ``Range: bytes=<have>-`` after a dropped connection when the server allows.

Error mapping: unknown repository/tag -> ``NotFoundError``; 401/403 after authenticating ->
``RegistryAuthError``; unreachable, 5xx, 429, garbage -> ``RegistryError`` (a ``HostError``);
content not matching its digest -> ``DigestMismatchError``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import BinaryIO

import httpx

from warren.errors import NotFoundError, WarrenError
from warren.images.auth import Authenticator
from warren.images.config import Endpoint, RegistryConfig
from warren.images.errors import DigestMismatchError, RegistryError
from warren.images.reference import Reference

MANIFEST_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
MAX_MANIFEST_BYTES = 4 << 20
CHUNK = 1 << 20
_RETRY_DELAY_S = 0.5


class _Skip(Exception):
    """This endpoint cannot serve the request; try the next one (carries the error for the last)."""

    def __init__(self, error: WarrenError) -> None:
        super().__init__(str(error))
        self.error = error


class RegistryClient:
    """Talks to one or more registries for the duration of a pull. Use as ``async with``."""

    def __init__(self, config: RegistryConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._config = config
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self._http = httpx.AsyncClient(
            timeout=timeout,
            follow_redirects=True,
            transport=transport,
            headers={"User-Agent": config.user_agent},
        )
        self._auth = Authenticator(self._http, config)

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def get_manifest(self, ref: Reference, manifest_ref: str) -> tuple[bytes, str, str]:
        """``(body, content type, digest)`` of ``ref``'s manifest ``manifest_ref`` (a tag or digest).

        The digest is computed from the body; if ``manifest_ref`` is a digest it must match.
        """
        path = f"/v2/{ref.repository}/manifests/{manifest_ref}"
        what = f"{ref.name}:{manifest_ref}" if not manifest_ref.startswith("sha256:") else f"{ref.name}@{manifest_ref}"
        for endpoint, last in _with_last(self._config.endpoints(ref.registry)):
            try:
                async with self._stream(endpoint, ref, "GET", path, {"Accept": MANIFEST_ACCEPT}, what) as resp:
                    body = await _read_capped(resp, MAX_MANIFEST_BYTES, what)
                    ctype = resp.headers.get("content-type", "").split(";")[0].strip()
                break
            except _Skip as skip:
                if last:
                    raise skip.error from None
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if manifest_ref.startswith("sha256:") and digest != manifest_ref:
            raise DigestMismatchError(f"manifest {what} hashes to {digest}")
        return body, ctype, digest

    async def get_blob(self, ref: Reference, digest: str, size: int, limit: int) -> bytes:
        """A small blob (an image config) read into memory and verified."""
        if size > limit:
            raise RegistryError(f"blob {digest} of {ref.name} is {size} bytes, more than the {limit} allowed")
        path = f"/v2/{ref.repository}/blobs/{digest}"
        for endpoint, last in _with_last(self._config.endpoints(ref.registry)):
            try:
                async with self._stream(endpoint, ref, "GET", path, {}, f"blob {digest}") as resp:
                    body = await _read_capped(resp, size, f"blob {digest}")
                break
            except _Skip as skip:
                if last:
                    raise skip.error from None
        _verify(body, digest, size, ref)
        return body

    async def download_blob(
        self,
        ref: Reference,
        digest: str,
        size: int,
        out: BinaryIO,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        """Append blob ``digest`` to ``out`` until it holds exactly the blob, verified.

        ``out`` (opened ``r+b``) may already hold a prefix from an interrupted download: it is
        hashed and the rest requested with ``Range``; a server that ignores Range restarts the file.
        Dropped connections are retried ``config.retries`` times, each resuming where it stopped.
        Raises ``DigestMismatchError`` (the caller must discard ``out``), ``RegistryError`` after the
        last retry (``out`` holds a valid prefix worth keeping), ``NotFoundError``/``RegistryAuthError``.
        """
        endpoints = self._config.endpoints(ref.registry)
        path = f"/v2/{ref.repository}/blobs/{digest}"
        failures, index = 0, 0
        hasher, have = await asyncio.to_thread(_hash_prefix, out, size)
        untrusted_prefix = have > 0  # bytes from an earlier run: a mismatch may be theirs
        while True:
            if have == size:
                if "sha256:" + hasher.hexdigest() == digest:
                    return
                if not untrusted_prefix:
                    raise DigestMismatchError(f"blob {digest} of {ref.name} hashes to sha256:{hasher.hexdigest()}")
                untrusted_prefix = False
                _truncate(out, 0)
                hasher, have = hashlib.sha256(), 0
            endpoint = endpoints[index]
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                async with self._stream(endpoint, ref, "GET", path, headers, f"blob {digest}") as resp:
                    if have and not _range_honoured(resp, have):
                        _truncate(out, 0)
                        hasher, have, untrusted_prefix = hashlib.sha256(), 0, False
                    out.seek(have)
                    async for chunk in resp.aiter_bytes():
                        have += len(chunk)
                        if have > size:
                            raise DigestMismatchError(f"blob {digest} of {ref.name} is longer than {size} bytes")
                        out.write(chunk)
                        hasher.update(chunk)
                        if on_bytes is not None:
                            on_bytes(have)
                    out.flush()
            except _Skip as skip:
                if index < len(endpoints) - 1:
                    index += 1  # next mirror, or the registry itself
                    continue
                if not isinstance(skip.error, RegistryError) or failures >= self._config.retries:
                    raise skip.error from None
                failures += 1  # unreachable or 5xx: worth another try
                await asyncio.sleep(_RETRY_DELAY_S * failures)
                continue
            except (httpx.TransportError, RegistryError) as exc:
                out.flush()
                failures += 1
                if failures > self._config.retries:
                    raise RegistryError(f"downloading blob {digest} of {ref.name} failed: {exc}") from exc
                await asyncio.sleep(_RETRY_DELAY_S * failures)
                continue
            if have < size:
                failures += 1
                if failures > self._config.retries:
                    raise RegistryError(f"blob {digest} of {ref.name}: stream ended at {have} of {size} bytes")
                continue

    @asynccontextmanager
    async def _stream(
        self, endpoint: Endpoint, ref: Reference, method: str, path: str, headers: dict[str, str], what: str
    ) -> AsyncIterator[httpx.Response]:
        """An open, successful (2xx) response from ``endpoint``, authenticating as needed.

        Failures a mirror may legitimately have (unreachable, 404, 5xx, auth) raise ``_Skip``
        wrapping the final error; on the registry itself they raise the same ``_Skip`` and the
        caller re-raises its error.
        """
        scope = f"repository:{ref.repository}:pull"
        url = endpoint.base_url + path
        used = self._auth.header(endpoint.host, scope)
        for attempt in range(2):
            req_headers = dict(headers)
            if used is not None:
                req_headers["Authorization"] = used
            try:
                request = self._http.build_request(method, url, headers=req_headers)
                resp = await self._http.send(request, stream=True)
            except httpx.TransportError as exc:
                raise _Skip(RegistryError(f"cannot reach registry {endpoint.host} ({url}): {exc!r}")) from exc
            try:
                if resp.status_code == 401 and attempt == 0:
                    await resp.aread()
                    used = await self._auth.authenticate(endpoint.host, scope, resp, used)
                    continue
                if resp.status_code >= 300:
                    await resp.aread()
                    raise _Skip(self._error(endpoint, resp, what, scope))
                yield resp
                return
            finally:
                await resp.aclose()
        raise AssertionError("unreachable")

    def _error(self, endpoint: Endpoint, resp: httpx.Response, what: str, scope: str) -> WarrenError:
        detail = _registry_detail(resp)
        status = resp.status_code
        where = f"registry {endpoint.host}"
        if status in (401, 403):
            return self._auth.refused(endpoint.host, scope, status, detail)
        if status == 404:
            return NotFoundError(f"{what} not found on {where}" + (f": {detail}" if detail else ""))
        if status == 429:
            return RegistryError(
                f"{where} is rate-limiting pulls (429); try again later or configure credentials/mirror"
            )
        return RegistryError(f"{where} answered {status} for {what}" + (f": {detail}" if detail else ""))


def _with_last(items: list[Endpoint]) -> list[tuple[Endpoint, bool]]:
    return [(item, i == len(items) - 1) for i, item in enumerate(items)]


async def _read_capped(resp: httpx.Response, limit: int, what: str) -> bytes:
    parts: list[bytes] = []
    total = 0
    try:
        async for chunk in resp.aiter_bytes():
            total += len(chunk)
            if total > limit:
                raise RegistryError(f"{what} is larger than {limit} bytes")
            parts.append(chunk)
    except httpx.TransportError as exc:
        raise RegistryError(f"reading {what} failed: {exc!r}") from exc
    return b"".join(parts)


def _verify(body: bytes, digest: str, size: int, ref: Reference) -> None:
    actual = "sha256:" + hashlib.sha256(body).hexdigest()
    if actual != digest or len(body) != size:
        raise DigestMismatchError(
            f"blob {digest} of {ref.name} hashes to {actual} ({len(body)} bytes, expected {size})"
        )


def _range_honoured(resp: httpx.Response, have: int) -> bool:
    if resp.status_code != 206:
        return False
    content_range: str = resp.headers.get("content-range", "")
    return content_range.startswith(f"bytes {have}-")


def _hash_prefix(out: BinaryIO, size: int) -> tuple[hashlib._Hash, int]:
    """Hash what ``out`` already holds (dropping it if longer than the blob can be)."""
    out.seek(0, os.SEEK_END)
    if out.tell() > size:
        _truncate(out, 0)
    out.seek(0)
    hasher = hashlib.sha256()
    have = 0
    while chunk := out.read(CHUNK):
        hasher.update(chunk)
        have += len(chunk)
    return hasher, have


def _truncate(out: BinaryIO, length: int) -> None:
    out.seek(length)
    out.truncate(length)
    out.flush()


def _registry_detail(resp: httpx.Response) -> str:
    """The ``errors`` of a registry error body as ``CODE: message`` text, or ''."""
    try:
        doc = resp.json()
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if isinstance(errors, list):
            return "; ".join(f"{e.get('code', '?')}: {e.get('message', '')}" for e in errors if isinstance(e, dict))
    except ValueError:
        pass
    return ""


__all__ = ["MANIFEST_ACCEPT", "RegistryClient"]
