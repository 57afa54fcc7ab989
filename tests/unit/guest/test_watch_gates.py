"""Watch features the SDK gates on the envd version warren reports (0.6.4): ``include_entry`` only on
events whose path still names the entry (0.6.3), and network mounts refused unless allowed (0.6.4)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import FilesystemEvent, FilesystemEventType

from warren.guest import mounts

from .conftest import AgentProc
from .helpers import make_async_sandbox, make_sandbox

MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/vda rw
30 22 0:50 / /mnt/nfs rw,relatime - nfs4 srv:/export rw
31 30 0:51 / /mnt/nfs/local rw - tmpfs tmpfs rw
32 22 0:52 / /mnt/with\\040space rw - fuse.sshfs host: rw
33 22 0:53 / /home/user/data rw - cifs //srv/share rw
34 22 0:54 / /tmp rw - 9p none rw
"""


@pytest.mark.parametrize(("path", "kind"), [
    ("/", "ext4"), ("/etc/passwd", "ext4"), ("/mnt/nfs", "nfs4"), ("/mnt/nfs/a/b", "nfs4"),
    ("/mnt/nfs/local/x", "tmpfs"), ("/mnt/nfsx", "ext4"), ("/mnt/with space/f", "fuse.sshfs"),
    ("/home/user/data/x", "cifs"), ("/tmp/x", "9p"),
])
def test_filesystem_type(path: str, kind: str) -> None:
    assert mounts.filesystem_type(path, MOUNTINFO) == kind


def test_is_network_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO.replace("/home/user/data", str(tmp_path / "share")))
    (tmp_path / "share").mkdir()
    monkeypatch.setattr(mounts, "MOUNTINFO", str(info))
    assert mounts.is_network_mount(str(tmp_path / "share"))
    assert not mounts.is_network_mount(str(tmp_path))
    assert not mounts.is_network_mount("/tmp")  # gVisor's 9p root is not a network filesystem for envd
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "missing"))
    assert not mounts.is_network_mount(str(tmp_path / "share"))


def test_watch_on_a_local_dir_with_or_without_network_mounts(agent: AgentProc) -> None:
    sbx = make_sandbox(agent.url)
    sbx.files.make_dir("local-watch")
    for allow in (False, True):
        handle = sbx.files.watch_dir("local-watch", allow_network_mounts=allow)
        handle.stop()


def _wait(get: Callable[[], list[FilesystemEvent]], want: Callable[[list[FilesystemEvent]], bool]) -> None:
    seen: list[FilesystemEvent] = []
    deadline = time.monotonic() + 20
    while not want(seen):
        assert time.monotonic() < deadline, seen
        seen += get()
        time.sleep(0.05)


def test_entry_only_on_create_write_chmod(agent: AgentProc) -> None:
    sbx = make_sandbox(agent.url)
    sbx.files.make_dir("entry-watch")
    handle = sbx.files.watch_dir("entry-watch", include_entry=True)
    events: list[FilesystemEvent] = []
    try:
        sbx.files.write("entry-watch/a.txt", "1")
        sbx.files.rename("entry-watch/a.txt", "entry-watch/b.txt")
        sbx.files.write("entry-watch/a.txt", "again")  # a new entry at the renamed-away path
        sbx.files.remove("entry-watch/b.txt")

        def done(seen: list[FilesystemEvent]) -> bool:
            events[:] = seen
            return any(e.name == "b.txt" and e.type == FilesystemEventType.REMOVE for e in seen)

        _wait(handle.get_new_events, done)
    finally:
        handle.stop()
    for e in events:
        if e.type in (FilesystemEventType.REMOVE, FilesystemEventType.RENAME):
            assert e.entry is None, e
    assert any(e.type == FilesystemEventType.CREATE and e.entry is not None for e in events)


async def test_entry_only_on_create_write_chmod_async(agent: AgentProc) -> None:
    sbx = make_async_sandbox(agent.url)
    await sbx.files.make_dir("aentry-watch")
    events: list[FilesystemEvent] = []
    removed = asyncio.Event()

    def on_event(e: FilesystemEvent) -> None:
        events.append(e)
        if e.type == FilesystemEventType.REMOVE:
            removed.set()

    handle = await sbx.files.watch_dir("aentry-watch", on_event, include_entry=True)
    try:
        await sbx.files.write("aentry-watch/a.txt", "1")
        await sbx.files.rename("aentry-watch/a.txt", "aentry-watch/b.txt")
        await sbx.files.write("aentry-watch/a.txt", "again")
        await sbx.files.remove("aentry-watch/b.txt")
        await asyncio.wait_for(removed.wait(), 20)
    finally:
        await handle.stop()
    assert all(e.entry is None for e in events if e.type in (FilesystemEventType.REMOVE, FilesystemEventType.RENAME))


@pytest.mark.parametrize(("kind", "carries"), [
    ("CREATE", True), ("WRITE", True), ("CHMOD", True), ("RENAME", False), ("REMOVE", False),
])
def test_event_entry_by_kind(tmp_path: Path, kind: str, carries: bool) -> None:
    """A rename or remove never carries an entry, even when a new file exists at the path by now."""
    from warren.guest.filesystem import _event
    from warren.guest.users import Accounts

    (tmp_path / "f.txt").write_text("replacement")
    event = _event(Accounts(), str(tmp_path), str(tmp_path / "f.txt"), kind, True)
    assert event["type"] == f"EVENT_TYPE_{kind}" and event["name"] == "f.txt"
    assert ("entry" in event) is carries
    assert "entry" not in _event(Accounts(), str(tmp_path), str(tmp_path / "f.txt"), kind, False)
