"""Stores opened at node start-up on dirs holding garbage (issue 9, hostile trees): they open, and the
garbage is gone or moved aside into ``<state>/quarantine``. Real directories; no root needed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.deep import make_deep, private_dir
from warren.images import LayerStore
from warren.runtime.oci.layout import SandboxPaths
from warren.runtime.oci.steps import set_aside_unreadable
from warren.templates.uploads import UploadStore

DEPTH = 3000


@pytest.fixture
def state() -> Iterator[Path]:
    """Not under pytest's basetemp: its cleanup dies on deep trees (see tests.framework.deep)."""
    with private_dir() as top:
        yield top / "state"


def _plant(tmp: Path) -> None:
    make_deep(tmp / "deep-dir", DEPTH)
    (tmp / "file").write_text("x")
    (tmp / "link-to-etc").symlink_to("/etc")
    os.mkfifo(tmp / "fifo")


def test_upload_store_opens_on_garbage(state: Path) -> None:
    _plant(state / "uploads" / "tmp")
    store = UploadStore(state / "uploads")
    assert list(store.tmp.iterdir()) == []
    assert os.path.isdir("/etc/ssl")


def test_layer_store_opens_on_garbage(state: Path) -> None:
    _plant(state / "images" / "tmp")
    store = LayerStore(state / "images")
    assert list(store.tmp.iterdir()) == []
    assert os.path.isdir("/etc/ssl")


def test_sandbox_dirs_with_unreadable_records_are_set_aside(state: Path) -> None:
    sandboxes = state / "sandboxes"
    bogus = sandboxes / "ibogus"
    make_deep(bogus / "upper", DEPTH)
    (bogus / "sandbox.json").write_text("{not json")
    (sandboxes / "inorecord" / "upper").mkdir(parents=True)
    (sandboxes / "stray").write_text("x")
    quarantine = state / "quarantine"

    moved = [set_aside_unreadable(SandboxPaths(sandboxes / n), quarantine) for n in ("ibogus", "inorecord", "stray")]

    assert moved == [True, False, True]
    assert sorted(p.name for p in sandboxes.iterdir()) == ["inorecord"]  # left to the orphan reaper
    assert sorted(p.name.split("-", 1)[1] for p in quarantine.iterdir()) == ["ibogus", "stray"]
