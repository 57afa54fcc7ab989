"""warren.trees on real trees on the real filesystem.

Needs root (chown to other ids, mknod of whiteouts and block devices, ``trusted.*`` xattrs).
"""

from __future__ import annotations

import os
import random
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.deep import make_deep, private_dir
from warren import trees

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tree tests need root")

DEPTH = 100_000
OPAQUE = "trusted.overlay.opaque"


def read_bottom(root: Path, depth: int) -> bytes:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        bfd = os.open("bottom", os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(bfd, 100)
        finally:
            os.close(bfd)
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def deep() -> Iterator[Path]:
    with private_dir() as top:
        root = top / "tree"
        make_deep(root, DEPTH, leaf="bottom", data=b"deep data")
        yield root


@pytest.fixture
def scratch() -> Iterator[Path]:
    with private_dir() as top:
        yield top


def test_walk_of_a_deep_tree_is_iterative_with_few_fds(deep: Path) -> None:
    before = open_fds()
    most = 0
    count = 0
    for visit in trees.walk(deep):
        count += 1
        if count % 1000 == 0:
            most = max(most, open_fds())
        if visit.files:
            assert visit.files == ["bottom"]
            assert visit.depth == DEPTH
    assert count == DEPTH + 1
    assert most <= before + trees.FD_WINDOW + 4
    assert open_fds() == before


def test_bottom_up_walk_of_a_deep_tree(deep: Path) -> None:
    depths = [v.depth for v in trees.walk(deep, topdown=False)]
    assert depths[0] == DEPTH and depths[-1] == 0 and len(depths) == DEPTH + 1


def test_usage_and_fsync_of_a_deep_tree(deep: Path) -> None:
    usage = trees.tree_usage(deep)
    assert usage >= DEPTH * 4096  # every directory takes at least one block on ext4/xfs/tmpfs-less fs
    trees.fsync_tree(deep)  # 4096 fsyncs, then one syncfs
    trees.fsync_tree(deep, max_fsyncs=0)


def test_copy_and_remove_of_a_deep_tree(deep: Path, scratch: Path) -> None:
    copy = scratch / "copy"
    before = open_fds()
    copied = trees.copy_tree(deep, copy)
    assert copied == len(b"deep data")
    assert open_fds() == before
    assert read_bottom(copy, DEPTH) == b"deep data"
    assert sum(1 for _ in trees.walk(copy)) == DEPTH + 1
    trees.remove_tree(copy)
    assert not copy.exists()
    assert open_fds() == before


def test_shift_owner_of_a_deep_tree(deep: Path) -> None:
    assert trees.shift_owner(deep, 1000, 1000, within=range(0, 1)) == DEPTH + 2
    assert trees.shift_owner(deep, -1000, -1000, within=range(1000, 1001)) == DEPTH + 2
    assert all(v.stat.st_uid == 0 for v in trees.walk(deep))


def _random_tree(root: Path, seed: int) -> None:
    """Branches of many depths, files at every level: exercises re-opening parents through ``..``."""
    rng = random.Random(seed)
    root.mkdir()
    dirs = [root]
    for i in range(600):
        parent = rng.choice(dirs[-20:] if rng.random() < 0.7 else dirs)
        if rng.random() < 0.6:
            child = parent / f"d{i}"
            child.mkdir()
            dirs.append(child)
        else:
            (parent / f"f{i}").write_text(f"{i}" * rng.randrange(0, 50))


def _listing(root: Path) -> list[tuple[str, str, bytes]]:
    out = []
    for visit in trees.walk(root):
        for name in visit.dirs:
            out.append((f"{visit.path}/{name}", "d", b""))
        for name in visit.files:
            fd = os.open(name, os.O_RDONLY, dir_fd=visit.fd)
            try:
                out.append((f"{visit.path}/{name}", "f", os.read(fd, 1000)))
            finally:
                os.close(fd)
    return sorted(out)


@pytest.mark.parametrize("window", [2, 3, 7])
def test_branching_trees_with_a_tiny_fd_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int) -> None:
    monkeypatch.setattr(trees._walk, "FD_WINDOW", window)  # read by the walk engine
    src = tmp_path / "src"
    _random_tree(src, seed=window)
    expected = _listing(src)
    assert len(expected) == 600
    before = open_fds()
    trees.copy_tree(src, tmp_path / "dst")
    assert _listing(tmp_path / "dst") == expected
    assert trees.shift_owner(tmp_path / "dst", 7, 7, within=range(0, 1)) == 601
    trees.fsync_tree(tmp_path / "dst")
    assert trees.tree_usage(tmp_path / "dst") > 0
    trees.remove_tree(tmp_path / "dst")
    assert not (tmp_path / "dst").exists() and open_fds() == before


# ------------------------------------------------------------------ symlinks


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "etc").symlink_to("/etc")
    (src / "passwd").symlink_to("/etc/passwd")
    etc_mode = os.stat("/etc").st_mode
    passwd = os.stat("/etc/passwd")

    visit = next(iter(trees.walk(src)))
    assert sorted(visit.other) == ["etc", "passwd"] and visit.dirs == [] and visit.files == []
    assert trees.tree_usage(src) < 64 * 1024
    trees.fsync_tree(src)
    assert trees.shift_owner(src, 5, 5, within=range(0, 1)) == 3
    assert os.stat("/etc/passwd").st_uid == passwd.st_uid == 0

    dst = tmp_path / "dst"
    trees.copy_tree(src, dst)
    assert os.readlink(dst / "etc") == "/etc" and os.readlink(dst / "passwd") == "/etc/passwd"
    assert os.lstat(dst / "passwd").st_uid == 5

    trees.remove_tree(src / "etc")  # a symlink as the root: unlinked, never followed
    trees.remove_tree(dst)
    assert os.path.isdir("/etc") and os.stat("/etc").st_mode == etc_mode
    assert os.stat("/etc/passwd").st_ino == passwd.st_ino
    assert not (src / "etc").exists() and (src / "passwd").is_symlink()


def test_a_symlinked_root_is_refused_by_copy_and_walk(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(OSError):
        trees.copy_tree(tmp_path / "link", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()
    with pytest.raises(OSError):
        list(trees.walk(tmp_path / "link"))


# ------------------------------------------------------------------ copy semantics


def test_hard_links_within_the_tree_are_kept(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_text("shared")
    os.link(src / "a", src / "sub" / "b")
    os.link(src / "a", src / "c")
    (tmp_path / "outside").write_text("x")
    os.link(tmp_path / "outside", src / "lonely")  # its other name is outside the tree

    dst = tmp_path / "dst"
    trees.copy_tree(src, dst)
    a, b, c = (os.stat(dst / n) for n in ("a", "sub/b", "c"))
    assert a.st_ino == b.st_ino == c.st_ino and a.st_nlink == 3
    assert (dst / "sub" / "b").read_text() == "shared"
    assert os.stat(dst / "lonely").st_nlink == 1 and (dst / "lonely").read_text() == "x"


def test_sparse_files_stay_sparse_and_data_is_exact(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "huge", "wb") as f:  # 1 TiB apparent size, two small data extents
        f.write(b"head")
        f.seek(1 << 39)
        f.write(b"middle")
        f.truncate(1 << 40)
    payload = os.urandom(3 * 1024 * 1024 + 17)
    (src / "plain").write_bytes(payload)
    (src / "empty").write_bytes(b"")
    dst = tmp_path / "dst"
    copied = trees.copy_tree(src, dst)
    huge = os.stat(dst / "huge")
    assert huge.st_size == 1 << 40 and huge.st_blocks * 512 < 1 << 20
    with open(dst / "huge", "rb") as f:
        assert f.read(4) == b"head"
        f.seek(1 << 39)
        assert f.read(6) == b"middle"
    assert (dst / "plain").read_bytes() == payload and (dst / "empty").read_bytes() == b""
    assert len(payload) + 10 <= copied < len(payload) + (1 << 20)


def test_hardlink_mode_links_files_and_makes_the_rest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "passwd").write_text("root:x:0:0")
    (src / "bin").symlink_to("usr/bin")
    os.chmod(src / "etc", 0o750)
    dst = tmp_path / "dst"
    assert trees.copy_tree(src, dst, hardlink=True) == 0
    assert os.stat(dst / "etc" / "passwd").st_ino == os.stat(src / "etc" / "passwd").st_ino
    assert os.readlink(dst / "bin") == "usr/bin"
    assert stat.S_IMODE(os.stat(dst / "etc").st_mode) == 0o750
    assert os.stat(dst / "etc").st_ino != os.stat(src / "etc").st_ino


def test_ignore_skips_names_at_every_level(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "__pycache__" / "m.pyc").write_text("")
    (src / "pkg" / "m.py").write_text("x = 1")
    (src / "top.pyc").write_text("")
    dst = tmp_path / "dst"
    trees.copy_tree(src, dst, ignore=lambda n: n == "__pycache__" or n.endswith(".pyc"))
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == ["pkg", "pkg/m.py"]


def test_remove_tree_relative_to_a_dir_fd(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        trees.remove_tree("a", dir_fd=fd)
    finally:
        os.close(fd)
    assert not (tmp_path / "a").exists()


def test_whiteouts_opaque_dirs_and_devices(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "opaque").mkdir(parents=True)
    os.setxattr(src / "opaque", OPAQUE, b"y")
    os.mknod(src / "gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    os.mknod(src / "loop", stat.S_IFBLK | 0o666, os.makedev(7, 0))
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mkfifo(src / "fifo", 0o640)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(src / "sock"))

    dst = tmp_path / "dst"
    trees.copy_tree(src, dst)
    wh = os.lstat(dst / "gone")
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == 0
    assert os.getxattr(dst / "opaque", OPAQUE) == b"y"
    assert stat.S_ISFIFO(os.lstat(dst / "fifo").st_mode) and stat.S_IMODE(os.lstat(dst / "fifo").st_mode) == 0o640
    assert not os.path.lexists(dst / "loop")
    assert not os.path.lexists(dst / "null")
    assert not os.path.lexists(dst / "sock")


def test_modes_times_xattrs_and_owners_are_kept(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "tmp").mkdir(parents=True)
    os.chmod(src / "tmp", 0o1777)
    tool = src / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    os.chown(tool, 0, 0)
    os.chmod(tool, 0o4755)
    capped = src / "capped"
    capped.write_bytes(b"x")
    cap = bytes.fromhex("01000002" + "00200000" + "00000000" + "00000000" + "00000000")  # v2 cap_net_raw
    os.setxattr(capped, "security.capability", cap)
    os.setxattr(capped, "user.note", b"hello")
    (src / "ro").mkdir()
    (src / "ro" / "f").write_text("in a read-only dir")
    os.chown(src / "ro" / "f", 1000, 1001)
    os.chmod(src / "ro", 0o555)
    os.utime(tool, ns=(1_000_000_123, 2_000_000_456))
    os.utime(src / "ro", ns=(3_000_000_789, 4_000_000_012))

    dst = tmp_path / "dst"
    trees.copy_tree(src, dst)
    assert stat.S_IMODE(os.stat(dst / "tmp").st_mode) == 0o1777
    t = os.stat(dst / "tool")
    assert stat.S_IMODE(t.st_mode) == 0o4755 and (t.st_atime_ns, t.st_mtime_ns) == (1_000_000_123, 2_000_000_456)
    assert os.getxattr(dst / "capped", "security.capability") == cap
    assert os.getxattr(dst / "capped", "user.note") == b"hello"
    ro = os.stat(dst / "ro")
    assert stat.S_IMODE(ro.st_mode) == 0o555 and ro.st_mtime_ns == 4_000_000_012
    f = os.stat(dst / "ro" / "f")
    assert (f.st_uid, f.st_gid) == (1000, 1001)
    trees.remove_tree(dst)
    trees.remove_tree(src)
    assert not dst.exists() and not src.exists()


def test_owner_mapping_is_applied_to_every_entry(tmp_path: Path) -> None:
    base = 100_000
    src = tmp_path / "src"
    (src / "home").mkdir(parents=True)
    (src / "home" / "f").write_text("x")
    (src / "link").symlink_to("home/f")
    os.mkfifo(src / "fifo")
    os.mknod(src / "wh", stat.S_IFCHR, 0)
    for path, ids in [(src, (0, 0)), (src / "home", (1000, 1000)), (src / "home" / "f", (1000, 1001))]:
        os.chown(path, base + ids[0], base + ids[1])
    for name in ("link", "fifo", "wh"):
        os.chown(src / name, base + 7, base + 8, follow_symlinks=False)
    setuid = src / "su"
    setuid.write_text("")
    os.chown(setuid, base, base)
    os.chmod(setuid, 0o6755)

    dst = tmp_path / "dst"
    trees.copy_tree(src, dst, owner=lambda u, g: (u - base, g - base))
    owners = {p: (os.lstat(dst / p).st_uid, os.lstat(dst / p).st_gid)
              for p in (".", "home", "home/f", "link", "fifo", "wh", "su")}
    assert owners == {".": (0, 0), "home": (1000, 1000), "home/f": (1000, 1001), "link": (7, 8),
                      "fifo": (7, 8), "wh": (7, 8), "su": (0, 0)}
    assert stat.S_IMODE(os.stat(dst / "su").st_mode) == 0o6755


def test_shift_owner_maps_only_the_range_and_keeps_setuid_and_caps(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    (root / "bin").mkdir(parents=True)
    ping = root / "bin" / "ping"
    ping.write_text("")
    cap = bytes.fromhex("01000002" + "00200000" + "00000000" + "00000000" + "00000000")
    os.setxattr(ping, "security.capability", cap)
    su = root / "bin" / "su"
    su.write_text("")
    os.chmod(su, 0o4755)
    (root / "nobody").write_text("")
    os.chown(root / "nobody", 65534, 70000)
    (root / "link").symlink_to("/etc/passwd")

    base = 200_000
    changed = trees.shift_owner(root, base, base, within=range(0, 65536))
    assert changed == 6  # root, bin, ping, su, nobody (uid only), link
    assert (os.stat(root).st_uid, os.stat(su).st_uid) == (base, base)
    assert (os.stat(root / "nobody").st_uid, os.stat(root / "nobody").st_gid) == (base + 65534, 70000)
    assert os.lstat(root / "link").st_uid == base and os.stat("/etc/passwd").st_uid == 0
    assert stat.S_IMODE(os.stat(su).st_mode) == 0o4755
    assert os.getxattr(ping, "security.capability") == cap

    trees.shift_owner(root, -base, -base, within=range(base, base + 65536))
    assert os.stat(su).st_uid == 0 and os.stat(root / "nobody").st_uid == 65534
    with pytest.raises(ValueError):
        trees.shift_owner(root, -1, -1, within=range(0, 1))


# ------------------------------------------------------------------ failures leave nothing


def _tree_of(n: int, root: Path) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"f{i:03d}").write_text(str(i))
    return root


def test_a_failing_owner_map_leaves_no_dst(tmp_path: Path) -> None:
    src = _tree_of(20, tmp_path / "src")
    os.chown(src / "f010", 4242, 4242)

    def owner(uid: int, gid: int) -> tuple[int, int]:
        if uid == 4242:
            raise ValueError("uid outside the range")
        return uid, gid

    with pytest.raises(ValueError):
        trees.copy_tree(src, tmp_path / "dst", owner=owner)
    assert not (tmp_path / "dst").exists()


def test_too_many_entries_and_cancel_leave_no_dst(tmp_path: Path) -> None:
    src = _tree_of(20, tmp_path / "src")
    with pytest.raises(trees.TreeLimitExceeded):
        trees.copy_tree(src, tmp_path / "dst", max_entries=10)
    assert not (tmp_path / "dst").exists()
    assert trees.copy_tree(src, tmp_path / "dst", max_entries=20) > 0

    cancel = threading.Event()
    cancel.set()
    (tmp_path / "empty").mkdir()
    with pytest.raises(trees.CopyCancelled):
        trees.copy_tree(src, tmp_path / "empty", cancel=cancel)
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


def test_a_non_empty_dst_is_refused_and_kept(tmp_path: Path) -> None:
    src = _tree_of(2, tmp_path / "src")
    dst = _tree_of(1, tmp_path / "dst")
    with pytest.raises(FileExistsError):
        trees.copy_tree(src, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["f000"]


def test_an_entry_vanishing_midway_removes_the_partial_copy(tmp_path: Path) -> None:
    """A file that vanishes between listing and copying: the copy fails and leaves nothing."""
    src = _tree_of(5, tmp_path / "src")
    sub = src / "zz"
    sub.mkdir()
    for name in ("x", "y"):
        (sub / name).write_text(name)
        os.chown(sub / name, 4242, 4242)

    def owner(uid: int, gid: int) -> tuple[int, int]:
        if uid == 4242:
            for name in ("x", "y"):
                (sub / name).unlink(missing_ok=True)
        return uid, gid

    with pytest.raises(FileNotFoundError):
        trees.copy_tree(src, tmp_path / "dst", owner=owner)
    assert not (tmp_path / "dst").exists()


# ------------------------------------------------------------------ remove, walk, quarantine


def test_remove_tree_missing_file_and_read_only(tmp_path: Path) -> None:
    trees.remove_tree(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    trees.remove_tree(tmp_path / "file")
    ro = tmp_path / "ro"
    (ro / "a" / "b").mkdir(parents=True)
    (ro / "a" / "b" / "f").write_text("x")
    for p in (ro / "a" / "b", ro / "a", ro):
        os.chmod(p, 0o500)
    trees.remove_tree(ro)
    assert list(tmp_path.iterdir()) == []


def test_remove_tree_refuses_a_mount_inside(tmp_path: Path) -> None:
    inner = tmp_path / "t" / "mnt"
    inner.mkdir(parents=True)
    if os.system(f"mount -t tmpfs tmpfs {inner}") != 0:
        pytest.skip("cannot mount tmpfs")
    try:
        (inner / "precious").write_text("x")
        with pytest.raises(OSError, match=r"other filesystem|mount point"):
            trees.remove_tree(tmp_path / "t")
        assert (inner / "precious").exists()
    finally:
        os.system(f"umount {inner}")
    trees.remove_tree(tmp_path / "t")


def test_walk_prunes_top_down_and_lists_kinds(tmp_path: Path) -> None:
    (tmp_path / "a" / "skip" / "deeper").mkdir(parents=True)
    (tmp_path / "a" / "keep").mkdir()
    (tmp_path / "a" / "f").write_text("")
    (tmp_path / "a" / "l").symlink_to("keep")
    seen = []
    for visit in trees.walk(tmp_path / "a"):
        seen.append(visit.path)
        if "skip" in visit.dirs:
            visit.dirs.remove("skip")
            assert visit.files == ["f"] and visit.other == ["l"]
    assert sorted(seen) == ["", "keep"]
    assert list(trees.walk(tmp_path / "missing")) == []


def test_move_aside(tmp_path: Path) -> None:
    junk = tmp_path / "sandboxes" / "ibogus"
    junk.mkdir(parents=True)
    (junk / "sandbox.json").write_text("{not json")
    moved = trees.move_aside(junk, tmp_path / "quarantine", "unreadable record")
    assert moved is not None and moved.parent == tmp_path / "quarantine" and moved.name.endswith("-ibogus")
    assert (moved / "sandbox.json").read_text() == "{not json" and not junk.exists()
    assert stat.S_IMODE(os.stat(tmp_path / "quarantine").st_mode) == 0o700
    assert trees.move_aside(junk, tmp_path / "quarantine", "gone") is None
    junk.mkdir()
    second = trees.move_aside(junk, tmp_path / "quarantine", "again")
    assert second is not None and second != moved
