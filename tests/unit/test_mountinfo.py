"""warren.mountinfo: the one mountinfo parser, on tables written as the kernel writes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warren.mountinfo import Mount, parse_mounts, points_under, read_mounts, unescape

TABLE = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:5 / /build/root rw - tmpfs tmpfs rw
31 30 0:6 / /build/root/proc rw - proc proc rw
33 22 0:8 / /build/rootfs2 rw - tmpfs tmpfs rw
34 22 0:9 / /build/with\\040space/proc rw - proc proc rw
75 49 0:39 / /s/sb1/rootfs rw shared:5 master:2 - overlay overlay \
rw,lowerdir=/l/top:/l/my\\040base,upperdir=/s/a\\054b/upper,workdir=/w
40 22 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
41 22 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
"""


def test_parse_reads_every_field_and_unescapes_them() -> None:
    mounts = parse_mounts(TABLE)
    assert [m.point for m in mounts][:3] == [Path("/"), Path("/build/root"), Path("/build/root/proc")]
    overlay = mounts[5]
    assert (overlay.point, overlay.fstype, overlay.source) == (Path("/s/sb1/rootfs"), "overlay", "overlay")
    assert overlay.option("lowerdir") == "/l/top:/l/my base"
    assert overlay.option("upperdir") == "/s/a,b/upper"  # an escaped comma does not split the options
    assert overlay.option("rw") == ""
    assert overlay.option("missing") is None
    assert mounts[6].super_options == ("rw", "cpu", "cpuacct")
    assert mounts[7].fstype == "cgroup2"


def test_parse_skips_malformed_lines() -> None:
    assert parse_mounts("\n1 2 3\n30 22 0:5 / /only-head rw\n") == [
        Mount(point=Path("/only-head"), fstype="", source="", super_options=())
    ]


@pytest.mark.parametrize(
    ("field", "text"),
    [("a\\040b", "a b"), ("t\\011ab", "t\tab"), ("n\\012l", "n\nl"), ("b\\134s", "b\\s"), ("plain", "plain")],
)
def test_unescape(field: str, text: str) -> None:
    assert unescape(field) == text


def test_points_under_ignores_prefix_siblings_and_keeps_table_order() -> None:
    mounts = parse_mounts(TABLE)
    assert points_under(Path("/build/root"), mounts) == [Path("/build/root"), Path("/build/root/proc")]
    assert points_under("/build/root/", mounts) == [Path("/build/root"), Path("/build/root/proc")]
    assert points_under(Path("/build/with space"), mounts) == [Path("/build/with space/proc")]
    assert points_under(Path("/"), mounts) == [m.point for m in mounts]
    assert points_under(Path("/nowhere"), mounts) == []


def test_read_mounts_decodes_undecodable_names_as_the_filesystem_does(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_bytes(b"30 22 0:5 / /st\xffate rw - tmpfs tmpfs rw\n")
    assert [m.point for m in read_mounts(table)] == [Path(os.fsdecode(b"/st\xffate"))]
    with pytest.raises(OSError):
        read_mounts(tmp_path / "missing")


def test_read_mounts_reads_this_process_table() -> None:
    assert Path("/") in {m.point for m in read_mounts()}
