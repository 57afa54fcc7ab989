"""AssetCache against a real loopback HTTP server, file:// URLs and an injected s3 fetcher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from warren.errors import HostError
from warren.runtime.assets import AssetCache, AssetError, AssetIntegrityError, AssetTooLarge, UnsupportedScheme
from warren.runtime.records import Asset, RuntimeRecord
from warren.runtime.staging import RuntimeStager

from .helpers import AssetServer, leftovers, sha

BODY = b"#!/bin/sh\necho runsc\n" * 1000


def _cache(tmp_path: Path, **kw: object) -> AssetCache:
    return AssetCache(tmp_path / "cache", max_bytes=kw.pop("max_bytes", 1 << 20), **kw)  # type: ignore[arg-type]


async def test_http_fetch_lands_verified_under_its_digest(tmp_path: Path, server: AssetServer) -> None:
    server.bodies["/runsc"] = BODY
    cache = _cache(tmp_path)
    path = await cache.fetch(Asset(server.url("/runsc"), sha(BODY)))
    assert path == tmp_path / "cache" / "sha256" / sha(BODY)
    assert path.read_bytes() == BODY
    assert path.stat().st_mode & 0o222 == 0  # read-only: content-addressed
    assert leftovers(tmp_path / "cache") == [f"sha256/{sha(BODY)}"]
    assert cache.contains(sha(BODY))


async def test_a_present_file_is_returned_without_a_fetch(tmp_path: Path, server: AssetServer) -> None:
    server.bodies["/runsc"] = BODY
    cache = _cache(tmp_path)
    asset = Asset(server.url("/runsc"), sha(BODY))
    first = await cache.fetch(asset)
    assert await _cache(tmp_path).fetch(asset) == first  # a new cache over the same root
    assert server.gets["/runsc"] == 1


async def test_a_wrong_sha256_leaves_nothing_in_the_cache(tmp_path: Path, server: AssetServer) -> None:
    server.bodies["/runsc"] = BODY
    cache = _cache(tmp_path)
    wrong = sha(b"something else")
    with pytest.raises(AssetIntegrityError, match=f"expected {wrong}") as info:
        await cache.fetch(Asset(server.url("/runsc"), wrong))
    assert isinstance(info.value, HostError)
    assert leftovers(tmp_path / "cache") == []
    assert not cache.contains(wrong)


async def test_concurrent_fetches_of_one_hash_download_once(tmp_path: Path, server: AssetServer) -> None:
    server.bodies["/runsc"] = BODY
    server.gate.clear()  # hold the response until both fetches are waiting
    cache = _cache(tmp_path)
    asset = Asset(server.url("/runsc"), sha(BODY))
    async with asyncio.TaskGroup() as group:
        first = group.create_task(cache.fetch(asset))
        second = group.create_task(cache.fetch(Asset(server.url("/mirror/runsc"), sha(BODY))))
        assert await asyncio.to_thread(server.got_request.wait, 5)
        await asyncio.sleep(0)
        assert not first.done() and not second.done()
        server.gate.set()
    assert first.result() == second.result()
    assert server.gets == {"/runsc": 1}
    assert leftovers(tmp_path / "cache") == [f"sha256/{sha(BODY)}"]


async def test_a_waiter_takes_over_when_the_fetch_it_waits_on_is_cancelled(tmp_path: Path, server: AssetServer) -> None:
    server.bodies["/runsc"] = BODY
    server.gate.clear()
    cache = _cache(tmp_path)
    asset = Asset(server.url("/runsc"), sha(BODY))
    owner = asyncio.create_task(cache.fetch(asset))
    assert await asyncio.to_thread(server.got_request.wait, 5)
    waiter = asyncio.create_task(cache.fetch(asset))
    await asyncio.sleep(0)
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    server.gate.set()
    assert (await waiter).read_bytes() == BODY
    assert server.gets["/runsc"] == 2
    assert leftovers(tmp_path / "cache") == [f"sha256/{sha(BODY)}"]


async def test_the_size_cap_over_http_with_and_without_content_length(tmp_path: Path, server: AssetServer) -> None:
    server.bodies["/big"] = BODY
    cache = _cache(tmp_path, max_bytes=len(BODY) - 1)
    with pytest.raises(AssetTooLarge, match="cap"):
        await cache.fetch(Asset(server.url("/big"), sha(BODY)))
    server.send_length = False  # the cap is enforced while streaming too
    with pytest.raises(AssetTooLarge, match="cap"):
        await cache.fetch(Asset(server.url("/big"), sha(BODY)))
    assert leftovers(tmp_path / "cache") == []
    assert (await _cache(tmp_path, max_bytes=len(BODY)).fetch(Asset(server.url("/big"), sha(BODY)))).is_file()


async def test_http_errors_are_host_errors(tmp_path: Path, server: AssetServer) -> None:
    cache = _cache(tmp_path)
    with pytest.raises(AssetError, match="HTTP 404"):
        await cache.fetch(Asset(server.url("/missing"), sha(BODY)))
    with pytest.raises(AssetError, match="ConnectError"):
        await cache.fetch(Asset("http://127.0.0.1:9/none", sha(BODY)))
    assert leftovers(tmp_path / "cache") == []


async def test_file_urls_and_the_size_cap(tmp_path: Path) -> None:
    src = tmp_path / "src dir" / "runsc"
    src.parent.mkdir()
    src.write_bytes(BODY)
    url = "file://" + str(src).replace(" ", "%20")
    path = await _cache(tmp_path).fetch(Asset(url, sha(BODY)))
    assert path.read_bytes() == BODY
    with pytest.raises(AssetTooLarge):
        await _cache(tmp_path / "small", max_bytes=100).fetch(Asset(url, sha(BODY)))
    assert leftovers(tmp_path / "small") == []
    with pytest.raises(AssetError, match="No such file"):
        await _cache(tmp_path).fetch(Asset("file:///nonexistent/runsc", sha(b"x")))


async def test_s3_needs_an_injected_fetcher(tmp_path: Path) -> None:
    asset = Asset("s3://bucket/runsc", sha(BODY))
    with pytest.raises(UnsupportedScheme, match="no fetcher for scheme 's3'") as info:
        await _cache(tmp_path).fetch(asset)
    assert isinstance(info.value, HostError)
    assert leftovers(tmp_path) == []

    class FakeS3:
        def __init__(self) -> None:
            self.urls: list[str] = []

        async def stream(self, url: str) -> AsyncGenerator[bytes, None]:
            self.urls.append(url)
            for i in range(0, len(BODY), 4096):
                yield BODY[i : i + 4096]

    s3 = FakeS3()
    path = await _cache(tmp_path, fetchers={"s3": s3}).fetch(asset)
    assert path.read_bytes() == BODY and s3.urls == ["s3://bucket/runsc"]


async def test_a_fetcher_failing_midway_leaves_no_temp_file(tmp_path: Path) -> None:
    class Broken:
        async def stream(self, url: str) -> AsyncGenerator[bytes, None]:
            yield b"partial"
            raise ConnectionResetError("peer went away")

    with pytest.raises(AssetError, match="peer went away"):
        await _cache(tmp_path, fetchers={"s3": Broken()}).fetch(Asset("s3://b/k", sha(BODY)))
    assert leftovers(tmp_path) == []


async def test_leftover_temp_files_from_a_crash_are_swept(tmp_path: Path) -> None:
    stale = tmp_path / "cache" / "sha256" / f".{sha(b'x')}.abc.part"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    src = tmp_path / "runsc"
    src.write_bytes(BODY)
    await _cache(tmp_path).fetch(Asset(f"file://{src}", sha(BODY)))
    assert leftovers(tmp_path / "cache") == [f"sha256/{sha(BODY)}"]


async def test_stager_returns_paths_by_name_and_reports_failures(tmp_path: Path) -> None:
    files = {}
    for name in ("kernel", "vmm"):
        (tmp_path / name).write_bytes(name.encode() * 10)
        files[name] = Asset(f"file://{tmp_path / name}", sha(name.encode() * 10))
    stager = RuntimeStager(_cache(tmp_path))
    paths = await stager.stage(RuntimeRecord("microvm", files))
    assert {k: v.read_bytes() for k, v in paths.items()} == {"kernel": b"kernel" * 10, "vmm": b"vmm" * 10}
    await stager(RuntimeRecord("microvm", files))  # the Prewarmer's stage signature

    one_bad = dict(files, vmm=Asset(files["vmm"].url, sha(b"nope")))
    with pytest.raises(AssetIntegrityError):
        await stager.stage(RuntimeRecord("microvm", one_bad))
    two_bad = {"a": Asset("s3://x/a", sha(b"a")), "b": Asset("s3://x/b", sha(b"b"))}
    with pytest.raises(HostError, match="2 assets failed"):
        await stager.stage(RuntimeRecord("microvm", two_bad))
