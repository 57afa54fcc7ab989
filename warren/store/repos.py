"""Repositories over the database: sandboxes and templates (their tags: :mod:`warren.store.tags`)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from . import codec
from .db import Database
from .records import SandboxRecord, TemplateRecord
from .rows import TEMPLATE_COLUMNS, template_of, template_params
from .tags import TagRepo, delete_template

_SANDBOX_COLS = [f.name for f in dataclasses.fields(SandboxRecord)]


def _sandbox(row: sqlite3.Row | Mapping[str, Any]) -> SandboxRecord:
    return SandboxRecord(
        id=row["id"],
        template_id=row["template_id"],
        alias=row["alias"],
        runtime=row["runtime"],
        state=row["state"],
        metadata=json.loads(row["metadata"]),
        env_vars=json.loads(row["env_vars"]),
        started_at=row["started_at"],
        end_at=row["end_at"],
        cpu_count=row["cpu_count"],
        memory_mb=row["memory_mb"],
        disk_mb=row["disk_mb"],
        access_token=row["access_token"],
        address=row["address"],
        allow_internet=bool(row["allow_internet"]),
        image=codec.image_of(codec.load(row["image"])),
        policy=codec.policy_of(codec.load(row["policy"])),
        binding=codec.binding_of(codec.load(row["binding"])),
        origin=row["origin"],
        requested=codec.requested_of(codec.load(row["requested"])),
        ingress=codec.ingress_of(codec.load(row["ingress"])),
        egress=codec.egress_of(codec.load(row["egress"])),
    )


def _sandbox_params(rec: SandboxRecord) -> list[object]:
    columns: dict[str, object] = {
        **{c: getattr(rec, c) for c in _SANDBOX_COLS},
        "metadata": json.dumps(rec.metadata, sort_keys=True),
        "env_vars": json.dumps(rec.env_vars, sort_keys=True),
        "allow_internet": int(rec.allow_internet),
        "image": codec.image_to_json(rec.image),
        "policy": codec.policy_to_json(rec.policy),
        "binding": codec.binding_to_json(rec.binding),
        "requested": codec.requested_to_json(rec.requested),
        "ingress": codec.ingress_to_json(rec.ingress),
        "egress": codec.egress_to_json(rec.egress),
    }
    return [columns[c] for c in _SANDBOX_COLS]


def sandbox_to_json(rec: SandboxRecord) -> dict[str, Any]:
    """A sandbox record as one JSON object: its row, for a record that travels to another node."""
    return dict(zip(_SANDBOX_COLS, _sandbox_params(rec), strict=True))


def sandbox_of_json(raw: Mapping[str, Any]) -> SandboxRecord:
    """The record :func:`sandbox_to_json` wrote; ``KeyError``/``ValueError``/``TypeError`` when it is not one."""
    return _sandbox(raw)


def _upsert(table: str, cols: list[str]) -> str:
    return f"INSERT OR REPLACE INTO {table} ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})"


_SANDBOX_UPSERT = _upsert("sandboxes", _SANDBOX_COLS)
_TEMPLATE_UPSERT = _upsert("templates", TEMPLATE_COLUMNS)


class SandboxRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def put(self, rec: SandboxRecord) -> None:
        """Insert or replace the whole record (committed and fsynced off the event loop)."""
        await self._db.write(_SANDBOX_UPSERT, _sandbox_params(rec))

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
        self.tags = TagRepo(db)
        """The templates' tags and the build records they keep (:mod:`warren.store.tags`)."""

    async def put(self, rec: TemplateRecord) -> None:
        """Insert or replace the whole record."""
        await self._db.write(_TEMPLATE_UPSERT, template_params(rec))

    async def find(self, id_or_name: str) -> TemplateRecord | None:
        rows = await self._db.read("SELECT * FROM templates WHERE id = ? OR name = ?", (id_or_name, id_or_name))
        return template_of(rows[0]) if rows else None

    async def all(self) -> list[TemplateRecord]:
        return [template_of(r) for r in await self._db.read("SELECT * FROM templates ORDER BY name")]

    async def delete(self, template_id: str) -> bool:
        """Delete the template with its tags and tagged builds."""

        def tx(conn: sqlite3.Connection) -> bool:
            delete_template(conn, template_id)
            return conn.execute("DELETE FROM templates WHERE id = ?", (template_id,)).rowcount > 0

        return await self._db.transaction(tx)
