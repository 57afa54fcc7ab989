"""The snapshot repository on a real directory: deep trees in snapshot data, failed writes, and garbage
found when it opens (issue 9, hostile trees). No root needed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.deep import make_deep as _make_deep
from tests.framework.deep import private_dir
from warren.snapshots import SnapshotManifest, SnapshotRepository

DEPTH = 3000
"""Deeper than Python's recursion limit: ``shutil.rmtree`` and ``os.walk`` die on it."""


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Not pytest's: its basetemp cleanup dies on deep trees (see tests.framework.deep)."""
    with private_dir() as top:
        yield top


def make_deep(root: Path) -> None:
    _make_deep(root, DEPTH)


def manifest(snapshot_id: str) -> SnapshotManifest:
    return SnapshotManifest(
        snapshot_id=snapshot_id, names=(), source_sandbox_id="i1", template_id="t1", runtime="runc", layers=(),
        env={}, workdir=None, user=None, memory=False, created_at=1.0, cpu_count=1, memory_mb=256, disk_mb=512,
    )


async def test_a_deep_tree_is_committed_and_deleted(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path / "snapshots")
    async with repo.writing("sdeep") as data:
        make_deep(data / "upper")
        await repo.commit(data, manifest("sdeep"))
    assert [m.snapshot_id for m in repo.list()] == ["sdeep"]
    await repo.delete("sdeep")
    assert repo.list() == [] and list((tmp_path / "snapshots" / ".tmp").iterdir()) == []


async def test_a_failed_write_removes_its_deep_temp_dir(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path / "snapshots")
    with pytest.raises(RuntimeError, match="copy failed"):
        async with repo.writing("sfail") as data:
            make_deep(data / "upper")
            raise RuntimeError("copy failed")
    assert list((tmp_path / "snapshots" / ".tmp").iterdir()) == []
    assert not (tmp_path / "snapshots" / "sfail").exists()


async def test_opening_sweeps_temp_dirs_and_moves_garbage_aside(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    first = SnapshotRepository(root)
    async with first.writing("sgood") as data:
        (data / "upper").mkdir()
        await first.commit(data, manifest("sgood"))
    make_deep(root / ".tmp" / "scrash-0123" / "data" / "upper")
    make_deep(root / "shalf" / "data" / "upper")
    (root / "sbad").mkdir()
    (root / "sbad" / "manifest.json").write_text('{"magic": "warren-snapshot", "truncated')
    (root / "stray-file").write_text("x")

    repo = SnapshotRepository(root)

    assert [m.snapshot_id for m in repo.list()] == ["sgood"]
    assert sorted(p.name for p in root.iterdir()) == [".tmp", "sgood"]
    assert list((root / ".tmp").iterdir()) == []
    moved = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "quarantine").iterdir())
    assert moved == ["sbad", "shalf", "stray-file"]
    assert (next((tmp_path / "quarantine").glob("*-shalf")) / "data" / "upper" / "d").is_dir()


def test_ids_no_file_can_have_are_not_found(tmp_path: Path) -> None:
    """Found by the OpenAPI fuzz run: a create naming ``"a\\x00b"`` as its template answered 500."""
    from warren.errors import NotFoundError

    repo = SnapshotRepository(tmp_path / "snapshots")
    for bad in ("a\x00b", "x" * 300, "\ud9ee", ""):
        with pytest.raises(NotFoundError):
            repo.get(bad)
        assert repo.find(bad) is None
