"""An in-memory registry + token service behind ``httpx.MockTransport`` (Docker Hub's protocol).

Unit tests use it for what a local ``docker-registry`` cannot show: the Bearer token flow against
a separate token service (``auth.docker.io``), mirrors, dropped connections and Range handling.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

API = "registry-1.docker.io"
AUTH = "auth.docker.io"
_BLOB = re.compile(r"^/v2/(?P<repo>.+)/blobs/(?P<digest>sha256:[0-9a-f]{64})$")
_MANIFEST = re.compile(r"^/v2/(?P<repo>.+)/manifests/(?P<ref>[^/]+)$")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class FakeHub:
    """``auth``: "bearer" (token service), "basic", or None. ``creds`` are required when set."""

    auth: str | None = "bearer"
    creds: tuple[str, str] | None = None
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], tuple[bytes, str]] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)
    drop_once_after: dict[str, int] = field(default_factory=dict)
    """Blob digest -> drop the connection after this many bytes, on the first GET only."""
    drop_always_after: dict[str, int] = field(default_factory=dict)
    """Blob digest -> drop every GET of it after this many bytes."""
    ignore_range: bool = False
    fail: dict[str, int] = field(default_factory=dict)
    """Host -> status to answer every request with (e.g. a broken mirror)."""
    token_requests: int = 0

    def add_blob(self, data: bytes) -> str:
        self.blobs[digest(data)] = data
        return digest(data)

    def add_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        self.manifests[(repo, ref)] = (body, media_type)
        self.manifests[(repo, digest(body))] = (body, media_type)
        return digest(body)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def _basic_ok(self, request: httpx.Request) -> bool:
        if self.creds is None:
            return True
        expected = "Basic " + base64.b64encode(":".join(self.creds).encode()).decode()
        return bool(request.headers.get("authorization") == expected)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        host = request.url.host if request.url.port is None else f"{request.url.host}:{request.url.port}"
        if host in self.fail:
            return httpx.Response(self.fail[host])
        if host == AUTH:
            return self._token(request)
        path = request.url.path
        repo = m["repo"] if (m := _BLOB.match(path) or _MANIFEST.match(path)) else ""
        scope = f"repository:{repo}:pull"
        if self.auth == "bearer" and request.headers.get("authorization") != f"Bearer tok:{scope}":
            challenge = f'Bearer realm="https://{AUTH}/token",service="registry.docker.io",scope="{scope}"'
            return httpx.Response(
                401, headers={"www-authenticate": challenge}, json={"errors": [{"code": "UNAUTHORIZED"}]}
            )
        if self.auth == "basic" and not (self.creds and self._basic_ok(request)):
            return httpx.Response(401, headers={"www-authenticate": 'Basic realm="fake"'})
        if (mm := _MANIFEST.match(path)) and (mm["repo"], mm["ref"]) in self.manifests:
            body, media_type = self.manifests[(mm["repo"], mm["ref"])]
            return httpx.Response(200, content=body, headers={"content-type": media_type})
        if (mb := _BLOB.match(path)) and mb["digest"] in self.blobs:
            return self._blob(request, mb["digest"])
        code = "MANIFEST_UNKNOWN" if _MANIFEST.match(path) else "BLOB_UNKNOWN"
        return httpx.Response(404, json={"errors": [{"code": code, "message": "unknown"}]})

    def _token(self, request: httpx.Request) -> httpx.Response:
        self.token_requests += 1
        if self.creds is not None and not self._basic_ok(request):
            return httpx.Response(401, json={"details": "incorrect username or password"})
        scope = request.url.params.get("scope")
        assert request.url.params.get("service") == "registry.docker.io"
        return httpx.Response(200, json={"token": f"tok:{scope}", "expires_in": 300})

    def _blob(self, request: httpx.Request, dig: str) -> httpx.Response:
        data = self.blobs[dig]
        start = 0
        if (rng := request.headers.get("range")) and not self.ignore_range:
            start = int(rng.removeprefix("bytes=").rstrip("-"))
        drop = self.drop_once_after.pop(dig, self.drop_always_after.get(dig))
        body = data[start:]

        async def stream() -> AsyncIterator[bytes]:
            if drop is None:
                yield body
                return
            yield body[:drop]
            raise httpx.ReadError("connection dropped")

        headers = {"content-length": str(len(body))}
        if start:
            headers["content-range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        return httpx.Response(206 if start else 200, headers=headers, content=stream())


def oci_image(hub: FakeHub, repo: str, tag: str, layers: list[tuple[bytes, str]], config: dict[str, object]) -> str:
    """Store an OCI image (layers as ``(gzip blob, diff_id)``) and return its manifest digest."""
    config = {**config, "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]}}
    cfg = json.dumps(config).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": hub.add_blob(cfg),
            "size": len(cfg),
        },
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": hub.add_blob(b), "size": len(b)}
            for b, _ in layers
        ],
    }
    return hub.add_manifest(repo, tag, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
