"""Component schemas of the served OpenAPI document: E2B's shapes (names and fields as in e2b-dev/infra
``spec/openapi.yml``, written here from that contract) and warren's own. Objects stay open
(``additionalProperties`` is not restricted): warren adds fields (``runtime``, ``pauseMode``) that E2B
clients ignore, and E2B adds fields in new releases that old warren nodes must not reject."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), description: str = "") -> Schema:
    out: Schema = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    if description:
        out["description"] = description
    return out


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
BOOL: Schema = {"type": "boolean"}
NUM: Schema = {"type": "number"}
TIME: Schema = {"type": "string", "format": "date-time"}
STR_MAP: Schema = {"type": "object", "additionalProperties": STR}
ANY_OBJ: Schema = {"type": "object"}

_RULES: Schema = {"type": "object", "additionalProperties": array(obj({"transform": obj({"headers": STR_MAP})}))}
_EGRESS_PROXY = obj({"address": STR, "username": STR, "password": STR,
                     "tls": nullable(obj({"enabled": BOOL, "serverName": STR, "caCert": STR}))}, ("address",))
_NETWORK = obj({
    "allowPublicTraffic": BOOL,
    "allowOut": array(STR),
    "denyOut": array(STR),
    "dnsServers": array(STR),
    "egressProxy": nullable(_EGRESS_PROXY),
    "maskRequestHost": STR,
    "rules": _RULES,
})
_NETWORK_UPDATE = obj({"allowOut": array(STR), "denyOut": array(STR), "dnsServers": array(STR),
                       "egressProxy": nullable(_EGRESS_PROXY), "rules": _RULES, "allow_internet_access": BOOL})
_LIFECYCLE = obj({"autoResume": BOOL, "onTimeout": {"type": "string", "enum": ["kill", "pause"]}},
                 ("autoResume", "onTimeout"))  # fmt: skip
_LISTED = {
    "templateID": STR, "alias": STR, "sandboxID": STR, "clientID": STR, "startedAt": TIME, "endAt": TIME,
    "cpuCount": INT, "memoryMB": INT, "diskSizeMB": INT, "metadata": STR_MAP,
    "state": {"type": "string", "enum": ["running", "paused"]}, "envdVersion": STR,
    "runtime": {"type": "string", "description": "warren: the isolation runtime (runc, gvisor)"},
}  # fmt: skip
_LISTED_REQUIRED = ("templateID", "sandboxID", "clientID", "startedAt", "cpuCount", "memoryMB", "diskSizeMB",
                    "endAt", "state", "envdVersion")  # fmt: skip
_METRIC = obj(
    {"timestamp": TIME, "timestampUnix": INT, "cpuCount": INT, "cpuUsedPct": NUM, "memUsed": INT, "memTotal": INT,
     "memCache": INT, "diskUsed": INT, "diskTotal": INT},
    ("timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "diskUsed", "diskTotal"),
)  # fmt: skip
_TEMPLATE = obj(
    {"templateID": STR, "buildID": STR, "cpuCount": INT, "memoryMB": INT, "diskSizeMB": INT, "public": BOOL,
     "aliases": array(STR), "names": array(STR), "createdAt": TIME, "updatedAt": TIME,
     "createdBy": nullable(ANY_OBJ), "lastSpawnedAt": nullable(TIME), "spawnCount": INT, "buildCount": INT,
     "envdVersion": STR, "buildStatus": STR, "runtime": STR, "tags": array(STR)},
    ("templateID", "buildID", "cpuCount", "memoryMB", "public", "aliases", "names", "envdVersion"),
)  # fmt: skip
_BUILD = obj({"buildID": STR, "status": STR, "createdAt": TIME, "updatedAt": TIME, "finishedAt": nullable(TIME),
              "cpuCount": INT, "memoryMB": INT, "diskSizeMB": INT, "envdVersion": STR},
             ("buildID", "status", "createdAt", "updatedAt", "cpuCount", "memoryMB"))  # fmt: skip
_STEP = obj({"type": STR, "args": array(STR), "filesHash": STR, "force": BOOL}, ("type",))

SCHEMAS: dict[str, Schema] = {
    "Error": obj({"code": INT, "message": STR}, ("code", "message")),
    # ----- sandboxes (E2B)
    "SandboxNetworkConfig": _NETWORK,
    "SandboxNetworkUpdateConfig": _NETWORK_UPDATE,
    "SandboxLifecycle": _LIFECYCLE,
    "NewSandbox": obj(
        {"templateID": {"type": "string", "minLength": 1}, "timeout": {"type": "integer", "minimum": 0},
         "autoPause": BOOL, "autoResume": obj({"enabled": BOOL}), "secure": BOOL, "allow_internet_access": BOOL,
         "network": ref("SandboxNetworkConfig"), "metadata": STR_MAP, "envVars": STR_MAP,
         "lifecycle": ANY_OBJ, "mcp": nullable(ANY_OBJ),
         "runtime": {"type": "string", "description": "warren: run under this runtime (runc, gvisor)"}},
        ("templateID",),
    ),
    "Sandbox": obj(
        {"templateID": STR, "sandboxID": STR, "alias": nullable(STR), "clientID": STR, "envdVersion": STR,
         "envdAccessToken": nullable(STR), "trafficAccessToken": nullable(STR), "domain": nullable(STR)},
        ("templateID", "sandboxID", "clientID", "envdVersion"),
    ),
    "ListedSandbox": obj({**_LISTED, "alias": nullable(STR)}, _LISTED_REQUIRED),
    "SandboxDetail": obj(
        {**_LISTED, "alias": nullable(STR), "envdAccessToken": nullable(STR), "allowInternetAccess": nullable(BOOL),
         "domain": nullable(STR), "network": nullable(ref("SandboxNetworkConfig")),
         "lifecycle": ref("SandboxLifecycle"),
         "pauseMode": {"type": "string", "enum": ["full", "filesystem"]}},
        _LISTED_REQUIRED,
    ),
    "ConnectSandbox": obj({"timeout": {"type": "integer", "minimum": 0}}),
    "ResumedSandbox": obj({"timeout": {"type": "integer", "minimum": 0}, "autoPause": BOOL}),
    "SandboxTimeout": obj({"timeout": {"type": "integer", "minimum": 0}}, ("timeout",)),
    "SandboxPause": obj({"memory": {"type": "boolean", "description": "false: keep the disk only"}}),
    "SandboxMetric": _METRIC,
    "SandboxLogEntry": obj({"timestamp": TIME, "level": {"type": "string", "enum": ["debug", "info", "warn", "error"]},
                            "message": STR, "fields": STR_MAP}, ("timestamp", "level", "message", "fields")),
    "SandboxLogsV2Response": obj({"logs": array(ref("SandboxLogEntry"))}, ("logs",)),
    "SandboxLogs": obj({"logs": array(obj({"timestamp": TIME, "line": STR}, ("timestamp", "line"))),
                        "logEntries": array(ref("SandboxLogEntry"))}, ("logs", "logEntries")),
    "SandboxesWithMetrics": obj({"sandboxes": {"type": "object", "additionalProperties": _METRIC}}, ("sandboxes",)),
    "SandboxFork": obj({"count": {"type": "integer", "minimum": 1}, "timeout": {"type": "integer", "minimum": 0}}),
    "SandboxForkResult": obj({"sandbox": ref("Sandbox"), "error": ref("Error")}),
    # ----- snapshots
    "SnapshotRequest": obj({"name": STR}),
    "SnapshotInfo": obj(
        {"snapshotID": STR, "names": array(STR), "sandboxID": STR, "templateID": STR, "runtime": STR,
         "memory": BOOL, "createdAt": TIME},
        ("snapshotID", "names"),
    ),
    # ----- templates (E2B)
    "Template": _TEMPLATE,
    "TemplateBuild": _BUILD,
    "TemplateWithBuilds": {"allOf": [_TEMPLATE, obj({"builds": array(ref("TemplateBuild"))}, ("builds",))]},
    "TemplateAliasResponse": obj({"templateID": STR, "public": BOOL}, ("templateID", "public")),
    "AssignTemplateTagsRequest": obj({"target": STR, "tags": array(STR)}, ("target", "tags")),
    "DeleteTemplateTagsRequest": obj({"name": STR, "tags": array(STR)}, ("name", "tags")),
    "AssignedTemplateTags": obj({"tags": array(STR), "buildID": STR}, ("tags", "buildID")),
    "TemplateTag": obj({"tag": STR, "buildID": STR, "createdAt": TIME}, ("tag", "buildID", "createdAt")),
    "TemplateBuildRequestV3": obj(
        {"name": STR, "alias": STR, "tags": array(STR), "cpuCount": INT, "memoryMB": INT, "teamID": STR,
         "runtime": {"type": "string", "description": "warren: the runtime of the template's sandboxes"}},
    ),
    "TemplateRequestResponseV3": obj(
        {"templateID": STR, "buildID": STR, "public": BOOL, "names": array(STR), "tags": array(STR),
         "aliases": array(STR)},
        ("templateID", "buildID", "public", "names", "tags", "aliases"),
    ),
    "TemplateStep": _STEP,
    "TemplateBuildStartV2": obj(
        {"fromImage": STR, "fromTemplate": STR, "fromImageRegistry": ANY_OBJ, "force": BOOL,
         "steps": array(ref("TemplateStep")), "startCmd": STR, "readyCmd": STR},
    ),
    "TemplateBuildInfo": obj(
        {"templateID": STR, "buildID": STR, "status": STR, "logs": array(STR), "logEntries": array(ANY_OBJ),
         "reason": nullable(ANY_OBJ)},
        ("templateID", "buildID", "status"),
    ),
    "TemplateBuildFileUpload": obj({"present": BOOL, "url": nullable(STR), "headers": STR_MAP}, ("present",)),
    # ----- warren's own
    "FilesUploaded": obj({"filesHash": STR, "size": INT}, ("filesHash", "size")),
    "ImagePull": obj({"image": {"type": "string", "minLength": 1}, "name": STR, "runtime": STR}, ("image",)),
    "TemplateEnsure": obj({"name": {"type": "string", "minLength": 1}}, ("name",)),
    "TemplateImport": obj({"path": STR, "name": STR, "runtime": STR}, ("path", "name")),
    "PoolSize": obj({"size": {"type": "integer", "minimum": 0}}, ("size",)),
    "RuntimeRecord": obj(
        {"sandbox_class": STR, "assets": {"type": "object", "additionalProperties": obj({"url": STR, "sha256": STR},
                                                                                       ("url", "sha256"))},
         "options": ANY_OBJ},
        ("sandbox_class",),
        description="A runtime record for the durable index (seed 003); unknown keys are refused",
    ),
    "Node": ANY_OBJ,
    "Runtime": obj({"hash": STR, "class": STR, "default": BOOL, "prewarm": STR, "config": nullable(ANY_OBJ),
                    "options": ANY_OBJ, "registeredAt": NUM}, ("hash", "class")),
    "Health": obj({"status": STR}, ("status",)),
}
