"""Device nodes in image layers are dropped and reported, not refused (as rootless container engines do).

Images made from debootstrap trees carry ``/dev/console`` and friends; a sandbox gets its own ``/dev``
anyway. Needs root (the unpacker chowns and makes whiteouts).
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from tests.framework.images import make_layer, member
from warren.images.layers import describe_dropped, unpack_layer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unpacking layers needs root")


def device(name: str, kind: bytes, major: int, minor: int) -> tuple[tarfile.TarInfo, bytes | None]:
    info, data = member(name, kind=kind, mode=0o600)
    info.devmajor, info.devminor = major, minor
    return info, data


def _unpack(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> tuple[Path, list[str]]:
    layer = make_layer(members)
    blob = tmp_path / "blob"
    blob.write_bytes(layer.blob)
    dest = tmp_path / "layer"
    return dest, unpack_layer(blob, dest, layer.diff_id)


def test_debootstrap_dev_is_dropped_and_the_rest_unpacked(tmp_path: Path) -> None:
    dest, dropped = _unpack(
        tmp_path,
        [
            member("dev", kind=tarfile.DIRTYPE, mode=0o755),
            device("dev/console", tarfile.CHRTYPE, 5, 1),
            device("dev/null", tarfile.CHRTYPE, 1, 3),
            device("dev/sda", tarfile.BLKTYPE, 8, 0),
            member("dev/fd", kind=tarfile.SYMTYPE, linkname="/proc/self/fd"),
            member("dev/tty0", kind=tarfile.LNKTYPE, linkname="dev/console"),
            member("etc/hostname", b"deb\n"),
        ],
    )
    assert dropped == ["dev/console", "dev/null", "dev/sda", "dev/tty0"]
    assert sorted(p.name for p in (dest / "dev").iterdir()) == ["fd"]
    assert (dest / "etc/hostname").read_bytes() == b"deb\n"
    assert not any(stat.S_ISCHR(p.lstat().st_mode) or stat.S_ISBLK(p.lstat().st_mode) for p in dest.rglob("*"))


def test_device_without_its_parent_creates_nothing(tmp_path: Path) -> None:
    dest, dropped = _unpack(tmp_path, [device("dev/pts/ptmx", tarfile.CHRTYPE, 5, 2), member("a", b"1")])
    assert dropped == ["dev/pts/ptmx"]
    assert sorted(p.name for p in dest.iterdir()) == ["a"]


def test_a_device_replaces_an_earlier_member_and_a_later_file_replaces_it(tmp_path: Path) -> None:
    dest, dropped = _unpack(
        tmp_path,
        [
            member("x", b"old"),
            device("x", tarfile.CHRTYPE, 1, 3),
            device("y", tarfile.CHRTYPE, 1, 5),
            member("y", b"file"),
            member("z", kind=tarfile.LNKTYPE, linkname="y"),
        ],
    )
    assert dropped == ["x", "y"]
    assert not (dest / "x").exists()
    assert (dest / "z").read_bytes() == b"file" and (dest / "z").stat().st_ino == (dest / "y").stat().st_ino


def test_layers_without_devices_report_nothing(tmp_path: Path) -> None:
    _, dropped = _unpack(tmp_path, [member("a", b"1")])
    assert dropped == []


def test_the_warning_names_them() -> None:
    assert describe_dropped(["dev/console"]) == (
        "1 device node not created (sandboxes get their own /dev): dev/console"
    )
    many = describe_dropped([f"dev/tty{i}" for i in range(20)])
    assert many.startswith("20 device nodes not created") and "dev/tty7" in many and "dev/tty8" not in many
    assert many.endswith("and 12 more")
