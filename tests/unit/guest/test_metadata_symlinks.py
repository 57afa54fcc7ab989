"""File metadata (``X-Metadata-*`` -> ``user.e2b.*`` xattrs) and symlink entry info, on the wire and
through the unmodified SDK (sync and async)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest
from e2b import FileType, InvalidArgumentException, Sandbox

from warren.guest import metadata as meta

from .conftest import AgentProc
from .helpers import make_async_sandbox, make_sandbox, unary


@pytest.fixture(scope="module")
def sbx(agent: AgentProc) -> Iterator[Sandbox]:
    yield make_sandbox(agent.url)


def _xattrs(path: object) -> dict[str, bytes]:
    return {n: os.getxattr(str(path), n) for n in os.listxattr(str(path)) if n.startswith("user.e2b.")}


# --------------------------------------------------------------------------- metadata: wire


def test_upload_answers_with_the_stored_metadata(agent: AgentProc) -> None:
    target = agent.home / "wire-meta.txt"
    with agent.client() as c:
        r = c.post("/files", params={"path": "wire-meta.txt"}, content=b"one",
                   headers={"content-type": "application/octet-stream", "X-Metadata-Owner": "Alice",
                            "X-Metadata-k2": "v 2"})
        assert r.status_code == 200, r.text
        assert r.json() == [{"name": "wire-meta.txt", "type": "file", "path": str(target),
                             "metadata": {"owner": "Alice", "k2": "v 2"}}]
        assert _xattrs(target) == {"user.e2b.owner": b"Alice", "user.e2b.k2": b"v 2"}
        r = c.post("/files", params={"path": "wire-meta.txt"}, content=b"two",
                   headers={"content-type": "application/octet-stream", "X-Metadata-Owner": "Bob"})
        assert r.json()[0]["metadata"] == {"owner": "Bob"}  # replaced, k2 removed
        r = c.post("/files", params={"path": "wire-meta.txt"}, content=b"three",
                   headers={"content-type": "application/octet-stream"})
        assert "metadata" not in r.json()[0]  # an upload without metadata clears it
    assert _xattrs(target) == {}
    os.setxattr(target, "user.other", b"kept")  # not ours: untouched, not shown
    with agent.client() as c:
        r = c.post("/files", params={"path": "wire-meta.txt"}, content=b"four",
                   headers={"content-type": "application/octet-stream", "X-Metadata-a": "b"})
        assert r.json()[0]["metadata"] == {"a": "b"}
    assert os.getxattr(target, "user.other") == b"kept"


@pytest.mark.parametrize("headers", [
    {"X-Metadata-k": "a\tb"},
    {"X-Metadata-" + "k" * 247: "v"},
    {f"X-Metadata-k{i}": "v" * 200 for i in range(20)},
])
def test_invalid_metadata_is_400_and_writes_nothing(agent: AgentProc, headers: dict[str, str]) -> None:
    with agent.client() as c:
        r = c.post("/files", params={"path": "bad-meta.txt"}, content=b"x",
                   headers={"content-type": "application/octet-stream", **headers})
    assert r.status_code == 400 and "invalid metadata" in r.json()["message"]
    assert not (agent.home / "bad-meta.txt").exists()


def test_stat_and_list_show_metadata(agent: AgentProc) -> None:
    target = agent.home / "stat-meta.txt"
    target.write_text("x")
    os.setxattr(target, "user.e2b.color", b"blue")
    os.setxattr(target, "user.e2b.bin", b"\xff\xfe")  # not UTF-8: skipped, as envd does
    with agent.client() as c:
        entry = unary(c, "filesystem.Filesystem/Stat", {"path": str(target)}).json()["entry"]
        assert entry["metadata"] == {"color": "blue"}
        listed = unary(c, "filesystem.Filesystem/ListDir", {"path": str(agent.home)}).json()["entries"]
        assert {e["name"]: e.get("metadata") for e in listed}["stat-meta.txt"] == {"color": "blue"}


def test_validate_limits() -> None:
    meta.validate({"k" * meta.MAX_KEY_LEN: "v"})
    for bad in ({"": "v"}, {"k\n": "v"}, {"k": "\x7f"}, {"k" * (meta.MAX_KEY_LEN + 1): "v"}):
        with pytest.raises(meta.MetadataError):
            meta.validate(bad)
    assert meta.from_headers({"x-metadata-a": "1", "x-metadata-": "2", "x-other": "3"}) == {"a": "1"}


# --------------------------------------------------------------------------- metadata: SDK


def test_sdk_write_and_write_files_with_metadata(sbx: Sandbox) -> None:
    info = sbx.files.write("sdk-meta/a.txt", "a", metadata={"Project": "p1"})
    assert info.metadata == {"project": "p1"}
    assert sbx.files.write("sdk-meta/a.txt", io.BytesIO(b"s"), metadata={"x": "y"}).metadata == {"x": "y"}
    infos = sbx.files.write_files([{"path": "sdk-meta/b.txt", "data": "b"}, {"path": "sdk-meta/c.txt", "data": "c"}],
                                  metadata={"Batch": "1"})
    assert [i.metadata for i in infos] == [{"batch": "1"}] * 2
    assert sbx.files.get_info("sdk-meta/c.txt").metadata == {"batch": "1"}
    assert {e.name: e.metadata for e in sbx.files.list("sdk-meta")} == {
        "a.txt": {"x": "y"}, "b.txt": {"batch": "1"}, "c.txt": {"batch": "1"}}
    assert sbx.files.write("sdk-meta/a.txt", "again").metadata is None
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("sdk-meta/d.txt", "d", metadata={"bad key": "v"})


async def test_sdk_async_metadata(agent: AgentProc) -> None:
    box = make_async_sandbox(agent.url)
    info = await box.files.write("async-meta.txt", "a", metadata={"K": "v"})
    assert info.metadata == {"k": "v"}
    assert (await box.files.get_info("async-meta.txt")).metadata == {"k": "v"}
    infos = await box.files.write_files([{"path": "async-meta2.txt", "data": "b"}], metadata={"B": "c"})
    assert infos[0].metadata == {"b": "c"}


# --------------------------------------------------------------------------- symlinks


def test_symlink_entry_on_the_wire(agent: AgentProc) -> None:
    d = agent.home / "links"
    d.mkdir()
    (d / "t.txt").write_text("target")
    (d / "t.txt").chmod(0o600)
    os.setxattr(d / "t.txt", "user.e2b.k", b"v")
    (d / "sub").mkdir()
    (d / "l.txt").symlink_to("t.txt")
    (d / "dl").symlink_to("sub")
    (d / "broken").symlink_to("/nowhere/at/all")
    with agent.client() as c:
        entry = unary(c, "filesystem.Filesystem/Stat", {"path": str(d / "l.txt")}).json()["entry"]
        assert entry["type"] == "FILE_TYPE_FILE"  # the target's type
        assert entry["isSymlink"] is True and entry["symlinkTarget"] == str(d / "t.txt")
        assert entry["mode"] == 0o600 and entry["permissions"] == "Lrwxrwxrwx"
        assert entry["metadata"] == {"k": "v"}
        entry = unary(c, "filesystem.Filesystem/Stat", {"path": str(d / "dl")}).json()["entry"]
        want = ("FILE_TYPE_DIRECTORY", True, str(d / "sub"))
        assert (entry["type"], entry["isSymlink"], entry["symlinkTarget"]) == want
        plain = unary(c, "filesystem.Filesystem/Stat", {"path": str(d / "t.txt")}).json()["entry"]
        assert "isSymlink" not in plain and "symlinkTarget" not in plain
        listed = {e["name"]: e for e in
                  unary(c, "filesystem.Filesystem/ListDir", {"path": str(d)}).json()["entries"]}
        assert listed["l.txt"]["isSymlink"] is True and listed["l.txt"]["type"] == "FILE_TYPE_FILE"
        assert listed["dl"]["type"] == "FILE_TYPE_DIRECTORY"
        assert listed["broken"]["isSymlink"] is True and listed["broken"]["symlinkTarget"] == "/nowhere/at/all"


def test_sdk_symlink_info(sbx: Sandbox, agent: AgentProc) -> None:
    d = agent.home / "sdk-links"
    d.mkdir()
    (d / "t.txt").write_text("t")
    (d / "l.txt").symlink_to("t.txt")
    info = sbx.files.get_info(str(d / "l.txt"))
    assert (info.type, info.symlink_target, info.mode) == (FileType.SYMLINK, str(d / "t.txt"), 0o644)
    assert sbx.files.get_info(str(d / "t.txt")).symlink_target is None


async def test_sdk_async_symlink_info(agent: AgentProc) -> None:
    d = agent.home / "async-links"
    d.mkdir()
    (d / "t.txt").write_text("t")
    (d / "l.txt").symlink_to("t.txt")
    info = await make_async_sandbox(agent.url).files.get_info(str(d / "l.txt"))
    assert (info.type, info.symlink_target) == (FileType.SYMLINK, str(d / "t.txt"))
