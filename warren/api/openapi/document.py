"""The OpenAPI 3.1 document, built from the operation table: every path parameter defined (from the
path template), every body and answer named, errors as E2B's ``Error``."""

from __future__ import annotations

import re
from typing import Any

from .operations import OPERATIONS, Operation
from .schemas import SCHEMAS, Schema, ref

_PARAM = re.compile(r"\{([^}]+)\}")


def _parameters(op: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": op.path_schemas.get(name, {"type": "string"})}
        for name in _PARAM.findall(op.path)
    ]
    params += [{"name": name, "in": "query", "required": False, "schema": schema} for name, schema in op.query.items()]
    return params


def _json(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op)}
    if params := _parameters(op):
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required, "content": _json(op.body)}
    elif op.raw_body is not None:
        out["requestBody"] = {"required": True, "content": {op.raw_body: {"schema": {"type": "string",
                                                                                     "format": "binary"}}}}
    ok: dict[str, Any] = {"description": "success"}
    if op.answer is not None:
        ok["content"] = _json(op.answer)
    elif op.raw_answer is not None:
        ok["content"] = {op.raw_answer: {"schema": {"type": "string"}}}
    elif op.ok == 200:  # a stream (image pulls: NDJSON)
        ok["content"] = {"application/x-ndjson": {"schema": {"type": "string"}}}
    responses: dict[str, Any] = {str(op.ok): ok}
    for status in op.errors:
        responses[str(status)] = {"description": "error", "content": _json(ref("Error"))}
    out["responses"] = responses
    if op.public:
        out["security"] = []
    return out


def _operation_id(op: Operation) -> str:
    words = re.sub(r"[{}]", "", op.path).strip("/").replace("/", "_").replace("-", "_").replace(".", "_")
    return f"{op.method}_{words or 'root'}"


def build_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "warren", "version": "0.1.0",
                 "description": "E2B-compatible sandbox control plane; E2B's routes keep E2B's shapes"},
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"ApiKeyAuth": {"type": "apiKey", "in": "header", "name": "X-API-Key"}},
        },
        "security": [{"ApiKeyAuth": []}],
        "paths": paths,
    }
