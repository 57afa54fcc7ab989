"""E2B semantics inside the sandbox, through the unmodified SDK (sync and async, runc and gVisor):
file metadata (xattrs), symlink entry info, per-sandbox boot ids, and /tmp on the sandbox's disk."""

from __future__ import annotations

import io
import re
import uuid
from pathlib import Path

from e2b import AsyncSandbox, AsyncTemplate, FileType, Sandbox, Template

from tests.framework.node import Node

HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
BOOT_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
XATTR = "python3 -c \"import os, sys; print(os.getxattr(sys.argv[1], sys.argv[2]).decode())\""


def _boot_id(box: Sandbox) -> str:
    boot_id = box.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert BOOT_ID_RE.match(boot_id), boot_id
    return boot_id


async def _aboot_id(box: AsyncSandbox) -> str:
    boot_id = (await box.commands.run("cat /proc/sys/kernel/random/boot_id")).stdout.strip()
    assert BOOT_ID_RE.match(boot_id), boot_id
    return boot_id


def _children(forked: list[Sandbox | Exception]) -> list[Sandbox]:
    boxes = [c for c in forked if isinstance(c, Sandbox)]
    assert len(boxes) == len(forked), forked
    return boxes


# --------------------------------------------------------------------------- file metadata

NO_XATTRS = "gvisor"
"""runsc 20221219's gofer (9p) root has no extended attributes (EOPNOTSUPP): like envd on such a
filesystem, the upload succeeds and no metadata is claimed."""


def _check_unsupported(box: Sandbox) -> None:
    info = box.files.write("/home/user/meta.txt", "v1", metadata={"Owner": "alice"})
    assert info.metadata is None and box.files.get_info(info.path).metadata is None
    assert box.files.read(info.path) == "v1"
    infos = box.files.write_files([{"path": "/home/user/m/a.txt", "data": "a"}], metadata={"Batch": "7"})
    assert infos[0].metadata is None and box.files.read("/home/user/m/a.txt") == "a"


def test_file_metadata_is_stored_and_returned(sbx: Sandbox, runtime: str) -> None:
    if runtime == NO_XATTRS:
        _check_unsupported(sbx)
        return
    path = "/home/user/meta.txt"
    info = sbx.files.write(path, "v1", metadata={"Owner": "alice", "tag": "x-1"})
    assert info.metadata == {"owner": "alice", "tag": "x-1"}  # keys lower-cased, as envd does
    assert sbx.files.get_info(path).metadata == {"owner": "alice", "tag": "x-1"}
    assert {e.name: e.metadata for e in sbx.files.list("/home/user")}["meta.txt"] == {"owner": "alice", "tag": "x-1"}
    assert sbx.commands.run(f"{XATTR} {path} user.e2b.owner").stdout.strip() == "alice"

    # octet-stream upload: replaces the whole set
    info = sbx.files.write(path, io.BytesIO(b"v2"), metadata={"only": "this"})
    assert info.metadata == {"only": "this"}
    assert sbx.files.get_info(path).metadata == {"only": "this"}

    infos = sbx.files.write_files(
        [{"path": "/home/user/m/a.txt", "data": "a"}, {"path": "/home/user/m/b.txt", "data": "b"}],
        metadata={"Batch": "7"},
    )
    assert [i.metadata for i in infos] == [{"batch": "7"}, {"batch": "7"}]
    assert sbx.files.get_info("/home/user/m/b.txt").metadata == {"batch": "7"}

    # an upload without metadata clears it
    info = sbx.files.write(path, "v3")
    assert info.metadata is None
    assert sbx.files.get_info(path).metadata is None


async def test_file_metadata_async(node: Node, template: str, runtime: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        if runtime == NO_XATTRS:
            info = await box.files.write("/home/user/am.txt", "x", metadata={"Kind": "report"})
            assert info.metadata is None and await box.files.read("/home/user/am.txt") == "x"
            return
        info = await box.files.write("/home/user/am.txt", "x", metadata={"Kind": "report"})
        assert info.metadata == {"kind": "report"}
        assert (await box.files.get_info("/home/user/am.txt")).metadata == {"kind": "report"}
        infos = await box.files.write_files([{"path": "/home/user/am2.txt", "data": "y"}], metadata={"A": "b"})
        assert [i.metadata for i in infos] == [{"a": "b"}]
        assert (await box.files.write("/home/user/am.txt", "z")).metadata is None
    finally:
        await box.kill()


# --------------------------------------------------------------------------- symlinks


def test_symlink_info_follows_the_link(sbx: Sandbox, runtime: str) -> None:
    sbx.files.write("/home/user/target.txt", "t", metadata={"k": "v"})
    kv = None if runtime == NO_XATTRS else {"k": "v"}
    sbx.commands.run("chmod 600 target.txt && mkdir sub && ln -s target.txt link.txt && ln -s sub dirlink "
                     "&& ln -s /nowhere broken", cwd="/home/user")
    info = sbx.files.get_info("/home/user/link.txt")
    assert info.type == FileType.SYMLINK  # the SDK maps envd's is_symlink to SYMLINK
    assert info.symlink_target == "/home/user/target.txt"
    assert info.name == "link.txt" and info.path == "/home/user/link.txt"
    assert info.mode == 0o600  # the target's permission bits
    assert info.permissions == "Lrwxrwxrwx"
    assert info.metadata == kv  # envd reads the xattrs through the link
    assert sbx.files.get_info("/home/user/dirlink").symlink_target == "/home/user/sub"
    assert sbx.files.get_info("/home/user/target.txt").symlink_target is None
    listed = {e.name: e for e in sbx.files.list("/home/user")}
    assert listed["link.txt"].type == FileType.SYMLINK
    assert listed["link.txt"].symlink_target == "/home/user/target.txt"
    assert listed["link.txt"].metadata == kv
    assert listed["dirlink"].symlink_target == "/home/user/sub"
    assert listed["broken"].type == FileType.SYMLINK
    assert listed["target.txt"].type == FileType.FILE and listed["target.txt"].symlink_target is None
    # list through a symlinked directory shows the path asked for
    sbx.files.write("/home/user/sub/in.txt", "i")
    assert [e.path for e in sbx.files.list("/home/user/dirlink")] == ["/home/user/dirlink/in.txt"]


async def test_symlink_info_async(node: Node, template: str, runtime: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        await box.files.write("/home/user/t.txt", "t", metadata={"k": "v"})
        await box.commands.run("ln -s t.txt l.txt", cwd="/home/user")
        info = await box.files.get_info("/home/user/l.txt")
        assert (info.type, info.symlink_target, info.mode, info.metadata) == (
            FileType.SYMLINK, "/home/user/t.txt", 0o644, None if runtime == NO_XATTRS else {"k": "v"})
    finally:
        await box.kill()


# --------------------------------------------------------------------------- boot ids


def test_boot_id_rules(sbx: Sandbox, template: str) -> None:
    first = _boot_id(sbx)
    assert first != HOST_BOOT_ID
    other = Sandbox.create(template=template, timeout=120)
    try:
        assert _boot_id(other) not in (first, HOST_BOOT_ID)
    finally:
        other.kill()

    assert sbx.pause() is True  # memory: the same boot
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert _boot_id(resumed) == first

    children = _children(resumed.fork(count=2))
    try:
        ids = [_boot_id(c) for c in children]
        assert len({first, *ids}) == 3, (first, ids)
    finally:
        for c in children:
            c.kill()

    snap = resumed.create_snapshot()
    try:
        restored = Sandbox.create(template=snap.snapshot_id, timeout=120)
        try:
            assert _boot_id(restored) not in (first, HOST_BOOT_ID)
        finally:
            restored.kill()
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)

    assert resumed.pause(mode="filesystem") is True  # filesystem only: a new boot
    again = Sandbox.connect(sbx.sandbox_id)
    second = _boot_id(again)
    assert second not in (first, HOST_BOOT_ID)
    assert again.pause() is True
    assert _boot_id(Sandbox.connect(sbx.sandbox_id)) == second


async def test_boot_id_rules_async(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        first = await _aboot_id(box)
        assert first != HOST_BOOT_ID
        assert await box.pause() is True
        box = await AsyncSandbox.connect(box.sandbox_id)
        assert await _aboot_id(box) == first
        assert await box.pause(mode="filesystem") is True
        box = await AsyncSandbox.connect(box.sandbox_id)
        assert await _aboot_id(box) not in (first, HOST_BOOT_ID)
    finally:
        await box.kill()


# --------------------------------------------------------------------------- /tmp on the sandbox's disk


def test_tmp_is_on_the_sandbox_disk(sbx: Sandbox) -> None:
    mounts = sbx.commands.run("awk '$2 == \"/tmp\"' /proc/mounts").stdout
    assert "tmpfs" not in mounts, mounts
    mode = sbx.commands.run("python3 -c \"import os; print(oct(os.stat('/tmp').st_mode & 0o7777))\"").stdout
    assert mode.strip() == "0o1777"
    sbx.files.write("/tmp/kept.txt", "kept")
    assert sbx.commands.run("echo user-can-write > /tmp/u.txt && cat /tmp/u.txt").stdout.strip() == "user-can-write"

    children = _children(sbx.fork(count=1))
    try:
        assert children[0].files.read("/tmp/kept.txt") == "kept"
    finally:
        children[0].kill()

    snap = sbx.create_snapshot()
    try:
        restored = Sandbox.create(template=snap.snapshot_id, timeout=120)
        try:
            assert restored.files.read("/tmp/kept.txt") == "kept"
        finally:
            restored.kill()
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)

    assert sbx.pause(mode="filesystem") is True
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.files.read("/tmp/kept.txt") == "kept"
    assert resumed.files.read("/tmp/u.txt") == "user-can-write\n"


START = "sh -c 'cat built.txt > started.txt; exec sleep 100000'"
READY = "test -s /tmp/app/started.txt"


def _tmp_build(start: Template | AsyncTemplate, template: str) -> Template | AsyncTemplate:
    return (
        start.from_template(template)
        .run_cmd("mkdir -p /tmp/app && echo built > /tmp/app/built.txt && chown -R user /tmp/app", user="root")
        .set_workdir("/tmp/app")
        .set_start_cmd(START, READY)
    )


def test_template_build_files_under_tmp_survive(node: Node, template: str) -> None:
    name = f"tmp-build-{uuid.uuid4().hex[:8]}"
    Template.build(_tmp_build(Template(), template), name)  # type: ignore[arg-type]
    try:
        box = Sandbox.create(template=name, timeout=120)
        try:
            assert box.files.read("/tmp/app/built.txt") == "built\n"
            assert box.files.read("/tmp/app/started.txt") == "built\n"
            assert box.commands.run("pwd").stdout.strip() == "/tmp/app"
        finally:
            box.kill()
    finally:
        with node.client() as c:
            assert c.delete(f"/templates/{name}").status_code == 204


async def test_tmp_on_disk_async(node: Node, template: str) -> None:
    name = f"tmp-abuild-{uuid.uuid4().hex[:8]}"
    await AsyncTemplate.build(_tmp_build(AsyncTemplate(), template), name)  # type: ignore[arg-type]
    try:
        box = await AsyncSandbox.create(template=name, timeout=120)
        try:
            assert await box.files.read("/tmp/app/started.txt") == "built\n"
            await box.files.write("/tmp/mine.txt", "mine")
            assert await box.pause(mode="filesystem") is True
            box = await AsyncSandbox.connect(box.sandbox_id)
            assert await box.files.read("/tmp/mine.txt") == "mine"
            assert await box.files.read("/tmp/app/built.txt") == "built\n"
        finally:
            await box.kill()
    finally:
        with node.client() as c:
            assert c.delete(f"/templates/{name}").status_code == 204
