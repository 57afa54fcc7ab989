"""Repositories over the database: sandboxes and templates."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

from .db import Database
from .records import SandboxRecord, TemplateRecord

_SANDBOX_COLS = [f.name for f in dataclasses.fields(SandboxRecord)]
_TEMPLATE_COLS = [f.name for f in dataclasses.fields(TemplateRecord)]
_JSON_SANDBOX = {"metadata", "env_vars", "extra"}
_JSON_TEMPLATE = {"layers", "env", "build"}


def _sandbox(row: sqlite3.Row) -> SandboxRecord:
    values = {c: (json.loads(row[c]) if c in _JSON_SANDBOX else row[c]) for c in _SANDBOX_COLS}
    values["allow_internet"] = bool(values["allow_internet"])
    return SandboxRecord(**values)


def _template(row: sqlite3.Row) -> TemplateRecord:
    values = {c: (json.loads(row[c]) if c in _JSON_TEMPLATE else row[c]) for c in _TEMPLATE_COLS}
    values["layers"] = tuple(values["layers"])
    return TemplateRecord(**values)


def _params(record: object, cols: list[str], json_cols: set[str]) -> list[object]:
    out: list[object] = []
    for c in cols:
        v = getattr(record, c)
        if c in json_cols:
            v = json.dumps(list(v) if isinstance(v, tuple) else v, sort_keys=True)
        elif isinstance(v, bool):
            v = int(v)
        out.append(v)
    return out


def _upsert(table: str, cols: list[str]) -> str:
    return f"INSERT OR REPLACE INTO {table} ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})"


_SANDBOX_UPSERT = _upsert("sandboxes", _SANDBOX_COLS)
_TEMPLATE_UPSERT = _upsert("templates", _TEMPLATE_COLS)


class SandboxRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(self, rec: SandboxRecord) -> None:
        """Insert or replace the whole record."""
        await self._db.write(_SANDBOX_UPSERT, _params(rec, _SANDBOX_COLS, _JSON_SANDBOX))

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        rows = await self._db.read("SELECT * FROM sandboxes WHERE id = ?", (sandbox_id,))
        return _sandbox(rows[0]) if rows else None

    async def all(self) -> list[SandboxRecord]:
        rows = await self._db.read("SELECT * FROM sandboxes ORDER BY started_at, id")
        return [_sandbox(r) for r in rows]

    async def delete(self, sandbox_id: str) -> bool:
        return await self._db.write("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,)) > 0


class TemplateRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(self, rec: TemplateRecord) -> None:
        """Insert or replace the whole record."""
        await self._db.write(_TEMPLATE_UPSERT, _params(rec, _TEMPLATE_COLS, _JSON_TEMPLATE))

    async def find(self, id_or_name: str) -> TemplateRecord | None:
        rows = await self._db.read(
            "SELECT * FROM templates WHERE id = ? OR name = ?", (id_or_name, id_or_name)
        )
        return _template(rows[0]) if rows else None

    async def all(self) -> list[TemplateRecord]:
        return [_template(r) for r in await self._db.read("SELECT * FROM templates ORDER BY name")]

    async def delete(self, template_id: str) -> bool:
        return await self._db.write("DELETE FROM templates WHERE id = ?", (template_id,)) > 0
