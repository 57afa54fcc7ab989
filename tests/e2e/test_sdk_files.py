"""Filesystem operations through the unmodified E2B SDK (sync), on every runtime."""

from __future__ import annotations

import os
import time

from e2b import FileType, Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType


def test_write_and_read_text_and_bytes(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/a.txt", "hello")
    assert info.path == "/home/user/a.txt"
    assert sbx.files.read("/home/user/a.txt") == "hello"
    sbx.files.write("rel.bin", b"\x00\x01\xff")
    assert bytes(sbx.files.read("/home/user/rel.bin", format="bytes")) == b"\x00\x01\xff"
    owner = "python3 -c 'import os, pwd; print(pwd.getpwuid(os.stat(\"/home/user/a.txt\").st_uid).pw_name)'"
    assert sbx.commands.run(owner).stdout.strip() == "user"


def test_large_file_round_trip(sbx: Sandbox) -> None:
    data = os.urandom(50 * 1024 * 1024)
    sbx.files.write("/tmp/big.bin", data)
    assert sbx.files.get_info("/tmp/big.bin").size == len(data)
    assert bytes(sbx.files.read("/tmp/big.bin", format="bytes")) == data


def test_write_files_list_depth_exists_make_dir(sbx: Sandbox) -> None:
    sbx.files.write_files(
        [WriteEntry(path="/home/user/d/one.txt", data="1"), WriteEntry(path="/home/user/d/sub/two.txt", data="2")]
    )
    names1 = {e.name for e in sbx.files.list("/home/user/d")}
    assert names1 == {"one.txt", "sub"}
    names2 = {e.path for e in sbx.files.list("/home/user/d", depth=2)}
    assert "/home/user/d/sub/two.txt" in names2
    assert sbx.files.exists("/home/user/d/one.txt")
    assert not sbx.files.exists("/home/user/d/missing")
    assert sbx.files.make_dir("/home/user/newdir") is True
    assert sbx.files.make_dir("/home/user/newdir") is False
    assert sbx.files.get_info("/home/user/newdir").type == FileType.DIR


def test_rename_remove_get_info(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/x.txt", "x")
    moved = sbx.files.rename("/home/user/x.txt", "/home/user/y.txt")
    assert moved.path == "/home/user/y.txt"
    assert not sbx.files.exists("/home/user/x.txt")
    info = sbx.files.get_info("/home/user/y.txt")
    assert info.type == FileType.FILE and info.size == 1
    sbx.files.remove("/home/user/y.txt")
    assert not sbx.files.exists("/home/user/y.txt")


def test_watch_dir(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/w")
    handle = sbx.files.watch_dir("/home/user/w")
    try:
        sbx.files.write("/home/user/w/new.txt", "data")
        events = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e.name == "new.txt" for e in events):
            events += handle.get_new_events()
            time.sleep(0.1)
        assert any(e.name == "new.txt" and e.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE)
                   for e in events)
    finally:
        handle.stop()
