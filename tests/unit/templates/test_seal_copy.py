"""Sealing a build layer across filesystems (the upper dir on tmpfs, the layers dir on disk): a real
EXDEV, so the copy path of ``BuildService._seal`` runs. Needs root (whiteout device, trusted xattr)."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from warren.templates.build import BuildService
from warren.trees import CopyCancelled

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted xattrs need root")


@pytest.fixture
def upper() -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir=shm) as other:
        root = Path(other) / "upper"
        (root / "etc" / "opaque").mkdir(parents=True)
        os.setxattr(root / "etc" / "opaque", "trusted.overlay.opaque", b"y")
        os.mknod(root / "etc" / "gone", stat.S_IFCHR, 0)
        (root / "etc" / "motd").write_text("built")
        yield root


def _service(layers: Path) -> BuildService:
    return SimpleNamespace(layers_dir=layers)  # type: ignore[return-value]  # _seal only needs layers_dir


def test_seal_copies_across_filesystems(upper: Path, tmp_path: Path) -> None:
    if os.stat(upper).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem")
    layer = BuildService._seal(_service(tmp_path / "layers"), upper, "k" * 64)  # type: ignore[arg-type]
    assert (layer / "etc" / "motd").read_text() == "built"
    assert os.getxattr(layer / "etc" / "opaque", "trusted.overlay.opaque") == b"y"
    assert stat.S_ISCHR(os.lstat(layer / "etc" / "gone").st_mode)
    assert [p.name for p in (tmp_path / "layers").iterdir()] == [layer.name]


def test_a_cancelled_seal_leaves_nothing(upper: Path, tmp_path: Path) -> None:
    if os.stat(upper).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CopyCancelled):
        BuildService._seal(_service(tmp_path / "layers"), upper, "k" * 64, cancel)  # type: ignore[arg-type]
    assert list((tmp_path / "layers").iterdir()) == []
