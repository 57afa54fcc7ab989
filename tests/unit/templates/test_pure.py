"""Pure helpers of warren.templates: ELF sniffing, mountinfo parsing, names, template metadata."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from warren.errors import InvalidRequestError, NotFoundError
from warren.templates import TemplateInfo, load_template_info
from warren.templates._fs import mountpoints_under
from warren.templates.busybox import is_static_elf
from warren.templates.importer import resolve_rootfs, slugify

_PT_LOAD, _PT_INTERP = 1, 3


def _elf64(path: Path, program_types: list[int]) -> Path:
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, 0, 64, 0, 0, 64, 56, len(program_types), 0, 0, 0)
    table = b"".join(struct.pack("<II", t, 0) + bytes(48) for t in program_types)
    path.write_bytes(header + table)
    return path


def _elf32(path: Path, program_types: list[int]) -> Path:
    header = b"\x7fELF" + bytes([1, 1, 1]) + bytes(9)
    header += struct.pack("<HHIIIIIHHHHHH", 2, 3, 1, 0, 52, 0, 0, 52, 32, len(program_types), 0, 0, 0)
    table = b"".join(struct.pack("<I", t) + bytes(28) for t in program_types)
    path.write_bytes(header + table)
    return path


def test_static_elf_has_no_interpreter(tmp_path: Path) -> None:
    assert is_static_elf(_elf64(tmp_path / "s64", [_PT_LOAD, _PT_LOAD]))
    assert is_static_elf(_elf32(tmp_path / "s32", [_PT_LOAD]))


def test_dynamic_elf_has_an_interpreter(tmp_path: Path) -> None:
    assert not is_static_elf(_elf64(tmp_path / "d64", [_PT_LOAD, _PT_INTERP]))
    assert not is_static_elf(_elf32(tmp_path / "d32", [_PT_INTERP, _PT_LOAD]))


def test_non_elf_is_not_static(tmp_path: Path) -> None:
    (tmp_path / "script").write_text("#!/bin/sh\n")
    (tmp_path / "short").write_bytes(b"\x7fELF")
    assert not is_static_elf(tmp_path / "script")
    assert not is_static_elf(tmp_path / "short")
    assert not is_static_elf(tmp_path / "missing")


MOUNTINFO = """\
22 1 8:1 / / rw shared:1 - ext4 /dev/vda rw
30 22 0:5 / /build/root rw - tmpfs tmpfs rw
31 30 0:6 / /build/root/proc rw - proc proc rw
32 30 0:7 / /build/root/dev/pts rw - devpts devpts rw
33 22 0:8 / /build/rootfs2 rw - tmpfs tmpfs rw
34 22 0:9 / /build/with\\040space/proc rw - proc proc rw
"""


def test_mountpoints_under_lists_deepest_first_and_ignores_prefix_siblings() -> None:
    assert mountpoints_under(Path("/build/root"), MOUNTINFO) == [
        Path("/build/root/dev/pts"),
        Path("/build/root/proc"),
        Path("/build/root"),
    ]


def test_mountpoints_under_decodes_octal_escapes() -> None:
    assert mountpoints_under(Path("/build/with space"), MOUNTINFO) == [Path("/build/with space/proc")]


@pytest.mark.parametrize(
    ("name", "slug"),
    [("base", "base"), ("My Template:v1", "my-template-v1"), ("../..", "layer"), ("", "layer"), ("a" * 90, "a" * 40)],
)
def test_slugify(name: str, slug: str) -> None:
    assert slugify(name) == slug


def test_template_info_round_trips(tmp_path: Path) -> None:
    info = TemplateInfo(name="t", built_at="2026-01-01T00:00:00Z", source="s", env={"A": "1"}, recipe=3)
    (tmp_path / "template.json").write_text(json.dumps(info.to_json()))
    assert load_template_info(tmp_path) == info


def test_load_template_info_rejects_missing_and_broken(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        load_template_info(tmp_path)
    (tmp_path / "template.json").write_text("{not json")
    with pytest.raises(NotFoundError):
        load_template_info(tmp_path)


def test_resolve_rootfs(tmp_path: Path) -> None:
    template = tmp_path / "tpl"
    (template / "rootfs" / "bin").mkdir(parents=True)
    (template / "template.json").write_text("{}")
    assert resolve_rootfs(template) == (template / "rootfs").resolve()
    assert resolve_rootfs(template / "rootfs") == (template / "rootfs").resolve()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequestError):
        resolve_rootfs(tmp_path / "empty")
    with pytest.raises(NotFoundError):
        resolve_rootfs(tmp_path / "missing")
