"""Single-flight sharing and the blob cache's partial-file rules."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path
from typing import BinaryIO

import pytest

from tests.unit.images.fakehub import digest
from warren.images.blobs import BlobCache, Downloader, SingleFlight
from warren.images.errors import DigestMismatchError, RegistryError


async def test_single_flight_shares_one_run() -> None:
    flight: SingleFlight[int] = SingleFlight()
    runs = 0
    waits = 0

    async def work() -> int:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.05)
        return 42

    def on_wait() -> None:
        nonlocal waits
        waits += 1

    results = await asyncio.gather(*(flight.run("k", work, on_wait) for _ in range(5)))
    assert results == [42] * 5 and runs == 1 and waits == 4
    assert not flight.busy("k")


async def test_waiters_retry_when_the_leader_fails_or_is_cancelled() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[str] = []

    async def failing() -> str:
        calls.append("fail")
        await asyncio.sleep(0.05)
        raise RegistryError("leader's own failure")

    async def slow() -> str:
        calls.append("slow")
        await asyncio.sleep(10)
        return "never"

    async def ok() -> str:
        calls.append("ok")
        return "fine"

    leader = asyncio.ensure_future(flight.run("a", failing))
    await asyncio.sleep(0)
    assert await flight.run("a", ok) == "fine"  # not the leader's error
    with pytest.raises(RegistryError):
        await leader

    leader = asyncio.ensure_future(flight.run("b", slow))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(flight.run("b", ok))
    await asyncio.sleep(0.01)
    leader.cancel()
    assert await waiter == "fine"
    assert calls == ["fail", "ok", "slow", "ok"]


async def test_cancelled_waiter_does_not_cancel_the_leader() -> None:
    flight: SingleFlight[int] = SingleFlight()

    async def work() -> int:
        await asyncio.sleep(0.05)
        return 1

    leader = asyncio.ensure_future(flight.run("k", work))
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(flight.run("k", work))
    await asyncio.sleep(0.01)
    waiter.cancel()
    assert await leader == 1


def _downloader(data: bytes, fail_after: int | None = None, exc: Exception | None = None) -> Downloader:
    async def download(out: BinaryIO) -> None:
        out.seek(0, os.SEEK_END)
        have = out.tell()
        end = len(data) if fail_after is None else fail_after
        out.write(data[have:end])
        if exc is not None:
            raise exc

    return download


async def test_fetch_keeps_resumable_partial_but_drops_mismatched(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path, tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    data = os.urandom(1000)
    dig = digest(data)
    with pytest.raises(RegistryError):
        await cache.fetch(dig, _downloader(data, 300, RegistryError("dropped")))
    assert [p.name for p in cache.partials()] == [dig[7:]] and not cache.has(dig)
    assert (cache.partial / dig[7:]).stat().st_size == 300
    path = await cache.fetch(dig, _downloader(data))  # resumes from byte 300
    assert path.read_bytes() == data and cache.partials() == []
    assert await cache.fetch(dig, _downloader(b"unused")) == path

    other = os.urandom(100)
    with pytest.raises(DigestMismatchError):
        await cache.fetch(digest(other), _downloader(other, exc=DigestMismatchError("bad")))
    assert cache.partials() == [] and not cache.has(digest(other))


async def test_fetch_goes_private_when_another_process_holds_the_partial(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path, tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    data = os.urandom(1000)
    partial = cache.partial / digest(data)[7:]
    partial.write_bytes(data[:10])
    fd = os.open(partial, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = await cache.fetch(digest(data), _downloader(data))
        assert path.read_bytes() == data
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        os.close(fd)
