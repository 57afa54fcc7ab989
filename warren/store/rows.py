"""A template record as a database row and back (``templates`` and ``template_builds`` share the columns)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

from . import codec
from .records import TemplateRecord

TEMPLATE_COLUMNS = [f.name for f in dataclasses.fields(TemplateRecord)]
_JSON_TEMPLATE = {"layers", "env"}


def template_of(row: sqlite3.Row) -> TemplateRecord:
    values = {c: (json.loads(row[c]) if c in _JSON_TEMPLATE else row[c]) for c in TEMPLATE_COLUMNS}
    values["layers"] = tuple(values["layers"])
    values["build"] = codec.provenance_of(codec.load(row["build"]))
    return TemplateRecord(**values)


def template_params(rec: TemplateRecord) -> list[object]:
    out: list[object] = []
    for c in TEMPLATE_COLUMNS:
        v = getattr(rec, c)
        if c in _JSON_TEMPLATE:
            v = json.dumps(list(v) if isinstance(v, tuple) else v, sort_keys=True)
        elif c == "build":
            v = codec.provenance_to_json(rec.build)
        out.append(v)
    return out
