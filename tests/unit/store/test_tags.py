"""Template tags in the store: builds kept while a tag names them, the implicit ``default`` of a template
older than tags, deletion with the template, and everything still there after the database is reopened."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from warren.store import Database, Provenance, TemplateRecord, TemplateRepo, TemplateTag


def _rec(build_id: str | None, layer: str, *, tid: str = "tabc", name: str = "web") -> TemplateRecord:
    return TemplateRecord(
        id=tid, name=name, runtime="runc", layers=(f"/l/{layer}",), env={}, workdir=None, user=None, start_cmd=None,
        ready_cmd=None, cpu_count=1, memory_mb=512, disk_mb=1024, created_at=1.0,
        build=Provenance(build_id=build_id, built_at=2.0),
    )  # fmt: skip


async def test_builds_and_tags_across_a_reopen(tmp_path: Path) -> None:
    db = Database(tmp_path / "w.db")
    repo = TemplateRepo(db)
    assert await repo.tags.record_build(_rec("b1", "one"), ["default"], current=True, now=10.0) == []
    assert await repo.tags.record_build(_rec("b2", "two"), ["v2"], current=False, now=11.0) == []
    current = await repo.find("web")
    assert current is not None and current.build.build_id == "b1"  # a v2-only build leaves the default
    assert await repo.tags.of(current) == [TemplateTag("default", "b1", 10.0), TemplateTag("v2", "b2", 11.0)]
    v2 = await repo.tags.build(current, "v2")
    assert v2 is not None and v2.layers == ("/l/two",)
    assert await repo.tags.build(current, "nope") is None

    assigned = await repo.tags.assign(current, "v2", ["prod"], 12.0)
    assert assigned is not None and assigned[0].build.build_id == "b2" and assigned[1] == []
    assert await repo.tags.remove(current, ["v2"]) == []  # prod still names b2
    gone = await repo.tags.remove(current, ["prod"])
    assert [r.build.build_id for r in gone] == ["b2"]
    assert {r.build.build_id for r in await repo.tags.builds()} == {"b1"}
    await repo.tags.assign(current, "default", ["kept"], 13.0)
    db.close()

    db = Database(tmp_path / "w.db")
    repo = TemplateRepo(db)
    current = await repo.find("web")
    assert current is not None
    assert [t.tag for t in await repo.tags.of(current)] == ["default", "kept"]
    assert await repo.delete(current.id)
    assert await repo.tags.builds() == []
    db.close()


async def test_a_template_without_tag_rows_has_an_implicit_default(tmp_path: Path) -> None:
    db = Database(tmp_path / "w.db")
    repo = TemplateRepo(db)
    old = _rec(None, "old")
    await repo.put(old)  # as a pull, an import or an older node wrote it
    tags = await repo.tags.of(old)
    assert [t.tag for t in tags] == ["default"] and tags[0].created_at == 2.0
    assert await repo.tags.build(old, "default") == old
    # A non-default build of it keeps the old record as its default.
    await repo.tags.record_build(dataclasses.replace(old, build=Provenance(build_id="b9")), ["v9"],
                                 current=False, now=5.0)  # fmt: skip
    current = await repo.find("web")
    assert current == old
    assert {t.tag: t.build_id for t in await repo.tags.of(old)} == {"default": tags[0].build_id, "v9": "b9"}
    assert await repo.tags.build(old, "default") == old
    db.close()
