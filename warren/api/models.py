"""E2B wire shapes: request parsing and response bodies. No I/O."""

from __future__ import annotations

import datetime
import json
import math
import time
from typing import Any
from urllib.parse import parse_qsl, unquote

from ..errors import InvalidRequestError
from ..ints import parse_optional_int
from ..orchestrator.metrics import MetricSample
from ..orchestrator.requests import CreateRequest, Lifecycle, ListQuery, Order
from ..orchestrator.states import SandboxState, public_state
from ..snapshots import SnapshotManifest
from ..store import NetworkConfig, OnTimeout, PauseMode, Requested, SandboxRecord, TemplateRecord, build_id_of
from .network import egress_body, parse_egress

ENVD_VERSION = "0.6.4"
"""The envd version the guest agent implements; the SDK unlocks features up to it."""
CLIENT_ID = "warren"
NO_DOMAIN = "no-domain.set-e2b-sandbox-url.invalid"
"""The ``domain`` answered by a node without ``--domain`` (header mode). Null would send the SDK to its
default, E2B's own cloud; a name under ``.invalid`` (RFC 2606: never resolves) fails at once, naming
what to do. ``E2B_SANDBOX_URL`` takes precedence over it in the SDK, so header mode works as before."""


def answered_domain(domain: str | None) -> str:
    return domain if domain is not None else NO_DOMAIN


def parse_json_object(raw: bytes, *, allow_empty: bool = True) -> dict[str, Any]:
    if not raw.strip():
        if allow_empty:
            return {}
        raise InvalidRequestError("request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, UnicodeDecodeError, and an integer past Python's digit limit
        # (int_max_str_digits); RecursionError: arrays nested thousands deep.
        raise InvalidRequestError(f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return body


def _str_map(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequestError(f"{key} must be an object of string values")
    return dict(value)


def optional_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{key} must be an integer")
    return value


def parse_create(body: dict[str, Any]) -> CreateRequest:
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise InvalidRequestError("templateID is required")
    secure = body.get("secure", True)
    allow = body.get("allow_internet_access", body.get("allowInternetAccess"))
    if allow is not None and not isinstance(allow, bool):
        raise InvalidRequestError("allow_internet_access must be a boolean")
    network = parse_network(body.get("network"))
    egress = parse_egress(body.get("network"), allow_internet=allow is not False)
    runtime = body.get("runtime")
    if runtime is not None and not isinstance(runtime, str):
        raise InvalidRequestError("runtime must be a string")
    return CreateRequest(
        lifecycle=parse_lifecycle(body),
        template=template,
        timeout_s=optional_int(body, "timeout"),
        metadata=_str_map(body, "metadata"),
        env_vars=_str_map(body, "envVars"),
        secure=secure is not False,
        # allow_internet_access false alone: the veth's no_internet (all dropped); with allowOut entries the
        # per-sandbox egress rules enforce the deny-all and the allowed entries beat it.
        allow_internet=allow is not False or bool(egress.allow_out),
        egress=egress,
        public_traffic=network is None or network.allow_public_traffic is not False,
        runtime=runtime,
        requested=Requested(allow_internet_access=allow, network=network),
    )


_NETWORK_UNSUPPORTED = ("maskRequestHost", "httpsPorts")


def parse_network(value: object) -> NetworkConfig | None:
    """E2B's ``network`` object as the create sent it (``get_info`` shows it): ``allowPublicTraffic`` (false:
    private traffic, a traffic token per sandbox), ``allowOut`` and ``denyOut``. The egress policy itself
    (those lists, ``rules``, ``dnsServers``, ``egressProxy``) is parsed and validated by
    ``network.parse_egress``.
    Anything warren would not enforce is a 400 naming it, never silently ignored."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError("network must be an object")
    for key in _NETWORK_UNSUPPORTED:
        if value.get(key) not in (None, [], {}, ""):
            raise InvalidRequestError(f"network.{key} is not supported by warren")
    public = value.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise InvalidRequestError("network.allowPublicTraffic must be a boolean")
    return NetworkConfig(allow_public_traffic=public, allow_out=_str_list(value, "allowOut"),
                         deny_out=_str_list(value, "denyOut"))


def _str_list(body: dict[str, Any], key: str) -> tuple[str, ...] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"network.{key} must be a list of strings")
    return tuple(value)


def parse_lifecycle(body: dict[str, Any]) -> Lifecycle:
    """``autoPause``/``autoResume``/``autoPauseMemory`` (SDK 2.63) or a ``lifecycle`` object."""
    auto_pause = body.get("autoPause")
    auto_resume = body.get("autoResume")
    memory = body.get("autoPauseMemory", True)
    if isinstance(lc := body.get("lifecycle"), dict):
        on_timeout = lc.get("onTimeout", lc.get("on_timeout"))
        if isinstance(on_timeout, dict):
            memory = on_timeout.get("mode", "full") != "filesystem"
            on_timeout = on_timeout.get("action")
        auto_pause = on_timeout == "pause" if on_timeout is not None else auto_pause
        auto_resume = lc.get("autoResume", lc.get("auto_resume", auto_resume))
    if isinstance(auto_resume, dict):
        auto_resume = auto_resume.get("enabled", False)
    for name, value in (("autoPause", auto_pause), ("autoResume", auto_resume), ("autoPauseMemory", memory)):
        if value is not None and not isinstance(value, bool):
            raise InvalidRequestError(f"{name} must be a boolean")
    if auto_resume and not auto_pause:
        raise InvalidRequestError("autoResume needs autoPause (onTimeout: pause)")
    return Lifecycle(
        on_timeout=OnTimeout.PAUSE if auto_pause else OnTimeout.KILL,
        auto_resume=bool(auto_resume),
        pause_memory=memory is not False,
    )


def parse_list_query(params: dict[str, str]) -> ListQuery:
    metadata: dict[str, str] = {}
    if raw := params.get("metadata"):
        metadata = {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}
    states = frozenset({"running", "paused"})
    if raw_state := params.get("state"):
        states = frozenset(s.strip() for s in raw_state.split(",") if s.strip())
        if not states <= {"running", "paused"}:
            raise InvalidRequestError("state must be running and/or paused")
    limit = parse_optional_int(params.get("limit"), "limit", minimum=1, maximum=1000, error=InvalidRequestError)
    raw_order = params.get("order") or Order.DESC.value
    if raw_order not in (Order.ASC.value, Order.DESC.value):
        raise InvalidRequestError("order must be asc or desc")
    return ListQuery(
        metadata=metadata,
        states=states,
        limit=limit,
        next_token=params.get("nextToken") or None,
        order=Order(raw_order),
        started_after=parse_timestamp(params["startedAfter"], "startedAfter") if params.get("startedAfter") else None,
        template=params.get("template") or None,
    )


def parse_timestamp(raw: str, name: str) -> float:
    """An RFC 3339 date-time (``2025-01-02T03:04:05.123Z``, ``+02:00``) as Unix time; without an offset, UTC."""
    try:
        when = datetime.datetime.fromisoformat(raw.strip())
    except ValueError:
        raise InvalidRequestError(f"{name} must be an RFC 3339 date-time, got {raw[:64]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def rfc3339(ts: float) -> str:
    """``ts`` to the microsecond, truncated (never later than ``ts``: ``startedAfter`` of a listed
    ``startedAt`` finds that sandbox)."""
    micros = math.floor(ts * 1_000_000)
    seconds, frac = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:06d}Z"


def sandbox_body(rec: SandboxRecord, domain: str | None) -> dict[str, Any]:
    """The ``Sandbox`` object of create and connect."""
    return {
        "templateID": rec.template_id,
        "sandboxID": rec.id,
        "alias": rec.alias,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": rec.access_token,
        "trafficAccessToken": rec.ingress.traffic_token,
        "domain": answered_domain(domain),
    }


def listed_body(rec: SandboxRecord) -> dict[str, Any]:
    """``ListedSandbox``."""
    return {
        "templateID": rec.template_id,
        "alias": rec.alias,
        "sandboxID": rec.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(rec.started_at),
        "endAt": rfc3339(rec.end_at),
        "cpuCount": rec.cpu_count,
        "memoryMB": rec.memory_mb,
        "diskSizeMB": rec.disk_mb,
        "metadata": rec.metadata,
        "state": public_state(SandboxState(rec.state)),
        "envdVersion": ENVD_VERSION,
        "runtime": rec.runtime,
    }


def detail_body(rec: SandboxRecord, domain: str | None) -> dict[str, Any]:
    """``SandboxDetail``: with what the create asked for (``allowInternetAccess`` null: not set)."""
    out = {
        **listed_body(rec),
        "envdAccessToken": rec.access_token,
        "allowInternetAccess": rec.requested.allow_internet_access,
        "domain": answered_domain(domain),
        "lifecycle": {
            "autoResume": rec.policy.auto_resume,
            "onTimeout": rec.policy.on_timeout.value,
        },
        "pauseMode": "filesystem" if rec.binding.pause_mode is PauseMode.FILESYSTEM else "full",
    }
    network = {**(network_body(rec.requested.network) if rec.requested.network else {}), **egress_body(rec.egress)}
    if rec.requested.network is not None or network:
        out["network"] = network
    return out


def network_body(net: NetworkConfig) -> dict[str, Any]:
    """``SandboxNetworkConfig`` with the keys the create sent."""
    fields = {"allowPublicTraffic": net.allow_public_traffic, "allowOut": net.allow_out, "denyOut": net.deny_out}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items() if v is not None}


def metric_body(m: MetricSample) -> dict[str, Any]:
    """``SandboxMetric``."""
    return {
        "timestamp": rfc3339(m.timestamp),
        "timestampUnix": m.timestamp,
        "cpuCount": m.cpu_count,
        "cpuUsedPct": m.cpu_used_pct,
        "memUsed": m.mem_used,
        "memTotal": m.mem_total,
        "memCache": m.mem_cache,
        "diskUsed": m.disk_used,
        "diskTotal": m.disk_total,
    }


def snapshot_body(m: SnapshotManifest) -> dict[str, Any]:
    return {
        "snapshotID": m.snapshot_id,
        "names": list(m.names),
        "sandboxID": m.source_sandbox_id,
        "templateID": m.template_id,
        "runtime": m.runtime,
        "memory": m.memory,
        "createdAt": rfc3339(m.created_at),
    }


def template_body(rec: TemplateRecord) -> dict[str, Any]:
    """The SDK's ``Template`` (list) shape plus warren's own fields."""
    built = rec.build.built_at or rec.created_at
    return {
        "templateID": rec.id,
        "buildID": build_id_of(rec),
        "names": [rec.name],
        "aliases": [rec.name],
        "public": False,
        "cpuCount": rec.cpu_count,
        "memoryMB": rec.memory_mb,
        "diskSizeMB": rec.disk_mb,
        "createdAt": rfc3339(rec.created_at),
        "updatedAt": rfc3339(float(built)),
        "createdBy": None,
        "lastSpawnedAt": None,
        "spawnCount": 0,
        "buildCount": rec.build.build_count,
        "buildStatus": "ready",
        "envdVersion": ENVD_VERSION,
        "runtime": rec.runtime,
        "layers": list(rec.layers),
        "env": rec.env,
        "workdir": rec.workdir,
        "user": rec.user,
        "startCmd": rec.start_cmd,
        "readyCmd": rec.ready_cmd,
        "source": rec.build.source or None,
        "tags": list(rec.build.tags),
    }
