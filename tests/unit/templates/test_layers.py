"""Layer pins and gc (``warren.templates.layers.Layers``) with a real SQLite store and image store.

What sandboxes and snapshots use comes from the ``usage`` callable, the node's seam (a list here)."""

from __future__ import annotations

from pathlib import Path

from warren.images import LayerStore
from warren.store import TemplateRecord, TemplateRepo
from warren.store.db import Database
from warren.templates.layers import Layers, Usage
from warren.templates.uploads import UploadStore


def _layers(tmp_path: Path, templates: TemplateRepo, usage: list[Usage]) -> Layers:
    return Layers(layers_dir=tmp_path / "layers", templates=templates, image_store=LayerStore(tmp_path / "images"),
                  uploads=UploadStore(tmp_path / "uploads"), usage=lambda: usage[0])  # fmt: skip


async def test_gc_keeps_what_templates_sandboxes_and_pins_use(tmp_path: Path) -> None:
    templates = TemplateRepo(Database(tmp_path / "w.db"))
    usage = [Usage()]
    layers = _layers(tmp_path, templates, usage)
    names = ["build-a", "build-b", "build-c", "build-d", "imported", ".tmp-build-e"]
    for name in names:
        (layers.dir / name).mkdir(parents=True)
    paths = {n: str(layers.dir / n) for n in names}
    await templates.put(TemplateRecord("t1", "app", "runc", (paths["build-a"],), {}, None, None, None, None,
                                       2, 512, 2048, 0.0))  # fmt: skip
    usage[0] = Usage(layers=frozenset({paths["build-b"]}))
    pinned: list[str] = []
    layers.pin([paths["build-c"]], pinned)
    assert await layers.gc() == [paths["build-d"]]  # not its own: "imported"; half-sealed: left to recovery
    layers.unpin(pinned)
    assert await layers.gc(candidates=[paths["imported"]]) == [paths["build-c"], paths["imported"]]
    await layers.drop_half_sealed(tmp_path)
    assert sorted(p.name for p in layers.dir.iterdir()) == ["build-a", "build-b"]


async def test_pins_count(tmp_path: Path) -> None:
    layers = _layers(tmp_path, TemplateRepo(Database(tmp_path / "w.db")), [Usage()])
    first: list[str] = []
    second: list[str] = []
    layers.pin(["/l/x"], first)
    layers.pin(["/l/x", "/l/y"], second)
    layers.unpin(first)
    assert layers.pinned() == {"/l/x", "/l/y"} and first == []
    layers.unpin(second)
    assert layers.pinned() == frozenset()
