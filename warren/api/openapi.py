"""The OpenAPI document served at ``/openapi.json`` (hand-kept; a unit test checks it covers every route)."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
}
_SANDBOX = {
    "type": "object",
    "required": ["templateID", "sandboxID", "clientID", "envdVersion"],
    "properties": {
        k: {"type": "string"}
        for k in ("templateID", "sandboxID", "clientID", "envdVersion", "alias", "envdAccessToken", "domain")
    },
}

# (method, path, summary, success status, error statuses)
_OPERATIONS: list[tuple[str, str, str, int, tuple[int, ...]]] = [
    ("post", "/sandboxes", "Create a sandbox (v1)", 201, (400, 401, 404, 503)),
    ("post", "/v2/sandboxes", "Create a sandbox", 201, (400, 401, 404, 503)),
    ("get", "/sandboxes", "List running sandboxes (v1)", 200, (400, 401)),
    ("get", "/v2/sandboxes", "List sandboxes (metadata, state, limit, nextToken)", 200, (400, 401)),
    ("get", "/sandboxes/{sandboxID}", "Get a sandbox", 200, (401, 404)),
    ("delete", "/sandboxes/{sandboxID}", "Kill a sandbox", 204, (401, 404)),
    ("post", "/sandboxes/{sandboxID}/timeout", "Set the sandbox timeout (from now)", 204, (400, 401, 404)),
    ("post", "/sandboxes/{sandboxID}/connect", "Connect: extend a running sandbox (v1)", 200, (401, 404)),
    ("post", "/v2/sandboxes/{sandboxID}/connect", "Connect: extend a running sandbox", 200, (401, 404)),
    ("get", "/sandboxes/{sandboxID}/metrics", "Sandbox metrics from cgroup counters", 200, (401, 404)),
    ("put", "/sandboxes/{sandboxID}/network", "Replace the egress policy (allowOut, denyOut, rules)", 204,
     (400, 401, 404, 409)),
    ("post", "/sandboxes/{sandboxID}/pause", "Pause (memory kept unless memory=false)", 204, (401, 404, 409)),
    ("post", "/sandboxes/{sandboxID}/resume", "Resume a paused sandbox (deprecated: connect)", 201, (401, 404, 409)),
    ("post", "/sandboxes/{sandboxID}/fork", "Fork into 1-20 independent children", 201, (400, 401, 404, 409)),
    ("post", "/sandboxes/{sandboxID}/snapshots", "Snapshot a sandbox; it keeps running", 201, (400, 401, 404, 409)),
    ("get", "/snapshots", "List snapshots (sandboxID, name, limit, nextToken)", 200, (400, 401)),
    ("get", "/snapshots/{snapshotID}", "Get a snapshot", 200, (401, 404)),
    ("delete", "/snapshots/{snapshotID}", "Delete a snapshot", 204, (401, 404)),
    ("get", "/templates", "List templates", 200, (401,)),
    ("get", "/v2/templates", "List templates", 200, (401,)),
    ("get", "/templates/{templateID}", "Get a template with its builds", 200, (401, 404)),
    ("delete", "/templates/{templateID}", "Delete a template (409 while a sandbox uses it)", 204, (401, 404, 409)),
    ("post", "/v3/templates", "Request a template build (name, cpuCount, memoryMB, tags)", 202, (400, 401, 409)),
    ("get", "/templates/aliases/{alias}", "Whether a template has this name", 200, (401, 404)),
    ("get", "/templates/{templateID}/files/{filesHash}", "Upload link for a COPY step's files", 201,
     (400, 401, 404)),
    ("put", "/warren/uploads/{templateID}/{filesHash}", "Upload a COPY step's files (tar)", 201, (400, 401, 404)),
    ("post", "/v2/templates/{templateID}/builds/{buildID}", "Start a build (fromImage/fromTemplate, steps)", 202,
     (400, 401, 404, 409)),
    ("get", "/templates/{templateID}/builds/{buildID}/status", "Build status and logs (logsOffset, limit)", 200,
     (400, 401, 404)),
    ("post", "/warren/images/pull", "Pull an image into a new template (NDJSON progress)", 200, (400, 401, 409)),
    ("post", "/warren/templates/import", "Import a rootfs directory as a template", 201, (400, 401, 403, 409)),
    ("get", "/runtimes", "Runtimes by hash: class, default flag, prewarm state", 200, (401,)),
    ("post", "/warren/runtimes", "Register a runtime record in the durable index", 201, (400, 401, 500)),
    ("post", "/warren/runtimes/reload", "Re-read the node's runtime configs", 200, (400, 401, 500)),
    ("get", "/nodes", "This node's description with its runtime hashes", 200, (401,)),
    ("get", "/nodes/{nodeID}", "One node", 200, (401, 404)),
    ("post", "/warren/templates/{templateID}/pool", "Set a template's warm-pool size", 200, (400, 401, 404)),
    ("get", "/health", "Node health: {status} without auth; runtime probes, pools, limits with X-API-Key", 200, ()),
    ("get", "/openapi.json", "This document (no auth)", 200, ()),
]


def _operation(summary: str, ok: int, errors: tuple[int, ...]) -> dict[str, Any]:
    responses: dict[str, Any] = {str(ok): {"description": "success"}}
    if ok in (200, 201):
        responses[str(ok)]["content"] = {"application/json": {"schema": {}}}
    for status in errors:
        responses[str(status)] = {
            "description": "error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return {"summary": summary, "responses": responses}


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for method, path, summary, ok, errors in _OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(summary, ok, errors)
    return paths


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "warren", "version": "0.1.0", "description": "E2B-compatible sandbox control plane"},
    "components": {
        "schemas": {"Error": _ERROR, "Sandbox": _SANDBOX},
        "securitySchemes": {"ApiKeyAuth": {"type": "apiKey", "in": "header", "name": "X-API-Key"}},
    },
    "security": [{"ApiKeyAuth": []}],
    "paths": _paths(),
}
