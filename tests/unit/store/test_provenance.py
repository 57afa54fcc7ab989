"""A template's provenance is a typed record; the JSON it is stored as is the dict older nodes wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warren.store import CacheEntry, Database, TemplateRecord, TemplateRepo, provenance_json
from warren.store.codec import provenance_of

OLD_BUILT = {  # as templates/build.py wrote it before the record was typed
    "build_id": "b-1", "built_at": 1700000000.5, "source": {"template": "base"}, "steps": 2,
    "cache": [{"key": "k1", "layers": ["/l/a"]}, {"key": "k2", "layers": ["/l/a", "/l/b"]}],
    "layer": "/l/b", "files": ["h1"], "tags": ["v1"], "shell": "/bin/bash", "build_count": 3,
}
OLD_PULLED = {"build_id": "b-2", "source": {"image": "r/x:1", "digest": "sha256:d", "config": "sha256:c"},
              "diff_ids": ["sha256:1"], "entrypoint": ["/e"], "cmd": ["c"], "pulled": True}


@pytest.mark.parametrize("old", [OLD_BUILT, OLD_PULLED, {}])
def test_old_json_reads_and_writes_back_the_same(old: dict[str, object]) -> None:
    p = provenance_of(json.loads(json.dumps(old)))
    assert provenance_json(p) == {"build_count": 1, **old}


def test_typed_fields() -> None:
    p = provenance_of(OLD_BUILT)
    assert p.cache == (CacheEntry("k1", ("/l/a",)), CacheEntry("k2", ("/l/a", "/l/b")))
    assert p.files == ("h1",) and p.build_count == 3 and p.built_at == 1700000000.5


async def test_round_trip_through_the_database(tmp_path: Path) -> None:
    db = Database(tmp_path / "warren.db")
    try:
        repo = TemplateRepo(db)
        rec = TemplateRecord("t1", "web", "runc", ("/l/a",), {}, None, None, None, None, 1, 256, 1024, 0.0,
                             provenance_of(OLD_BUILT))
        await repo.put(rec)
        assert await repo.find("t1") == rec
    finally:
        db.close()
