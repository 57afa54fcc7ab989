"""The registry client against an in-memory Docker-Hub-like registry (``fakehub``): token flow,
basic auth, mirrors, Range resume, error mapping."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import httpx
import pytest

from tests.framework.images import make_layer, member
from tests.unit.images.fakehub import API, AUTH, FakeHub, digest, oci_image
from warren.errors import AuthenticationError, HostError, NotFoundError
from warren.images import Credentials, LayerStore, RegistryConfig, pull
from warren.images.errors import DigestMismatchError, RegistryAuthError, RegistryError
from warren.images.reference import parse_reference
from warren.images.registry import RegistryClient

FAST = RegistryConfig(retries=2)
REF = parse_reference("busybox")


def _hosts(hub: FakeHub) -> list[str]:
    return [r.url.host for r in hub.requests]


@pytest.mark.skipif(os.geteuid() != 0, reason="unpacking layers needs root")
async def test_pull_from_hub_with_anonymous_token(tmp_path: Path) -> None:
    hub = FakeHub()
    layer = make_layer([member("hello", b"world")])
    oci_image(hub, "library/busybox", "latest", [(layer.blob, layer.diff_id)], {"config": {"Cmd": ["/hello"]}})
    image = await pull("busybox", LayerStore(tmp_path), config=FAST, transport=hub.transport())
    assert image.reference == "docker.io/library/busybox:latest"
    assert image.cmd == ("/hello",)
    assert (image.layers[0] / "hello").read_bytes() == b"world"
    assert hub.token_requests == 1  # one token for the whole pull
    assert set(_hosts(hub)) == {API, AUTH}
    assert all(r.headers.get("authorization", "").startswith("Bearer ") for r in hub.requests[2:] if r.url.host == API)


@pytest.mark.skipif(os.geteuid() != 0, reason="unpacking layers needs root")
async def test_repeated_layer_is_listed_once_at_its_topmost_place(tmp_path: Path) -> None:
    hub = FakeHub(auth=None)
    a, b = make_layer([member("a", b"a")]), make_layer([member("b", b"b")])
    oci_image(hub, "library/busybox", "latest", [(x.blob, x.diff_id) for x in (a, b, a)], {})
    store = LayerStore(tmp_path)
    image = await pull("busybox", store, config=FAST, transport=hub.transport())
    assert image.diff_ids == (a.diff_id, b.diff_id, a.diff_id)
    assert image.layers == (store.layer_path(b.diff_id), store.layer_path(a.diff_id))
    assert sum(r.url.path.endswith(a.digest) for r in hub.requests) == 1


async def test_bearer_token_with_credentials() -> None:
    hub = FakeHub(creds=("me", "pw"))
    oci_image(hub, "me/app", "1", [], {})
    ref = parse_reference("me/app:1")
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        with pytest.raises(RegistryAuthError, match="refused anonymous access"):
            await client.get_manifest(ref, "1")
    config = RegistryConfig(credentials={"docker.io": Credentials("me", "pw")})
    async with RegistryClient(config, transport=hub.transport()) as client:
        body, ctype, dig = await client.get_manifest(ref, "1")
    assert json.loads(body)["schemaVersion"] == 2 and dig == digest(body)
    assert ctype == "application/vnd.oci.image.manifest.v1+json"
    bad = RegistryConfig(credentials={"docker.io": Credentials("me", "wrong")})
    async with RegistryClient(bad, transport=hub.transport()) as client:
        with pytest.raises(AuthenticationError, match="'me'"):
            await client.get_manifest(ref, "1")


async def test_basic_auth() -> None:
    hub = FakeHub(auth="basic", creds=("u", "p"))
    oci_image(hub, "library/busybox", "latest", [], {})
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        with pytest.raises(RegistryAuthError, match=r"without credentials \(401\)"):
            await client.get_manifest(REF, "latest")
    config = RegistryConfig(credentials={"docker.io": Credentials("u", "p")})
    async with RegistryClient(config, transport=hub.transport()) as client:
        await client.get_manifest(REF, "latest")
        await client.get_manifest(REF, "latest")
    # after the first challenge, credentials go along proactively
    assert [r.headers.get("authorization") is not None for r in hub.requests[-3:]] == [False, True, True]


async def test_not_found_and_digest_checks() -> None:
    hub = FakeHub(auth=None)
    body = b'{"schemaVersion": 2}'
    hub.add_manifest("library/busybox", "latest", body, "application/vnd.oci.image.manifest.v1+json")
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        with pytest.raises(NotFoundError, match="MANIFEST_UNKNOWN"):
            await client.get_manifest(REF, "nope")
        with pytest.raises(DigestMismatchError):
            # the registry returns a different manifest than the digest names
            hub.manifests[("library/busybox", "sha256:" + "0" * 64)] = (body, "x")
            await client.get_manifest(REF, "sha256:" + "0" * 64)
        blob = b"blob bytes"
        hub.blobs[digest(b"other")] = blob
        with pytest.raises(DigestMismatchError):
            await client.get_blob(REF, digest(b"other"), len(blob), 1000)


async def test_resume_with_range_after_dropped_connection() -> None:
    hub = FakeHub(auth=None)
    data = os.urandom(3 << 20)
    dig = hub.add_blob(data)
    hub.drop_once_after[dig] = 1 << 20
    out = io.BytesIO()
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        await client.download_blob(REF, dig, len(data), out)
    assert out.getvalue() == data
    ranges = [r.headers.get("range") for r in hub.requests]
    assert ranges == [None, f"bytes={1 << 20}-"]


async def test_resume_from_existing_prefix_and_server_ignoring_range() -> None:
    hub = FakeHub(auth=None)
    data = os.urandom(100_000)
    dig = hub.add_blob(data)
    out = io.BytesIO(data[:40_000])
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        await client.download_blob(REF, dig, len(data), out)
    assert out.getvalue() == data and hub.requests[-1].headers["range"] == "bytes=40000-"
    hub.ignore_range = True
    out = io.BytesIO(data[:40_000])
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        await client.download_blob(REF, dig, len(data), out)
    assert out.getvalue() == data  # restarted from zero


async def test_corrupt_prefix_is_redownloaded_once_then_mismatch() -> None:
    hub = FakeHub(auth=None)
    data = os.urandom(10_000)
    dig = hub.add_blob(data)
    out = io.BytesIO(b"\0" * 10_000)  # complete length, wrong content
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        await client.download_blob(REF, dig, len(data), out)
    assert out.getvalue() == data
    hub.blobs[dig] = os.urandom(10_000)  # the registry now serves garbage under that digest
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        with pytest.raises(DigestMismatchError):
            await client.download_blob(REF, dig, len(data), io.BytesIO())
        hub.blobs[dig] = data + b"x"
        with pytest.raises(DigestMismatchError, match="longer"):
            await client.download_blob(REF, dig, len(data), io.BytesIO())


async def test_retries_exhausted_is_registry_error() -> None:
    hub = FakeHub(auth=None)
    data = os.urandom(10_000)
    dig = hub.add_blob(data)
    hub.drop_always_after[dig] = 100
    out = io.BytesIO()
    async with RegistryClient(RegistryConfig(retries=1), transport=hub.transport()) as client:
        with pytest.raises(RegistryError, match="failed"):
            await client.download_blob(REF, dig, len(data), out)
    assert out.getvalue() == data[:200]  # two attempts of 100 bytes: a resumable prefix for next time
    assert [r.headers.get("range") for r in hub.requests] == [None, "bytes=100-"]


async def test_mirrors_first_then_registry() -> None:
    hub = FakeHub(auth=None)
    oci_image(hub, "library/busybox", "latest", [], {})
    config = RegistryConfig(mirrors={"docker.io": ("https://broken.mirror", "https://good.mirror")})
    hub.fail["broken.mirror"] = 503
    async with RegistryClient(config, transport=hub.transport()) as client:
        await client.get_manifest(REF, "latest")
    assert _hosts(hub) == ["broken.mirror", "good.mirror"]
    hub.requests.clear()
    hub.fail["good.mirror"] = 404
    async with RegistryClient(config, transport=hub.transport()) as client:
        await client.get_manifest(REF, "latest")
    assert _hosts(hub) == ["broken.mirror", "good.mirror", API]


@pytest.mark.parametrize(("status", "match"), [(429, "rate-limiting"), (500, "answered 500"), (502, "answered 502")])
async def test_registry_failures_are_host_errors(status: int, match: str) -> None:
    hub = FakeHub(auth=None, fail={API: status})
    async with RegistryClient(FAST, transport=hub.transport()) as client:
        with pytest.raises(RegistryError, match=match) as info:
            await client.get_manifest(REF, "latest")
    assert isinstance(info.value, HostError)


async def test_unreachable_registry() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with RegistryClient(FAST, transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(RegistryError, match=r"cannot reach registry docker\.io"):
            await client.get_manifest(REF, "latest")


async def test_plain_http_token_realm_is_refused() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, headers={"www-authenticate": 'Bearer realm="http://evil.example/token"'})

    config = RegistryConfig(credentials={"docker.io": Credentials("u", "p")})
    async with RegistryClient(config, transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(RegistryError, match="plain-http"):
            await client.get_manifest(REF, "latest")


async def test_blob_download_retries_a_failing_registry() -> None:
    hub = FakeHub(auth=None)
    data = os.urandom(5000)
    dig = hub.add_blob(data)
    calls = 0

    async def flaky(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503) if calls == 1 else await hub.handle(request)

    out = io.BytesIO()
    async with RegistryClient(FAST, transport=httpx.MockTransport(flaky)) as client:
        await client.download_blob(REF, dig, len(data), out)
    assert out.getvalue() == data and calls == 2
