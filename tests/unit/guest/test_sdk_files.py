"""Files and directory watching through the unmodified e2b SDK (sync and async)."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable, Iterator

import pytest
from e2b import FilesystemEvent, FilesystemEventType, FileType, NotFoundException, Sandbox

from .conftest import USER_UID, AgentProc
from .helpers import make_async_sandbox, make_sandbox


@pytest.fixture(scope="module")
def sbx(agent: AgentProc) -> Iterator[Sandbox]:
    yield make_sandbox(agent.url)


def _wait_for(get: Callable[[], list[FilesystemEvent]], want: Callable[[list[FilesystemEvent]], bool]) -> None:
    seen: list[FilesystemEvent] = []
    deadline = time.monotonic() + 20
    while not want(seen):
        assert time.monotonic() < deadline, f"events never arrived; saw {seen}"
        seen += get()
        time.sleep(0.05)


def _has(events: list[FilesystemEvent], name: str, kind: FilesystemEventType) -> bool:
    return any(e.name == name and e.type == kind for e in events)


def test_write_and_read_text_and_bytes(sbx: Sandbox, agent: AgentProc) -> None:
    info = sbx.files.write("docs/hello.txt", "hello wörld")
    assert info.path == str(agent.home / "docs" / "hello.txt") and info.name == "hello.txt"
    assert sbx.files.read("docs/hello.txt") == "hello wörld"
    data = bytes(range(256)) * 10
    sbx.files.write("docs/blob.bin", data)
    assert bytes(sbx.files.read("docs/blob.bin", format="bytes")) == data
    assert b"".join(sbx.files.read("docs/blob.bin", format="stream")) == data
    assert bytes(sbx.files.read("docs/blob.bin", format="bytes", gzip=True)) == data
    sbx.files.write("docs/stream.bin", io.BytesIO(data))  # octet-stream upload
    sbx.files.write("docs/gz.bin", data, gzip=True)
    assert (agent.home / "docs" / "stream.bin").read_bytes() == data
    assert (agent.home / "docs" / "gz.bin").read_bytes() == data
    assert (agent.home / "docs" / "hello.txt").stat().st_uid == USER_UID


def test_write_files(sbx: Sandbox, agent: AgentProc) -> None:
    infos = sbx.files.write_files(
        [{"path": "wf/a.txt", "data": "A"}, {"path": str(agent.home / "wf/b/c.txt"), "data": b"C"}]
    )
    assert [i.path for i in infos] == [str(agent.home / "wf/a.txt"), str(agent.home / "wf/b/c.txt")]
    assert sbx.files.read("wf/b/c.txt") == "C"


def test_write_as_root_is_owned_by_root(sbx: Sandbox) -> None:
    info = sbx.files.write("/tmp/warren-guest-root-owned.txt", "r", user="root")
    assert sbx.files.get_info(info.path).owner == "root"
    sbx.files.remove(info.path)


def test_list_with_depth_and_entry_info(sbx: Sandbox, agent: AgentProc) -> None:
    sbx.files.make_dir("tree/a/b")
    sbx.files.write("tree/a/b/deep.txt", "d")
    sbx.files.write("tree/top.txt", "t")
    (agent.home / "tree" / "link").symlink_to("top.txt")
    names = {e.name: e for e in sbx.files.list("tree")}
    assert set(names) == {"a", "top.txt", "link"}
    assert names["a"].type == FileType.DIR
    assert names["top.txt"].type == FileType.FILE and names["top.txt"].size == 1
    assert names["link"].type == FileType.SYMLINK
    assert names["link"].symlink_target == str(agent.home / "tree" / "top.txt")
    deep = {e.path for e in sbx.files.list("tree", depth=3)}
    assert str(agent.home / "tree/a/b/deep.txt") in deep
    assert str(agent.home / "tree/a/b/deep.txt") not in {e.path for e in sbx.files.list("tree", depth=2)}
    info = sbx.files.get_info("tree/top.txt")
    assert (info.owner, info.group, info.permissions, info.mode) == ("user", "nogroup", "-rw-r--r--", 0o644)
    with pytest.raises(NotFoundException):
        sbx.files.get_info("tree/missing")


def test_exists_make_dir_rename_remove(sbx: Sandbox, agent: AgentProc) -> None:
    assert sbx.files.exists("ops") is False
    assert sbx.files.make_dir("ops/x") is True
    assert sbx.files.make_dir("ops/x") is False
    assert sbx.files.exists("ops/x") is True
    assert (agent.home / "ops").stat().st_uid == USER_UID
    sbx.files.write("ops/x/f.txt", "f")
    moved = sbx.files.rename("ops/x/f.txt", "ops/y/g.txt")
    assert moved.path == str(agent.home / "ops/y/g.txt") and moved.type == FileType.FILE
    assert sbx.files.exists("ops/x/f.txt") is False
    with pytest.raises(NotFoundException):
        sbx.files.rename("ops/nothing", "ops/else")
    sbx.files.remove("ops")
    assert sbx.files.exists("ops") is False
    sbx.files.remove("ops")  # removing what is gone is fine (envd: RemoveAll)


def test_read_missing_raises_not_found(sbx: Sandbox) -> None:
    assert sbx.is_running() is True  # GET /health
    with pytest.raises(NotFoundException):
        sbx.files.read("nope/nothing.txt")


def test_watch_dir_sync(sbx: Sandbox) -> None:
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("watched")
    try:
        sbx.files.write("watched/new.txt", "1")
        sbx.files.rename("watched/new.txt", "watched/renamed.txt")
        sbx.files.remove("watched/renamed.txt")
        _wait_for(
            handle.get_new_events,
            lambda ev: (
                _has(ev, "new.txt", FilesystemEventType.CREATE)
                and _has(ev, "new.txt", FilesystemEventType.WRITE)
                and _has(ev, "new.txt", FilesystemEventType.RENAME)
                and _has(ev, "renamed.txt", FilesystemEventType.REMOVE)
            ),
        )
    finally:
        handle.stop()


def test_watch_dir_recursive_and_polling_fallback(sbx: Sandbox, fresh_agent: Callable[..., AgentProc]) -> None:
    sbx.files.make_dir("rec")
    handle = sbx.files.watch_dir("rec", recursive=True)
    try:
        sbx.files.make_dir("rec/sub/inner")
        sbx.files.write("rec/sub/inner/f.txt", "x")
        _wait_for(handle.get_new_events, lambda ev: _has(ev, "sub/inner/f.txt", FilesystemEventType.CREATE))
    finally:
        handle.stop()
    polled = fresh_agent({"WARREN_AGENT_WATCH": "poll"})
    psbx = make_sandbox(polled.url)
    psbx.files.make_dir("p")
    handle = psbx.files.watch_dir("p", recursive=True)
    try:
        psbx.files.write("p/a.txt", "1")
        psbx.files.make_dir("p/d")
        psbx.files.write("p/d/b.txt", "2")
        _wait_for(
            handle.get_new_events,
            lambda ev: (
                _has(ev, "a.txt", FilesystemEventType.CREATE) and _has(ev, "d/b.txt", FilesystemEventType.CREATE)
            ),
        )
        psbx.files.remove("p/a.txt")
        _wait_for(handle.get_new_events, lambda ev: _has(ev, "a.txt", FilesystemEventType.REMOVE))
    finally:
        handle.stop()


async def test_watch_dir_async(agent: AgentProc) -> None:
    sbx = make_async_sandbox(agent.url)
    await sbx.files.make_dir("awatch")
    events: list[FilesystemEvent] = []
    got = asyncio.Event()

    def on_event(e: FilesystemEvent) -> None:
        events.append(e)
        if _has(events, "f.txt", FilesystemEventType.CREATE) and _has(events, "f.txt", FilesystemEventType.WRITE):
            got.set()

    handle = await sbx.files.watch_dir("awatch", on_event, include_entry=True)
    try:
        await sbx.files.write("awatch/f.txt", "hello")
        await asyncio.wait_for(got.wait(), 20)
    finally:
        await handle.stop()
    created = next(e for e in events if e.type == FilesystemEventType.CREATE)
    assert created.entry is not None and created.entry.name == "f.txt"


async def test_async_sdk_files(agent: AgentProc) -> None:
    sbx = make_async_sandbox(agent.url)
    await sbx.files.write("async/x.txt", "async data")
    assert await sbx.files.read("async/x.txt") == "async data"
    assert [e.name for e in await sbx.files.list("async")] == ["x.txt"]
    assert await sbx.files.make_dir("async") is False
    assert await sbx.files.exists("async/x.txt") is True
    await sbx.files.remove("async")
    assert await sbx.files.exists("async") is False
