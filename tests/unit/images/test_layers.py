"""Layer unpacking: whiteouts, opaque dirs, attributes, and refusal of unsafe tars.

Needs root (chown, mknod of whiteouts, ``trusted.*`` xattrs).
"""

from __future__ import annotations

import gzip
import os
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from tests.framework.images import Layer, make_layer, member, opaque, sha256, whiteout
from warren.images.errors import DigestMismatchError, UnsafeLayerError, UnsupportedImageError
from warren.images.layers import OPAQUE_XATTR, UnpackCancelled, unpack_layer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unpacking layers needs root")

DIR, SYM, LNK, CHR, BLK, FIFO = (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                                 tarfile.BLKTYPE, tarfile.FIFOTYPE)  # fmt: skip


def _unpack(tmp_path: Path, layer: Layer, diff_id: str | None = None) -> Path:
    blob = tmp_path / "blob"
    blob.write_bytes(layer.blob)
    dest = tmp_path / "layer"
    unpack_layer(blob, dest, diff_id or layer.diff_id)
    return dest


def test_unpacks_files_links_modes_and_owners(tmp_path: Path) -> None:
    layer = make_layer(
        [
            member("./", kind=DIR, mode=0o755),
            member("etc", kind=DIR, mode=0o750, uid=0, gid=5),
            member("etc/hosts", b"127.0.0.1 localhost\n", mode=0o644, uid=1000, gid=1000),
            member("usr/bin/sudo", b"#!", mode=0o4755),  # parent dirs not in the tar
            member("bin", kind=SYM, linkname="usr/bin"),
            member("abs", kind=SYM, linkname="/etc/hosts"),  # absolute targets are fine: never followed
            member("etc/hosts.hard", kind=LNK, linkname="etc/hosts"),
            member("run/fifo", kind=FIFO, mode=0o600),
            member(
                "etc/x", b"caps", pax={"SCHILY.xattr.user.note": "hi", "SCHILY.xattr.trusted.overlay.redirect": "/"}
            ),
        ]
    )
    dest = _unpack(tmp_path, layer)
    hosts = (dest / "etc/hosts").lstat()
    assert (dest / "etc/hosts").read_bytes() == b"127.0.0.1 localhost\n"
    assert (hosts.st_uid, hosts.st_gid, stat.S_IMODE(hosts.st_mode)) == (1000, 1000, 0o644)
    assert hosts.st_mtime == 1_700_000_000
    assert stat.S_IMODE((dest / "etc").lstat().st_mode) == 0o750 and (dest / "etc").lstat().st_gid == 5
    assert stat.S_IMODE((dest / "usr/bin/sudo").lstat().st_mode) == 0o4755
    assert os.readlink(dest / "bin") == "usr/bin" and os.readlink(dest / "abs") == "/etc/hosts"
    assert (dest / "etc/hosts.hard").lstat().st_ino == hosts.st_ino
    assert stat.S_ISFIFO((dest / "run/fifo").lstat().st_mode)
    assert os.getxattr(dest / "etc/x", "user.note") == b"hi"
    assert "trusted.overlay.redirect" not in os.listxattr(dest / "etc/x")


def test_whiteouts_become_overlay_whiteouts(tmp_path: Path) -> None:
    layer = make_layer([whiteout("etc/gone"), opaque("opt/o"), member("opt/o/new", b"n"), member(".wh..wh.plnk", b"")])
    dest = _unpack(tmp_path, layer)
    st = (dest / "etc/gone").lstat()
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert os.getxattr(dest / "opt/o", OPAQUE_XATTR) == b"y"
    assert (dest / "opt/o/new").read_bytes() == b"n"
    assert not (dest / "opt/o/.wh..wh..opq").exists() and not (dest / ".wh..wh.plnk").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["etc", "opt"]


def test_later_member_replaces_earlier(tmp_path: Path) -> None:
    layer = make_layer([member("a", b"1"), member("a", b"2"), member("d/f", b"x"), member("d", b"now a file")])
    dest = _unpack(tmp_path, layer)
    assert (dest / "a").read_bytes() == b"2"
    assert (dest / "d").read_bytes() == b"now a file"


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ([member("../escape", b"x")], r"'\.\.'"),
        ([member("a/../../escape", b"x")], r"'\.\.'"),
        ([member("/etc/passwd", b"x")], "absolute"),
        ([member("link", kind=SYM, linkname="{target}"), member("link/pwned", b"x")], "symlink"),
        ([member("up", kind=SYM, linkname="../../../.."), member("up/pwned", b"x")], "symlink"),
        (
            [member("d", kind=DIR), member("d/link", kind=SYM, linkname="{target}"), member("d/link/x/y", b"x")],
            "symlink",
        ),
        ([member("link", kind=SYM, linkname="{target}"), whiteout("link/victim")], "symlink"),
        ([member("link", kind=SYM, linkname="{target}"), opaque("link")], "symlink"),
        ([member("hard", kind=LNK, linkname="../outside")], r"'\.\.'"),
        ([member("hard", kind=LNK, linkname="/etc/passwd")], "absolute"),
        ([member("hard", kind=LNK, linkname="missing")], "earlier member"),
        ([member("link", kind=SYM, linkname="{target}"), member("hard", kind=LNK, linkname="link/victim")], "symlink"),
        ([member("f", b"x"), member("f/g", b"y")], "not a directory"),
    ],
)
def test_unsafe_layers_are_refused_and_leave_nothing(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], match: str
) -> None:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "victim").write_text("keep me")
    for info, _ in members:
        info.linkname = info.linkname.replace("{target}", str(target))
    with pytest.raises(UnsafeLayerError, match=match):
        _unpack(tmp_path, make_layer(members))
    assert not (tmp_path / "layer").exists()
    assert sorted(p.name for p in target.iterdir()) == ["victim"]
    assert (target / "victim").read_text() == "keep me"
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_diff_id_mismatch(tmp_path: Path) -> None:
    layer = make_layer([member("f", b"x")])
    with pytest.raises(DigestMismatchError, match="diffID"):
        _unpack(tmp_path, layer, diff_id=sha256(b"something else"))
    assert not (tmp_path / "layer").exists()


def test_plain_tar_layer(tmp_path: Path) -> None:
    layer = make_layer([member("f", b"plain")])
    plain = Layer(gzip.decompress(layer.blob), layer.diff_id)
    assert (_unpack(tmp_path, plain) / "f").read_bytes() == b"plain"


_GOOD = make_layer([member("f", b"x" * 5000)])


@pytest.mark.parametrize(
    ("blob", "error"),
    [
        (b"\x28\xb5\x2f\xfd" + b"\0" * 100, UnsupportedImageError),
        (b"garbage" * 100, UnsafeLayerError),
        (_GOOD.blob[: len(_GOOD.blob) // 2], UnsafeLayerError),
    ],
    ids=["zstd", "garbage", "truncated-gzip"],
)
def test_undecodable_layers(tmp_path: Path, blob: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        _unpack(tmp_path, Layer(blob, _GOOD.diff_id))
    assert not (tmp_path / "layer").exists()


def test_cancel_stops_and_cleans_up(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    layer = make_layer([member(f"f{i}", b"x") for i in range(50)])
    blob.write_bytes(layer.blob)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(UnpackCancelled):
        unpack_layer(blob, tmp_path / "layer", layer.diff_id, cancel)
    assert not (tmp_path / "layer").exists()
