"""The shared snapshot store (``warren.snapshots.shared``) on both backends: a directory (a shared mount)
and S3 (moto's server standing in for S3/MinIO, ``tests.framework.s3``).

Every test runs on both; each one ends with the leak check of the ``shared`` fixture: scratch empty, no
``tar`` child left, nothing mounted under the test's temp dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.framework.node import free_port
from tests.framework.s3 import S3Server, s3_env, s3_server
from warren.errors import HostError, InvalidRequestError, NotFoundError, UnavailableError
from warren.snapshots.shared import (
    BundleError,
    BundleManifest,
    DirObjectStore,
    ObjectStore,
    ObjectTooLargeError,
    S3ObjectStore,
    SharedSnapshots,
)

__all__ = ["s3_env", "s3_server"]  # fixtures re-exported

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the round trip makes device nodes, trusted.* xattrs and files of other owners: needs root")


# fixtures


@pytest.fixture(params=["dir", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty object store of each backend."""
    if request.param == "dir":
        return DirObjectStore(tmp_path / "shared-mount")
    server: S3Server = request.getfixturevalue("s3_server")
    request.getfixturevalue("s3_env")
    return S3ObjectStore(server.make_bucket(), "warren/test", endpoint_url=server.endpoint)


def _tar_children() -> list[str]:
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if fields[1] == me and comm == "tar":
            found.append(pid)
    return found


def _mounts_under(path: Path) -> list[str]:
    out = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith(str(path))]


@dataclass
class Shared:
    objects: ObjectStore
    snapshots: SharedSnapshots
    scratch: Path
    tmp: Path

    def reader(self, objects: ObjectStore | None = None) -> SharedSnapshots:
        """Another node's view of the same store, with its own scratch dir (checked empty at the end)."""
        scratch = self.tmp / f"scratch-{len(self.extra_scratch)}"
        self.extra_scratch.append(scratch)
        return SharedSnapshots(objects or self.objects, scratch)

    extra_scratch: list[Path]


@pytest.fixture
async def shared(store: ObjectStore, tmp_path: Path) -> AsyncIterator[Shared]:
    scratch = tmp_path / "scratch"
    s = Shared(store, SharedSnapshots(store, scratch), scratch, tmp_path, [])
    yield s
    for d in [scratch, *s.extra_scratch]:
        assert not d.exists() or sorted(os.listdir(d)) == [], f"scratch {d} not empty: {os.listdir(d)}"
    assert _tar_children() == []
    assert _mounts_under(tmp_path) == []


# a hostile snapshot dir, and a description of a tree that compares everything a round trip must keep

WEIRD = "new\nline name"
BYTES_NAME = b"not-utf8-\xff\xfe"


def make_snapshot_dir(src: Path, marker: str = "v1") -> None:
    """What the runtime writes for a paused gVisor sandbox, with everything a hostile sandbox can put in
    its upper dir."""
    up = src / "upper"
    for d in ("etc", "opt/opaque", "home/user", "usr/bin", "var", "data", "empty", "tmp"):
        (up / d).mkdir(parents=True, exist_ok=True)
    (src / "meta.json").write_text(json.dumps({"marker": marker}))
    (src / "checkpoint").mkdir()
    (src / "checkpoint" / "pages.img").write_bytes(os.urandom(256 * 1024))
    (src / "checkpoint" / "checkpoint.img").write_text(marker * 1000)
    os.symlink("/etc/passwd", up / "etc" / "passwd-link")  # absolute: must stay a link, never its target
    os.symlink("/etc", up / "hostetc")
    os.symlink("../no/such/thing", up / "dangling")
    os.symlink("etc/hosts", up / "relative")
    os.mknod(up / "etc" / "removed", stat.S_IFCHR | 0o000, os.makedev(0, 0))  # an overlay whiteout
    os.setxattr(up / "opt" / "opaque", "trusted.overlay.opaque", b"y")
    (up / "opt" / "opaque" / "new.txt").write_text("new")
    os.setxattr(up / "opt" / "opaque" / "new.txt", "user.comment", b"kept")
    owned = up / "home" / "user" / "file"
    owned.write_text("mine")
    os.chown(owned, 100000, 100000)
    os.chown(up / "home" / "user", 100000, 100000, follow_symlinks=False)
    os.chown(up / "etc" / "passwd-link", 100007, 100008, follow_symlinks=False)
    (up / "rootfile").write_text("root's")
    os.chown(up / "rootfile", 0, 0)
    su = up / "usr" / "bin" / "su"
    su.write_bytes(b"\x7fELF fake")
    os.chmod(su, 0o4755)
    os.chmod(up / "tmp", 0o1777)
    os.chmod(up / "data", 0o2775)
    secret = up / "secret"
    secret.write_text("nobody reads me")
    os.chmod(secret, 0o000)
    with open(up / "var" / "sparse.img", "wb") as f:
        f.truncate(64 * MiB)
        f.write(b"head")
        f.seek(32 * MiB)
        f.write(b"middle")
    (up / "data" / "a").write_text("linked " + marker)
    os.link(up / "data" / "a", up / "data" / "b")
    (up / WEIRD).write_text("a name with a newline")
    with open(os.fsencode(up) + b"/" + BYTES_NAME, "wb") as f:
        f.write(b"bytes")


def describe(root: Path) -> dict[bytes, tuple[Any, ...]]:
    """Every entry below ``root`` (itself included) with type, mode, owner, content, target, device, xattrs,
    file mtime and hard-link group. Never follows a symlink."""
    out: dict[bytes, tuple[Any, ...]] = {}
    links: dict[int, bytes] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in [b"", *dirnames, *filenames] if dirpath == base else [*dirnames, *filenames]:
            path = os.path.join(dirpath, name) if name else dirpath
            rel = os.path.relpath(path, base)
            st = os.lstat(path)
            kind = stat.S_IFMT(st.st_mode)
            extra: tuple[Any, ...] = ()
            if stat.S_ISLNK(st.st_mode):
                extra = (os.readlink(path),)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    extra = (hashlib.sha256(f.read()).hexdigest(), st.st_size, int(st.st_mtime))
                if st.st_nlink > 1:
                    extra += (links.setdefault(st.st_ino, rel),)
            elif stat.S_ISCHR(st.st_mode):
                extra = (st.st_rdev,)
            names = () if stat.S_ISLNK(st.st_mode) else os.listxattr(path, follow_symlinks=False)
            xattrs = tuple(sorted((k, os.getxattr(path, k, follow_symlinks=False)) for k in names))
            out[rel] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, *extra, xattrs)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _data_objects(objects: ObjectStore, key: str) -> list[str]:
    return [k for k in await objects.list(key + "/") if "/data-" in k]


# round trip


async def test_a_hostile_snapshot_dir_round_trips(shared: Shared, tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    make_snapshot_dir(src)
    passwd = _sha256(Path("/etc/passwd"))

    pushed = await shared.snapshots.push("sandboxes/sbx-1", src, {"runtime_hash": "abc", "n": 1})
    assert pushed.key == "sandboxes/sbx-1" and pushed.meta == {"runtime_hash": "abc", "n": 1}
    assert pushed.data_object.startswith("sandboxes/sbx-1/data-") and pushed.data_object.endswith(".tar")
    assert pushed.size < 8 * MiB, "the sparse file's 64 MiB hole was packed as data"

    pulled = await shared.reader().pull("sandboxes/sbx-1", dest)
    assert pulled == pushed
    assert describe(dest) == describe(src)
    assert os.readlink(dest / "upper" / "etc" / "passwd-link") == "/etc/passwd"
    assert (dest / "upper" / "hostetc").is_symlink()
    assert os.lstat(dest / "upper" / "var" / "sparse.img").st_blocks * 512 < 4 * MiB, "holes were filled"
    assert _sha256(Path("/etc/passwd")) == passwd


async def test_the_manifest_is_verified_and_listed(shared: Shared, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_snapshot_dir(src)
    await shared.snapshots.push("sandboxes/a", src, {"x": 1})
    await shared.snapshots.push("snapshots/b", src, {"x": 2})
    manifest = await shared.reader().manifest("sandboxes/a")
    assert manifest is not None and manifest.meta == {"x": 1}
    assert await shared.snapshots.manifest("sandboxes/none") is None
    assert [m.key for m in await shared.snapshots.list("")] == ["sandboxes/a", "snapshots/b"]
    assert [m.key for m in await shared.snapshots.list("snapshots/")] == ["snapshots/b"]
    raw = await shared.objects.get_bytes("sandboxes/a/manifest.json", max_bytes=MiB)
    assert raw is not None and BundleManifest.decode(raw) == manifest


# integrity


async def test_a_flipped_byte_in_the_data_is_refused(shared: Shared, tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    make_snapshot_dir(src)
    pushed = await shared.snapshots.push("k", src, {})
    copy = tmp_path / "copy.tar"
    await shared.objects.get_file(pushed.data_object, copy, max_bytes=pushed.size)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))
    await shared.objects.put_file(pushed.data_object, copy)

    with pytest.raises(BundleError, match="checksum"):
        await shared.reader().pull("k", dest)
    assert os.listdir(dest) == []


async def test_a_data_object_larger_than_its_manifest_says_is_refused(shared: Shared, tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    make_snapshot_dir(src)
    pushed = await shared.snapshots.push("k", src, {})
    bigger = tmp_path / "bigger.tar"
    await shared.objects.get_file(pushed.data_object, bigger, max_bytes=pushed.size)
    bigger.write_bytes(bigger.read_bytes() + b"\0" * 10240)
    await shared.objects.put_file(pushed.data_object, bigger)
    with pytest.raises(BundleError):
        await shared.reader().pull("k", dest)
    assert os.listdir(dest) == []


@pytest.mark.parametrize("tamper", ["meta", "size", "key", "garbage", "magic"])
async def test_a_tampered_manifest_is_refused(shared: Shared, tmp_path: Path, tamper: str) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    make_snapshot_dir(src)
    await shared.snapshots.push("k", src, {"runtime_hash": "abc"})
    raw = await shared.objects.get_bytes("k/manifest.json", max_bytes=MiB)
    assert raw is not None
    doc = json.loads(raw)
    if tamper == "meta":
        doc["bundle"]["meta"]["runtime_hash"] = "evil"  # checksum not updated
    elif tamper == "size":
        doc["bundle"]["size"] += 1
    elif tamper == "magic":
        doc["magic"] = "something-else"
    elif tamper == "key":  # a valid manifest of another key copied here
        other = BundleManifest(**{**BundleManifest.decode(raw).__dict__, "key": "other"})
        doc = json.loads(other.encode())
    new = b"{not json" if tamper == "garbage" else json.dumps(doc).encode()
    await shared.objects.put_bytes("k/manifest.json", new)

    with pytest.raises(BundleError):
        await shared.reader().pull("k", dest)
    assert os.listdir(dest) == []
    with pytest.raises(BundleError):
        await shared.snapshots.manifest("k")
    assert await shared.snapshots.list("") == []  # skipped (and logged)


async def test_data_without_a_manifest_is_invisible(shared: Shared, tmp_path: Path) -> None:
    (tmp_path / "half.tar").write_bytes(b"a data object whose push never finished")
    await shared.objects.put_file("k/data-0123456789abcdef.tar", tmp_path / "half.tar")
    dest = tmp_path / "dest"
    dest.mkdir()
    assert await shared.snapshots.manifest("k") is None
    assert await shared.snapshots.list("") == []
    with pytest.raises(NotFoundError):
        await shared.snapshots.pull("k", dest)
    assert os.listdir(dest) == []


async def test_a_hostile_archive_cannot_write_outside_dest(shared: Shared, tmp_path: Path) -> None:
    """A store writer that is not warren (anyone with write access to the bucket) crafts an archive
    with a valid manifest: a symlink out of dest, then a file through it, and a ``..`` member."""
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w", format=tarfile.PAX_FORMAT) as tar:
        link = tarfile.TarInfo("./esc")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        for name in ("./esc/pwned", "../pwned-too"):
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"owned"))
    data = evil.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    manifest = BundleManifest("k", "k/data-feedfacefeedface.tar", digest, len(data), created_at=1.0, meta={})
    await shared.objects.put_file(manifest.data_object, evil)
    await shared.objects.put_bytes("k/manifest.json", manifest.encode())
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(BundleError):
        await shared.snapshots.pull("k", dest)
    assert os.listdir(dest) == []
    assert os.listdir(outside) == []
    assert not (tmp_path / "pwned-too").exists()


# overwrite, delete


class GatedStore:
    """An ObjectStore that holds the first download of a data object until ``gate`` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()
        self.hold_puts = False
        self.downloads: list[str] = []

    async def put_file(self, key: str, src: Path) -> None:
        if self.hold_puts:
            self.waiting.set()
            await self.gate.wait()
        await self.inner.put_file(key, src)

    async def put_bytes(self, key: str, data: bytes) -> None:
        await self.inner.put_bytes(key, data)

    async def get_file(self, key: str, dest: Path, *, max_bytes: int) -> None:
        self.downloads.append(key)
        if not self.gate.is_set() and not self.hold_puts:
            self.waiting.set()
            await self.gate.wait()
        await self.inner.get_file(key, dest, max_bytes=max_bytes)

    async def get_bytes(self, key: str, *, max_bytes: int) -> bytes | None:
        return await self.inner.get_bytes(key, max_bytes=max_bytes)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await self.inner.list(prefix)


async def test_overwriting_a_key_while_it_is_pulled(shared: Shared, tmp_path: Path) -> None:
    v1, v2, dest = tmp_path / "v1", tmp_path / "v2", tmp_path / "dest"
    for d in (v1, v2, dest):
        d.mkdir()
    make_snapshot_dir(v1, "v1")
    make_snapshot_dir(v2, "v2")
    first = await shared.snapshots.push("sandboxes/s", v1, {"v": 1})
    gated = GatedStore(shared.objects)
    reader = shared.reader(gated)

    async with asyncio.TaskGroup() as tg:
        pulling = tg.create_task(reader.pull("sandboxes/s", dest))
        await gated.waiting.wait()  # the reader has the v1 manifest and is about to download v1's data
        second = await shared.snapshots.push("sandboxes/s", v2, {"v": 2})  # the same sandbox parked again
        gated.gate.set()
    got = pulling.result()
    assert got == second
    assert gated.downloads == [first.data_object, second.data_object]  # v1's data vanished: read v2's
    assert describe(dest) == describe(v2)
    assert await _data_objects(shared.objects, "sandboxes/s") == [second.data_object]  # v1's data is gone


async def test_delete_removes_the_bundle_at_once(shared: Shared, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_snapshot_dir(src)
    await shared.snapshots.push("k", src, {})
    await shared.snapshots.push("k/nested", src, {})
    await shared.snapshots.delete("k")
    assert await shared.snapshots.manifest("k") is None
    assert await shared.objects.list("k/") == [k for k in await shared.objects.list("k/") if k.startswith("k/nested/")]
    assert [m.key for m in await shared.snapshots.list("")] == ["k/nested"]  # another key is not touched
    await shared.snapshots.delete("k")  # idempotent
    await shared.snapshots.delete("never-was")


async def test_a_cancelled_push_leaves_nothing(shared: Shared, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_snapshot_dir(src)
    gated = GatedStore(shared.objects)
    gated.hold_puts = True
    writer = shared.reader(gated)
    task = asyncio.ensure_future(writer.push("k", src, {}))
    await gated.waiting.wait()  # packed and hashed, uploading
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await shared.snapshots.manifest("k") is None  # and the fixture finds scratch empty


async def test_a_cancelled_pull_leaves_dest_and_scratch_empty(shared: Shared, tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    make_snapshot_dir(src)
    await shared.snapshots.push("k", src, {})
    gated = GatedStore(shared.objects)
    task = asyncio.ensure_future(shared.reader(gated).pull("k", dest))
    await gated.waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert os.listdir(dest) == []  # and the fixture finds scratch empty


# object stores


async def test_objects_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    assert await store.get_bytes("a/b", max_bytes=10) is None
    with pytest.raises(NotFoundError):
        await store.get_file("a/b", tmp_path / "x", max_bytes=10)
    assert not (tmp_path / "x").exists()
    await store.put_bytes("a/b", b"hello")
    await store.put_bytes("a/b", b"hello again")  # overwrite
    assert await store.get_bytes("a/b", max_bytes=100) == b"hello again"
    (tmp_path / "f").write_bytes(b"file data")
    await store.put_file("a/c/d", tmp_path / "f")
    await store.put_file("ab", tmp_path / "f")
    await store.get_file("a/c/d", tmp_path / "g", max_bytes=9)
    assert (tmp_path / "g").read_bytes() == b"file data"
    assert sorted(await store.list("")) == ["a/b", "a/c/d", "ab"]
    assert sorted(await store.list("a")) == ["a/b", "a/c/d", "ab"]
    assert sorted(await store.list("a/")) == ["a/b", "a/c/d"]
    assert await store.list("zz/") == []
    await store.delete("a/b")
    await store.delete("a/b")  # idempotent
    assert sorted(await store.list("")) == ["a/c/d", "ab"]


async def test_an_oversize_object_is_refused(store: ObjectStore, tmp_path: Path) -> None:
    await store.put_bytes("big", b"x" * 1000)
    with pytest.raises(ObjectTooLargeError):
        await store.get_bytes("big", max_bytes=999)
    with pytest.raises(ObjectTooLargeError):
        await store.get_file("big", tmp_path / "big", max_bytes=999)
    assert not (tmp_path / "big").exists()
    assert await store.get_bytes("big", max_bytes=1000) == b"x" * 1000


async def test_a_cancelled_transfer_stops_and_cleans_up(store: ObjectStore, tmp_path: Path) -> None:
    """Cancelled mid-download, get_file returns only once its thread stopped and removed the partial file
    (a thread left running would write into scratch after the caller cleaned it); cancelled mid-upload,
    put_file leaves no object."""
    big = tmp_path / "big"
    big.write_bytes(os.urandom(96 * MiB))
    await store.put_file("big", big)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    for _ in range(5):  # a try where the copy finished before the test saw it started proves nothing
        task = asyncio.ensure_future(store.get_file("big", downloads / "copy", max_bytes=96 * MiB))
        while not task.done() and not os.listdir(downloads):  # noqa: ASYNC110 (a file appearing: no event)
            await asyncio.sleep(0.001)
        if task.done():
            await task
            os.unlink(downloads / "copy")
            continue
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert os.listdir(downloads) == []
        break
    else:
        pytest.fail("every download finished before it could be cancelled")

    task = asyncio.ensure_future(store.put_file("up", big))
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert sorted(await store.list("")) in (["big"], ["big", "up"])  # a put is all or nothing
    if "up" in await store.list(""):
        assert await store.get_bytes("up", max_bytes=96 * MiB) == big.read_bytes()


BAD_KEYS = ["", "/abs", "a/../b", "..", ".", "a/./b", "a//b", "a/", "nul\x00byte", "ctl\nchar", ".tmp/x",
            "a/.hidden", "x" * 1025, "back\\slash"]  # fmt: skip


@pytest.mark.parametrize("key", BAD_KEYS, ids=lambda k: repr(k)[:20])
async def test_bad_keys_are_refused(shared: Shared, tmp_path: Path, key: str) -> None:
    store = shared.objects
    (tmp_path / "f").write_bytes(b"x")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put_bytes(key, b"x"),
        lambda: store.put_file(key, tmp_path / "f"),
        lambda: store.get_bytes(key, max_bytes=10),
        lambda: store.get_file(key, tmp_path / "g", max_bytes=10),
        lambda: store.delete(key),
        lambda: shared.snapshots.push(key, tmp_path, {}),
        lambda: shared.snapshots.pull(key, tmp_path / "g"),
        lambda: shared.snapshots.manifest(key),
        lambda: shared.snapshots.delete(key),
    ]
    for call in calls:
        with pytest.raises(InvalidRequestError):
            await call()
    if key:  # an empty prefix lists everything
        with pytest.raises(InvalidRequestError):
            await store.list(key if not key.endswith("/") else "../")
    assert await store.list("") == []


# backend specifics


async def test_the_dir_store_never_follows_a_symlink(tmp_path: Path) -> None:
    root, outside = tmp_path / "mount", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    store = DirObjectStore(root)
    await store.put_bytes("ok", b"1")
    os.symlink(outside, root / "link")
    os.symlink(outside / "secret", root / "file-link")
    with pytest.raises(HostError):
        await store.put_bytes("link/x", b"through a symlink")
    with pytest.raises(HostError):
        await store.get_bytes("link/secret", max_bytes=100)
    with pytest.raises(HostError):
        await store.get_bytes("file-link", max_bytes=100)
    with pytest.raises(HostError):
        await store.get_file("file-link", tmp_path / "copy", max_bytes=100)
    assert await store.list("") == ["ok"]
    await store.delete("file-link")  # a symlink is removed as a name, its target untouched
    assert sorted(os.listdir(outside)) == ["secret"]
    assert sorted(os.listdir(root / ".tmp")) == []


async def test_the_dir_store_writes_durably_through_a_temp_file(tmp_path: Path) -> None:
    store = DirObjectStore(tmp_path / "mount")
    (tmp_path / "f").write_bytes(b"data")
    await store.put_file("x/y", tmp_path / "f")
    st = os.stat(tmp_path / "mount" / "x" / "y")
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
    assert os.listdir(tmp_path / "mount" / ".tmp") == []
    await store.delete("x/y")
    assert os.listdir(tmp_path / "mount") == [".tmp"]  # emptied parents go too


async def test_s3_multipart_upload_and_paginated_list(s3_server: S3Server, s3_env: None, tmp_path: Path) -> None:
    bucket = s3_server.make_bucket()
    store = S3ObjectStore(bucket, endpoint_url=s3_server.endpoint, multipart_threshold=5 * MiB, list_page_size=2)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(12 * MiB))
    await store.put_file("big", big)
    await store.get_file("big", tmp_path / "back", max_bytes=12 * MiB)
    assert _sha256(tmp_path / "back") == _sha256(big)
    for i in range(5):
        await store.put_bytes(f"p/{i}", b"")
    assert sorted(await store.list("p/")) == [f"p/{i}" for i in range(5)]


async def test_s3_prefix_keeps_stores_apart(s3_server: S3Server, s3_env: None) -> None:
    bucket = s3_server.make_bucket()
    one = S3ObjectStore(bucket, "one", endpoint_url=s3_server.endpoint)
    two = S3ObjectStore(bucket, "/two/", endpoint_url=s3_server.endpoint)
    await one.put_bytes("k", b"1")
    assert await two.get_bytes("k", max_bytes=10) is None
    assert await one.list("") == ["k"] and await two.list("") == []


async def test_s3_unreachable_is_unavailable(s3_env: None, tmp_path: Path) -> None:
    store = S3ObjectStore("bucket", endpoint_url=f"http://127.0.0.1:{free_port()}")
    (tmp_path / "f").write_bytes(b"x")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put_bytes("k", b"x"),
        lambda: store.put_file("k", tmp_path / "f"),
        lambda: store.get_bytes("k", max_bytes=10),
        lambda: store.get_file("k", tmp_path / "g", max_bytes=10),
        lambda: store.delete("k"),
        lambda: store.list(""),
    ]
    for call in calls:
        with pytest.raises(UnavailableError):
            await call()
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnavailableError):
        await SharedSnapshots(store, tmp_path / "scratch").pull("k", dest)
    assert os.listdir(tmp_path / "scratch") == []


async def test_s3_missing_bucket_is_a_host_error(s3_server: S3Server, s3_env: None) -> None:
    store = S3ObjectStore("no-such-bucket-here", endpoint_url=s3_server.endpoint)
    with pytest.raises(HostError, match="no-such-bucket-here"):
        await store.put_bytes("k", b"x")
