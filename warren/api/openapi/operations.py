"""Every operation the node serves: method, path, body, query, answers. The document is built from
this table (``document.py``) and a unit test checks it against the router, both ways."""

from __future__ import annotations

from dataclasses import dataclass, field

from .schemas import INT, STR, Schema, array, ref

_LIMIT: Schema = {"type": "integer", "minimum": 1, "maximum": 1000}
_LIST_QUERY: dict[str, Schema] = {
    "metadata": STR, "state": STR, "limit": _LIMIT, "nextToken": STR,
    "order": {"type": "string", "enum": ["asc", "desc"]}, "startedAfter": {"type": "string", "format": "date-time"},
    "template": STR,
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    ok: int
    errors: tuple[int, ...]
    body: Schema | None = None
    """The JSON request body's schema; None: the operation takes none."""
    body_required: bool = False
    answer: Schema | None = None
    """The success answer's JSON schema; None: no body (204) or not JSON."""
    query: dict[str, Schema] = field(default_factory=dict)
    public: bool = False
    """No API key needed."""
    raw_body: str | None = None
    """A non-JSON body's media type (an upload)."""
    path_schemas: dict[str, Schema] = field(default_factory=dict)
    """Path parameters with more than ``type: string`` to say."""
    raw_answer: str | None = None
    """A non-JSON success answer's media type (Prometheus's text format)."""


_SANDBOX = ref("Sandbox")
_AUTH = (401,)

OPERATIONS: tuple[Operation, ...] = (
    # ----- sandboxes
    Operation("post", "/sandboxes", "Create a sandbox (v1)", 201, (400, 401, 404, 409, 429, 503),
              body=ref("NewSandbox"), body_required=True, answer=_SANDBOX),
    Operation("post", "/v2/sandboxes", "Create a sandbox", 201, (400, 401, 404, 409, 429, 503),
              body=ref("NewSandbox"), body_required=True, answer=_SANDBOX),
    Operation("get", "/sandboxes", "List running sandboxes (v1; metadata, order, startedAfter, template)", 200,
              (400, 401), answer=array(ref("ListedSandbox")), query=_LIST_QUERY),
    Operation("get", "/v2/sandboxes", "List sandboxes, newest first (state, order, startedAfter, template)", 200,
              (400, 401), answer=array(ref("ListedSandbox")), query=_LIST_QUERY),
    Operation("get", "/sandboxes/{sandboxID}", "Get a sandbox", 200, (401, 404), answer=ref("SandboxDetail")),
    Operation("delete", "/sandboxes/{sandboxID}", "Kill a sandbox", 204, (401, 404)),
    Operation("post", "/sandboxes/{sandboxID}/timeout", "Set the sandbox timeout (from now)", 204, (400, 401, 404),
              body=ref("SandboxTimeout"), body_required=True),
    Operation("post", "/sandboxes/{sandboxID}/connect", "Connect: resume a paused sandbox or extend a running one (v1)",
              200, (400, 401, 404, 409, 429), body=ref("ConnectSandbox"), answer=_SANDBOX),
    Operation("post", "/v2/sandboxes/{sandboxID}/connect", "Connect: resume a paused sandbox or extend a running one",
              200, (400, 401, 404, 409, 429), body=ref("ConnectSandbox"), answer=_SANDBOX),
    Operation("get", "/sandboxes/{sandboxID}/metrics", "Sandbox metrics: 5 s samples (start, end: unix seconds)",
              200, (400, 401, 404), answer=array(ref("SandboxMetric")), query={"start": INT, "end": INT}),
    Operation("get", "/v2/sandboxes/{sandboxID}/logs", "The start command's output and the agent's log", 200,
              (400, 401, 404), answer=ref("SandboxLogsV2Response"),
              query={"cursor": {"type": "integer", "minimum": 0},
                     "limit": {"type": "integer", "minimum": 0, "maximum": 1000},
                     "direction": {"type": "string", "enum": ["forward", "backward"]},
                     "level": {"type": "string", "enum": ["debug", "info", "warn", "error"]},
                     "search": {"type": "string", "maxLength": 256}}),
    Operation("get", "/sandboxes/{sandboxID}/logs", "The start command's output and the agent's log (v1)", 200,
              (400, 401, 404), answer=ref("SandboxLogs"),
              query={"start": {"type": "integer", "minimum": 0}, "limit": {"type": "integer", "minimum": 0}}),
    Operation("get", "/sandboxes/metrics", "Newest metrics of up to 100 sandboxes (sandbox_ids)", 200, (400, 401),
              answer=ref("SandboxesWithMetrics"), query={"sandbox_ids": STR}),
    Operation("put", "/sandboxes/{sandboxID}/network", "Replace the egress policy (allowOut, denyOut, rules, ...)",
              204, (400, 401, 404, 409), body=ref("SandboxNetworkUpdateConfig")),
    Operation("post", "/sandboxes/{sandboxID}/pause", "Pause (memory kept unless memory=false)", 204,
              (400, 401, 404, 409), body=ref("SandboxPause")),
    Operation("post", "/sandboxes/{sandboxID}/resume", "Resume a paused sandbox (deprecated: connect)", 201,
              (400, 401, 404, 409, 429), body=ref("ResumedSandbox"), answer=_SANDBOX),
    Operation("post", "/sandboxes/{sandboxID}/fork", "Fork into 1-100 children (409: paused)", 201,
              (400, 401, 404, 409, 429), body=ref("SandboxFork"), answer=array(ref("SandboxForkResult"))),
    Operation("post", "/sandboxes/{sandboxID}/snapshots", "Snapshot a sandbox; it keeps running", 201,
              (400, 401, 404, 409), body=ref("SnapshotRequest"), answer=ref("SnapshotInfo")),
    # ----- snapshots
    Operation("get", "/snapshots", "List snapshots (sandboxID, name, limit, nextToken)", 200, (400, 401),
              answer=array(ref("SnapshotInfo")),
              query={"sandboxID": STR, "name": STR, "limit": _LIMIT, "nextToken": STR}),
    Operation("get", "/snapshots/{snapshotID}", "Get a snapshot", 200, (401, 404), answer=ref("SnapshotInfo")),
    Operation("delete", "/snapshots/{snapshotID}", "Delete a snapshot", 204, (401, 404)),
    # ----- templates
    Operation("get", "/templates", "List templates", 200, _AUTH, answer=array(ref("Template"))),
    Operation("get", "/v2/templates", "List templates", 200, _AUTH, answer=array(ref("Template"))),
    Operation("get", "/templates/{templateID}", "Get a template with its builds", 200, (401, 404),
              answer=ref("TemplateWithBuilds")),
    Operation("delete", "/templates/{templateID}", "Delete a template (409 while a sandbox uses it)", 204,
              (401, 404, 409)),
    Operation("post", "/v3/templates", "Request a template build (name, cpuCount, memoryMB, tags)", 202,
              (400, 401, 409, 503), body=ref("TemplateBuildRequestV3"), body_required=True,
              answer=ref("TemplateRequestResponseV3")),
    Operation("get", "/templates/aliases/{alias}", "Whether a template has this name", 200, (400, 401, 404),
              answer=ref("TemplateAliasResponse")),
    Operation("post", "/templates/tags", "Assign tags to the build a name:tag names", 201, (400, 401, 404, 503),
              body=ref("AssignTemplateTagsRequest"), body_required=True, answer=ref("AssignedTemplateTags")),
    Operation("delete", "/templates/tags", "Remove tags from a template (not 'default')", 204, (400, 401, 404, 503),
              body=ref("DeleteTemplateTagsRequest"), body_required=True),
    Operation("get", "/templates/{templateID}/tags", "A template's tags and the builds they name", 200,
              (400, 401, 404, 503), answer=array(ref("TemplateTag"))),
    Operation("get", "/templates/{templateID}/files/{filesHash}", "Upload link for a COPY step's files", 201,
              (400, 401, 404, 503), answer=ref("TemplateBuildFileUpload")),
    Operation("put", "/warren/uploads/{templateID}/{filesHash}", "Upload a COPY step's files (tar)", 201,
              (400, 401, 404, 413, 503), raw_body="application/octet-stream", answer=ref("FilesUploaded")),
    Operation("post", "/v2/templates/{templateID}/builds/{buildID}", "Start a build (fromImage/fromTemplate, steps)",
              202, (400, 401, 404, 409, 503), body=ref("TemplateBuildStartV2"), body_required=True),
    Operation("get", "/templates/{templateID}/builds/{buildID}/status", "Build status and logs (logsOffset, limit)",
              200, (400, 401, 404, 503), answer=ref("TemplateBuildInfo"),
              query={"logsOffset": {"type": "integer", "minimum": 0}, "limit": {"type": "integer", "minimum": 0}}),
    # ----- warren's own
    Operation("post", "/warren/images/pull", "Pull an image into a new template (NDJSON progress)", 200,
              (400, 401, 409, 413, 503), body=ref("ImagePull"), body_required=True),
    Operation("post", "/warren/templates/ensure", "Build or import a built-in template (NDJSON progress)", 200,
              (400, 401, 404, 503), body=ref("TemplateEnsure"), body_required=True),
    Operation("post", "/warren/sandboxes/{sandboxID}/adopt", "Hold a sandbox another node parked (cluster moves)",
              201, (401, 404, 409, 503), answer=ref("Sandbox")),
    Operation("post", "/warren/sandboxes/{sandboxID}/release", "Drop this node's copy of a sandbox that moved",
              204, (401, 404, 409)),
    Operation("post", "/warren/templates/import", "Import a rootfs directory as a template", 201,
              (400, 401, 403, 409), body=ref("TemplateImport"), body_required=True, answer=ref("Template")),
    Operation("post", "/warren/templates/{templateID}/pool", "Set a template's warm-pool size", 200, (400, 401, 404),
              body=ref("PoolSize"), body_required=True, answer={"type": "object"}),
    Operation("get", "/runtimes", "Runtimes by hash: class, default flag, prewarm state", 200, _AUTH,
              answer=array(ref("Runtime"))),
    Operation("post", "/warren/runtimes", "Register a runtime record in the durable index", 201, (400, 401, 500),
              body=ref("RuntimeRecord"), body_required=True, answer={"type": "object"}),
    Operation("post", "/warren/runtimes/reload", "Re-read the node's runtime configs", 200, (400, 401, 500),
              answer=array(ref("Runtime"))),
    Operation("get", "/nodes", "This node's description with its runtime hashes", 200, _AUTH,
              answer=array(ref("Node"))),
    Operation("get", "/nodes/{nodeID}", "One node", 200, (401, 404), answer=ref("Node")),
    Operation("get", "/health", "Node health: {status} without auth; runtime probes, pools, limits with X-API-Key",
              200, (), answer=ref("Health"), public=True),
    Operation("get", "/metrics", "Prometheus metrics, text format (no auth unless WARREN_METRICS_PUBLIC=0)", 200,
              (401,), raw_answer="text/plain", public=True),
    Operation("get", "/openapi.json", "This document (no auth)", 200, (), answer={"type": "object"}, public=True),
)


def operation_ids() -> set[tuple[str, str]]:
    return {(op.method.upper(), op.path) for op in OPERATIONS}


__all__ = ["OPERATIONS", "Operation", "operation_ids"]


