"""Pure parts of warren.runtime.disk: no root, no loop devices (a stand-in /sys/block and image files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warren.runtime.disk import _LO_FLAGS_OFFSET, _LOOP_CONFIG, SandboxDisks, _sparse_copy, loop_devices_backed_by


def _loop(sys_block: Path, name: str, backing: str | None) -> None:
    (sys_block / name).mkdir(parents=True)
    if backing is not None:
        (sys_block / name / "loop").mkdir()
        (sys_block / name / "loop" / "backing_file").write_text(backing + "\n")


def test_loop_devices_backed_by_matches_files_under_a_dir_or_one_file(tmp_path: Path) -> None:
    sys_block = tmp_path / "sys-block"
    _loop(sys_block, "loop0", "/state/sandboxes/a/disk.img")
    _loop(sys_block, "loop1", "/state/sandboxes/b/disk.img (deleted)")
    _loop(sys_block, "loop2", "/state-other/sandboxes/c/disk.img")
    _loop(sys_block, "loop3", None)  # not bound
    _loop(sys_block, "sda", "/state/x")  # not a loop device
    under = loop_devices_backed_by(Path("/state"), sys_block=sys_block)
    assert under == ["loop0: /state/sandboxes/a/disk.img", "loop1: /state/sandboxes/b/disk.img (deleted)"]
    exact = loop_devices_backed_by(Path("/state/sandboxes/b/disk.img"), exact=True, sys_block=sys_block)
    assert exact == ["loop1: /state/sandboxes/b/disk.img (deleted)"]
    assert loop_devices_backed_by(Path("/state/sandboxes/b"), exact=True, sys_block=sys_block) == []


def test_loop_config_layout_matches_linux_loop_h() -> None:
    # struct loop_config: u32 fd, u32 block_size, loop_info64 (232 bytes), u64 reserved[8]
    assert _LOOP_CONFIG.size == 8 + 232 + 64
    assert _LO_FLAGS_OFFSET == 8 + 52  # lo_flags after 5 u64 and 3 u32 of loop_info64


def test_sparse_copy_keeps_holes_and_data(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.img", tmp_path / "dst.img"
    with open(src, "wb") as fh:
        fh.truncate(64 * 2**20)
        fh.seek(2**20)
        fh.write(b"a" * 4096)
        fh.seek(40 * 2**20)
        fh.write(b"b" * 8192)
    _sparse_copy(src, dst)
    assert dst.stat().st_size == src.stat().st_size
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_blocks * 512 <= 2**20  # the holes stayed holes
    assert (dst.stat().st_mode & 0o777) == 0o600
    with pytest.raises(FileExistsError):
        _sparse_copy(src, dst)


def test_disabled_disks_are_plain_dirs(tmp_path: Path) -> None:
    disks = SandboxDisks(tmp_path / "state", enabled=False, size_mb=64)
    status = disks.probe()
    assert status == {"enforced": False, "mechanism": None, "size_override_mb": 64,
                      "reason": "turned off by the node settings (WARREN_DISK_QUOTA)"}
    root = tmp_path / "state" / "sandboxes" / "x"
    root.mkdir(parents=True)
    disks.create(root, 2048)
    assert (root / "disk").is_dir() and os.listdir(root) == ["disk"]
    assert disks.usage(root) is None and not disks.is_attached(root)
    disks.release(root)  # not mounted: nothing to do
    disks.attach(root)  # no image: nothing to do
    assert os.listdir(root) == ["disk"]


@pytest.mark.parametrize(("quota", "enforced"),
                         [("0", False), ("off", False), ("no", False), ("1", True), ("on", True)])
def test_settings_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: str, enforced: bool) -> None:
    from warren.config import Settings

    monkeypatch.setenv("WARREN_DISK_QUOTA", quota)
    monkeypatch.setenv("WARREN_SANDBOX_DISK_MB", "64")
    settings = Settings.from_env(tmp_path)
    assert settings.disk_quota is enforced
    assert settings.sandbox_disk_mb == 64
    monkeypatch.delenv("WARREN_DISK_QUOTA")
    monkeypatch.delenv("WARREN_SANDBOX_DISK_MB")
    assert Settings.from_env(tmp_path).disk_quota is True
    assert Settings.from_env(tmp_path).sandbox_disk_mb is None


def test_probe_removes_half_made_template_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # the probe stops early, after the clean-up
    templates = tmp_path / "state" / "disk-templates"
    templates.mkdir(parents=True)
    (templates / ".tmp-abc-ext4-v1-64M.img").write_bytes(b"half")
    (templates / "ext4-v1-64M.img").write_bytes(b"whole")
    SandboxDisks(tmp_path / "state").probe()
    assert os.listdir(templates) == ["ext4-v1-64M.img"]
