"""Template tags (E2B's build assignments): which build of a template each tag names.

``template_builds`` keeps the whole record of every build a tag points to, so ``name:tag`` starts a
sandbox from that build after the template was rebuilt; ``template_tags`` maps (template, tag) to a
build. A build no tag points to any more is dropped from ``template_builds`` in the same transaction
(its layers may then be garbage; the callers pass them to gc). A template without any tag row (one
older than tags, pulled or imported) has one implicit tag, ``default``, naming its current build; the
first change to its tags writes that implicit tag down first.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ..names import DEFAULT_TAG
from .db import Database
from .records import TemplateRecord, TemplateTag, build_id_of
from .rows import TEMPLATE_COLUMNS, template_of, template_params

_BUILD_UPSERT = (
    f"INSERT OR REPLACE INTO template_builds (build_id,{','.join(TEMPLATE_COLUMNS)}) "
    f"VALUES ({','.join('?' * (len(TEMPLATE_COLUMNS) + 1))})"
)
_TAG_UPSERT = "INSERT OR REPLACE INTO template_tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?)"


def _implicit(rec: TemplateRecord) -> TemplateTag:
    return TemplateTag(DEFAULT_TAG, build_id_of(rec), rec.build.built_at or rec.created_at)


def _tags(conn: sqlite3.Connection, template_id: str) -> list[TemplateTag]:
    rows = conn.execute(
        "SELECT tag, build_id, created_at FROM template_tags WHERE template_id = ? ORDER BY tag", (template_id,)
    ).fetchall()
    return [TemplateTag(r["tag"], r["build_id"], r["created_at"]) for r in rows]


def _put_build(conn: sqlite3.Connection, rec: TemplateRecord) -> None:
    conn.execute(_BUILD_UPSERT, [build_id_of(rec), *template_params(rec)])


def _write_implicit(conn: sqlite3.Connection, rec: TemplateRecord) -> None:
    """A template without tag rows gets its implicit ``default`` written down."""
    if not _tags(conn, rec.id):
        _put_build(conn, rec)
        tag = _implicit(rec)
        conn.execute(_TAG_UPSERT, (rec.id, tag.tag, tag.build_id, tag.created_at))


def _current(conn: sqlite3.Connection, template_id: str) -> TemplateRecord | None:
    row = conn.execute("SELECT * FROM templates WHERE id = ?", (template_id,)).fetchone()
    return template_of(row) if row is not None else None


def _build(conn: sqlite3.Connection, build_id: str) -> TemplateRecord | None:
    row = conn.execute("SELECT * FROM template_builds WHERE build_id = ?", (build_id,)).fetchone()
    return template_of(row) if row is not None else None


def _prune(conn: sqlite3.Connection, template_id: str) -> list[TemplateRecord]:
    """Drop the builds of the template no tag points to; returns them."""
    rows = conn.execute(
        "SELECT * FROM template_builds WHERE id = ? AND build_id NOT IN "
        "(SELECT build_id FROM template_tags WHERE template_id = ?)",
        (template_id, template_id),
    ).fetchall()
    conn.executemany("DELETE FROM template_builds WHERE build_id = ?", [(r["build_id"],) for r in rows])
    return [template_of(r) for r in rows]


def delete_template(conn: sqlite3.Connection, template_id: str) -> None:
    """Inside the template's deletion: its tags and tagged builds go with it."""
    conn.execute("DELETE FROM template_tags WHERE template_id = ?", (template_id,))
    conn.execute("DELETE FROM template_builds WHERE id = ?", (template_id,))


class TagRepo:
    """Tags of templates and the build records they keep."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def record_build(
        self, rec: TemplateRecord, tags: Sequence[str], *, current: bool, now: float
    ) -> list[TemplateRecord]:
        """A finished build: kept under its build id with ``tags`` on it, and the template's current
        record when ``current``. Returns the builds no tag names any more (dropped)."""

        def tx(conn: sqlite3.Connection) -> list[TemplateRecord]:
            previous = _current(conn, rec.id)
            if previous is not None:
                _write_implicit(conn, previous)
            if current or previous is None:
                conn.execute(
                    f"INSERT OR REPLACE INTO templates ({','.join(TEMPLATE_COLUMNS)}) "
                    f"VALUES ({','.join('?' * len(TEMPLATE_COLUMNS))})",
                    template_params(rec),
                )
            _put_build(conn, rec)
            conn.executemany(_TAG_UPSERT, [(rec.id, t, build_id_of(rec), now) for t in tags])
            return _prune(conn, rec.id)

        return await self._db.transaction(tx)

    async def of(self, rec: TemplateRecord) -> list[TemplateTag]:
        """The template's tags, by name (its implicit ``default`` when it has no tag rows)."""
        tags = await self._db.transaction(lambda conn: _tags(conn, rec.id))
        return tags or [_implicit(rec)]

    async def build(self, rec: TemplateRecord, tag: str) -> TemplateRecord | None:
        """The record of the build ``tag`` names, or None when the template has no such tag."""

        def read(conn: sqlite3.Connection) -> TemplateRecord | None:
            tags = {t.tag: t for t in _tags(conn, rec.id)}
            if not tags:
                return rec if tag == DEFAULT_TAG else None
            named = tags.get(tag)
            if named is None:
                return None
            return rec if named.build_id == build_id_of(rec) else _build(conn, named.build_id)

        return await self._db.transaction(read)

    async def assign(
        self, rec: TemplateRecord, source: str, tags: Sequence[str], now: float
    ) -> tuple[TemplateRecord, list[TemplateRecord]] | None:
        """Point ``tags`` at the build ``source`` names: (that build, builds no tag names any more),
        or None when the template has no tag ``source``."""

        def tx(conn: sqlite3.Connection) -> tuple[TemplateRecord, list[TemplateRecord]] | None:
            _write_implicit(conn, rec)
            named = {t.tag: t for t in _tags(conn, rec.id)}.get(source)
            target = _build(conn, named.build_id) if named is not None else None
            if target is None:
                return None
            conn.executemany(_TAG_UPSERT, [(rec.id, t, build_id_of(target), now) for t in tags])
            return target, _prune(conn, rec.id)

        return await self._db.transaction(tx)

    async def remove(self, rec: TemplateRecord, tags: Sequence[str]) -> list[TemplateRecord]:
        """Remove ``tags`` (unknown ones are no error); returns the builds no tag names any more."""

        def tx(conn: sqlite3.Connection) -> list[TemplateRecord]:
            _write_implicit(conn, rec)
            conn.executemany(
                "DELETE FROM template_tags WHERE template_id = ? AND tag = ?", [(rec.id, t) for t in tags]
            )
            return _prune(conn, rec.id)

        return await self._db.transaction(tx)

    async def builds(self) -> list[TemplateRecord]:
        """Every kept build record (their layers and uploads are in use)."""
        return [template_of(r) for r in await self._db.read("SELECT * FROM template_builds")]
