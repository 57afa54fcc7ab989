"""Repositories over the database: sandboxes and templates."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

from . import codec
from .db import Database
from .records import SandboxRecord, TemplateRecord

_SANDBOX_COLS = [f.name for f in dataclasses.fields(SandboxRecord)]
_TEMPLATE_COLS = [f.name for f in dataclasses.fields(TemplateRecord)]
_JSON_TEMPLATE = {"layers", "env"}


def _sandbox(row: sqlite3.Row) -> SandboxRecord:
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


def _template(row: sqlite3.Row) -> TemplateRecord:
    values = {c: (json.loads(row[c]) if c in _JSON_TEMPLATE else row[c]) for c in _TEMPLATE_COLS}
    values["layers"] = tuple(values["layers"])
    values["build"] = codec.provenance_of(codec.load(row["build"]))
    return TemplateRecord(**values)


def _template_params(rec: TemplateRecord) -> list[object]:
    out: list[object] = []
    for c in _TEMPLATE_COLS:
        v = getattr(rec, c)
        if c in _JSON_TEMPLATE:
            v = json.dumps(list(v) if isinstance(v, tuple) else v, sort_keys=True)
        elif c == "build":
            v = codec.provenance_to_json(rec.build)
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

    async def put(self, rec: TemplateRecord) -> None:
        """Insert or replace the whole record."""
        await self._db.write(_TEMPLATE_UPSERT, _template_params(rec))

    async def find(self, id_or_name: str) -> TemplateRecord | None:
        rows = await self._db.read("SELECT * FROM templates WHERE id = ? OR name = ?", (id_or_name, id_or_name))
        return _template(rows[0]) if rows else None

    async def all(self) -> list[TemplateRecord]:
        return [_template(r) for r in await self._db.read("SELECT * FROM templates ORDER BY name")]

    async def delete(self, template_id: str) -> bool:
        return await self._db.write("DELETE FROM templates WHERE id = ?", (template_id,)) > 0
