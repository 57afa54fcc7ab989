"""RuntimeIndex: durable registration, reload, resolution, and what a damaged file does."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from warren.errors import ConflictError, HostError
from warren.runtime.index import Provenance, RuntimeIndex, RuntimeMissError, register_configs
from warren.runtime.records import Asset, InvalidRuntimeRecord, RuntimeConfig, RuntimeRecord

from .helpers import record


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def _open(path: Path, clock: Clock | None = None) -> RuntimeIndex:
    index = RuntimeIndex(path, clock=clock or Clock())
    index.load()
    return index


async def test_register_reopen_resolve_with_provenance(tmp_path: Path) -> None:
    path = tmp_path / "state" / "runtime-index.json"
    index = _open(path)
    a, b = record("a"), record("b", sandbox_class="runc")
    ha = await index.register(a, config_name="gvisor-default", config_version="20260622")
    hb = await index.register(b)
    assert (ha, hb) == (a.hash(), b.hash())
    assert index.resolve(ha) == a

    reopened = _open(path)
    assert reopened.hashes() == tuple(sorted([ha, hb]))
    assert reopened.resolve(ha) == a and reopened.resolve(hb) == b
    assert reopened.provenance(ha) == Provenance(1_700_000_001.0, "gvisor-default", "20260622")
    assert reopened.provenance(hb) == Provenance(1_700_000_002.0, None, None)
    assert [p.name for p in path.parent.iterdir()] == ["runtime-index.json"]  # no temp file left


async def test_a_miss_is_a_conflict_naming_the_hash(tmp_path: Path) -> None:
    index = _open(tmp_path / "i.json")
    missing = record("x").hash()
    with pytest.raises(RuntimeMissError, match=missing) as info:
        index.resolve(missing)
    assert isinstance(info.value, ConflictError)
    with pytest.raises(RuntimeMissError):
        index.provenance(missing)


async def test_reregistering_keeps_the_first_provenance_and_moved_urls_are_a_new_runtime(tmp_path: Path) -> None:
    path = tmp_path / "i.json"
    index = _open(path)
    rec = record("a")
    h = await index.register(rec, config_name="one", config_version="1")
    before = path.read_bytes()
    assert await index.register(rec, config_name="two", config_version="2") == h
    assert path.read_bytes() == before
    assert index.provenance(h).config_name == "one"

    moved = RuntimeRecord("gvisor", {"runsc": Asset("https://mirror.invalid/runsc", rec.assets["runsc"].sha256)})
    moved_hash = await index.register(moved, config_name="two", config_version="2")
    assert moved_hash != h
    reopened = _open(path)
    assert reopened.resolve(h) == rec and reopened.resolve(moved_hash) == moved
    assert index.provenance(h).config_name == "one"


async def test_a_mis_keyed_or_broken_entry_is_dropped_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "i.json"
    index = _open(path)
    good, other = record("good"), record("other")
    await index.register(good)
    await index.register(other)
    data = json.loads(path.read_text())
    runtimes = data["runtimes"]
    runtimes["f" * 64] = runtimes.pop(other.hash())  # right record, wrong key
    runtimes["e" * 64] = {"record": {"sandbox_class": "nope"}, "registered_at": 1.0}
    path.write_text(json.dumps(data))

    with caplog.at_level(logging.WARNING, logger="warren.runtime.index"):
        reopened = _open(path)
    assert reopened.hashes() == (good.hash(),)
    assert "f" * 64 in caplog.text and "e" * 64 in caplog.text
    # the next registration rewrites the file without the dropped entries
    await reopened.register(other)
    assert set(json.loads(path.read_text())["runtimes"]) == {good.hash(), other.hash()}


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[]", b'{"format": 99, "runtimes": {}}'])
async def test_a_corrupt_file_loads_empty_and_is_rewritten_on_the_next_register(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "i.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="warren.runtime.index"):
        index = _open(path)
    assert index.hashes() == () and "does not decode" in caplog.text
    h = await index.register(record("a"))
    assert _open(path).hashes() == (h,)


async def test_an_unwritable_path_fails_the_registration_and_adds_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file where the index's directory should be")
    index = _open(blocker / "runtime-index.json")
    rec = record("a")
    with pytest.raises(HostError, match=rf"cannot persist runtime {rec.hash()} to the runtime index .*not-a-dir"):
        await index.register(rec)
    assert index.hashes() == () and rec.hash() not in index
    with pytest.raises(RuntimeMissError):
        index.resolve(rec.hash())


async def test_register_before_load_reads_the_file_first(tmp_path: Path) -> None:
    path = tmp_path / "i.json"
    first = await _open(path).register(record("a"))
    fresh = RuntimeIndex(path)  # nobody called load()
    second = await fresh.register(record("b"))
    assert _open(path).hashes() == tuple(sorted([first, second]))


async def test_a_cancelled_register_leaves_memory_untouched_and_the_index_consistent(tmp_path: Path) -> None:
    path = tmp_path / "i.json"
    index = _open(path)
    task = asyncio.create_task(index.register(record("a")))
    await asyncio.sleep(0)  # the write is in its thread now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert record("a").hash() not in index
    h = await index.register(record("b"))
    assert index.hashes() == (h,)
    assert h in _open(path).hashes()


def test_an_older_write_never_replaces_a_newer_file(tmp_path: Path) -> None:
    index = RuntimeIndex(tmp_path / "i.json")
    index._write(b"new\n", 2)
    index._write(b"old\n", 1)
    assert (tmp_path / "i.json").read_bytes() == b"new\n"


async def test_register_configs_validates_then_registers_every_version(tmp_path: Path) -> None:
    index = _open(tmp_path / "i.json")
    configs = [
        RuntimeConfig("gv", "1", record("a"), default=False),
        RuntimeConfig("gv", "2", record("b"), default=True),
    ]
    hashes = await register_configs(index, configs)
    assert hashes == {("gv", "1"): record("a").hash(), ("gv", "2"): record("b").hash()}
    assert index.provenance(record("b").hash()).config_version == "2"
    with pytest.raises(InvalidRuntimeRecord):
        await register_configs(index, [RuntimeConfig("x", "1", record("c"), default=False)])
    assert record("c").hash() not in index
