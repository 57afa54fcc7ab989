"""``import_template``: a rootfs becomes a layer, hard-linked on one filesystem, atomically."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from warren.errors import HostError, InvalidRequestError
from warren.templates import import_template, importer


def _make_rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    os.chmod(root / "bin" / "tool", 0o755)
    (root / "etc" / "hostname").write_text("sandbox\n")
    (root / "bin" / "sh").symlink_to("/bin/busybox")
    return root


def _layer_dirs(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "layers").iterdir() if not p.name.endswith(".lock"))


def test_import_on_one_filesystem_hard_links(tmp_path: Path) -> None:
    src = _make_rootfs(tmp_path / "src")
    layer = import_template(src, tmp_path / "state", "My Base")
    assert layer.parent == tmp_path / "state" / "layers"
    assert layer.name.startswith("my-base-")
    assert _layer_dirs(tmp_path / "state") == [layer.name]
    assert os.stat(layer / "bin/tool").st_ino == os.stat(src / "bin/tool").st_ino
    assert os.stat(layer / "bin/tool").st_mode == os.stat(src / "bin/tool").st_mode
    assert os.readlink(layer / "bin/sh") == "/bin/busybox"
    assert (layer / "etc/hostname").read_text() == "sandbox\n"


def test_each_import_is_a_new_layer(tmp_path: Path) -> None:
    src = _make_rootfs(tmp_path / "src")
    first = import_template(src, tmp_path / "state", "t")
    second = import_template(src, tmp_path / "state", "t")
    assert first != second
    assert _layer_dirs(tmp_path / "state") == sorted([first.name, second.name])


def test_a_template_dir_imports_its_rootfs(tmp_path: Path) -> None:
    _make_rootfs(tmp_path / "tpl" / "rootfs")
    (tmp_path / "tpl" / "template.json").write_text("{}")
    layer = import_template(tmp_path / "tpl", tmp_path / "state", "t")
    assert (layer / "bin/tool").is_file()
    assert not (layer / "template.json").exists()


def test_across_filesystems_it_copies(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to copy from")
    with tempfile.TemporaryDirectory(dir=shm) as other:
        src = _make_rootfs(Path(other) / "src")
        layer = import_template(src, tmp_path / "state", "t")
        assert (layer / "bin/tool").read_text() == (src / "bin/tool").read_text()
        assert os.stat(layer / "bin/tool").st_dev != os.stat(src / "bin/tool").st_dev


def test_hard_link_failure_falls_back_to_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``link`` fails as through a bind mount (EXDEV): faked, a real cross-device bind mount of the
    source would need a mount in the test. The hard-link copy removes its partial result, the full
    copy follows."""
    real_link = os.link

    def no_links(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("src_dir_fd") is not None:  # trees.copy_tree(hardlink=True) linking a source file
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_link(*args, **kwargs)

    monkeypatch.setattr(os, "link", no_links)
    src = _make_rootfs(tmp_path / "src")
    layer = import_template(src, tmp_path / "state", "t")
    assert (layer / "bin/tool").is_file()
    assert os.stat(layer / "bin/tool").st_ino != os.stat(src / "bin/tool").st_ino
    assert _layer_dirs(tmp_path / "state") == [layer.name]


def test_a_failed_import_leaves_no_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_copy(source: Path, dest: Path) -> None:
        (dest / "bin").mkdir(parents=True)
        raise HostError("disk full")

    monkeypatch.setattr(importer, "copy_tree", half_copy)
    src = _make_rootfs(tmp_path / "src")
    with pytest.raises(HostError, match="disk full"):
        import_template(src, tmp_path / "state", "t")
    assert _layer_dirs(tmp_path / "state") == []


def test_leftovers_of_a_crashed_import_are_removed(tmp_path: Path) -> None:
    (tmp_path / "state" / "layers" / ".tmp-t-dead" / "bin").mkdir(parents=True)
    layer = import_template(_make_rootfs(tmp_path / "src"), tmp_path / "state", "t")
    assert _layer_dirs(tmp_path / "state") == [layer.name]


def test_not_a_rootfs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    with pytest.raises(InvalidRequestError):
        import_template(tmp_path / "junk", tmp_path / "state", "t")
    assert not (tmp_path / "state" / "layers").exists()
