"""JSON columns of the records: each typed sub-record to a JSON object and back.

Reading is lenient about absent keys (a default takes their place) and strict about types that
cannot be right (a ``ValueError`` from an enum), so a record written by an older node still reads.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .records import (
    CacheEntry,
    EgressPolicy,
    HostRule,
    ImageConfig,
    IngressPolicy,
    LifecyclePolicy,
    NetworkConfig,
    OnTimeout,
    PauseMode,
    Provenance,
    Requested,
    RuntimeBinding,
    UpstreamProxy,
)


def image_to_json(image: ImageConfig) -> str:
    return _dump({"layers": list(image.layers), "env": image.env, "workdir": image.workdir, "user": image.user})


def image_of(raw: dict[str, Any]) -> ImageConfig:
    return ImageConfig(
        layers=tuple(str(p) for p in raw.get("layers") or ()),
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        workdir=_opt_str(raw.get("workdir")),
        user=_opt_str(raw.get("user")),
    )


def policy_to_json(policy: LifecyclePolicy) -> str:
    return _dump(
        {"on_timeout": policy.on_timeout.value, "auto_resume": policy.auto_resume, "pause_memory": policy.pause_memory}
    )


def policy_of(raw: dict[str, Any]) -> LifecyclePolicy:
    return LifecyclePolicy(
        on_timeout=OnTimeout(raw.get("on_timeout") or OnTimeout.KILL.value),
        auto_resume=bool(raw.get("auto_resume", False)),
        pause_memory=bool(raw.get("pause_memory", True)),
    )


def binding_to_json(binding: RuntimeBinding) -> str:
    mode = binding.pause_mode.value if binding.pause_mode is not None else None
    return _dump({"runtime_hash": binding.runtime_hash, "init_pid": binding.init_pid, "pause_mode": mode,
                  "restore_dir": binding.restore_dir})  # fmt: skip


def binding_of(raw: dict[str, Any]) -> RuntimeBinding:
    pid = raw.get("init_pid")
    mode = raw.get("pause_mode")
    return RuntimeBinding(
        runtime_hash=_opt_str(raw.get("runtime_hash")),
        init_pid=int(pid) if pid is not None else None,
        pause_mode=PauseMode(mode) if mode is not None else None,
        restore_dir=_opt_str(raw.get("restore_dir")),
    )


def ingress_to_json(ingress: IngressPolicy) -> str:
    return _dump({"public": ingress.public, "traffic_token": ingress.traffic_token})


def ingress_of(raw: dict[str, Any]) -> IngressPolicy:
    return IngressPolicy(public=bool(raw.get("public", True)), traffic_token=_opt_str(raw.get("traffic_token")))


def requested_to_json(req: Requested) -> str:
    net = req.network
    network = None
    if net is not None:
        network = {
            "allow_public_traffic": net.allow_public_traffic,
            "allow_out": list(net.allow_out) if net.allow_out is not None else None,
            "deny_out": list(net.deny_out) if net.deny_out is not None else None,
        }
    return _dump({"allow_internet_access": req.allow_internet_access, "network": network})


def requested_of(raw: dict[str, Any]) -> Requested:
    allow = raw.get("allow_internet_access")
    net = raw.get("network")
    network = None
    if isinstance(net, dict):
        public = net.get("allow_public_traffic")
        network = NetworkConfig(
            allow_public_traffic=bool(public) if public is not None else None,
            allow_out=_strs(net["allow_out"]) if net.get("allow_out") is not None else None,
            deny_out=_strs(net["deny_out"]) if net.get("deny_out") is not None else None,
        )
    return Requested(allow_internet_access=bool(allow) if allow is not None else None, network=network)


def egress_json(egress: EgressPolicy) -> dict[str, Any]:
    return {
        "allow_out": list(egress.allow_out),
        "deny_out": list(egress.deny_out),
        "rules": [{"host": r.host, "headers": [list(h) for h in r.headers]} for r in egress.rules],
        "dns_servers": list(egress.dns_servers) if egress.dns_servers is not None else None,
        "upstream": dataclasses.asdict(egress.upstream) if egress.upstream is not None else None,
    }


def egress_to_json(egress: EgressPolicy) -> str:
    return _dump(egress_json(egress))


def egress_of(raw: dict[str, Any]) -> EgressPolicy:
    rules = tuple(
        HostRule(str(r.get("host")), tuple((str(h[0]), str(h[1])) for h in r.get("headers") or () if len(h) == 2))
        for r in raw.get("rules") or () if isinstance(r, dict)
    )
    dns = raw.get("dns_servers")
    up = raw.get("upstream")
    upstream = None
    if isinstance(up, dict) and up.get("address"):
        upstream = UpstreamProxy(
            address=str(up["address"]), username=_opt_str(up.get("username")), password=_opt_str(up.get("password")),
            tls=bool(up.get("tls", False)), server_name=_opt_str(up.get("server_name")),
            ca_cert=_opt_str(up.get("ca_cert")),
        )
    return EgressPolicy(
        upstream=upstream,
        allow_out=_strs(raw.get("allow_out")),
        deny_out=_strs(raw.get("deny_out")),
        rules=rules,
        dns_servers=_strs(dns) if dns is not None else None,
    )


def provenance_json(p: Provenance) -> dict[str, Any]:
    """The JSON object of a template's provenance (also what ``GET /templates/{id}`` shows as ``build``);
    keys that do not apply to how it was made are left out."""
    out: dict[str, Any] = {
        "build_id": p.build_id, "built_at": p.built_at, "build_count": p.build_count, "source": p.source,
        "steps": p.steps, "cache": [{"key": c.key, "layers": list(c.layers)} for c in p.cache], "layer": p.layer,
        "files": list(p.files), "tags": list(p.tags), "shell": p.shell, "pulled": p.pulled,
        "diff_ids": list(p.diff_ids), "entrypoint": list(p.entrypoint), "cmd": list(p.cmd),
    }
    return {k: v for k, v in out.items() if k == "build_count" or v != _UNSET.get(k)}


_UNSET: dict[str, Any] = {"build_id": None, "built_at": None, "source": {}, "steps": 0, "cache": [], "layer": None,
                          "files": [], "tags": [], "shell": None, "pulled": False, "diff_ids": [], "entrypoint": [],
                          "cmd": []}
"""Values that say nothing; left out of the JSON, as the dicts that came before these records left them out."""


def provenance_to_json(p: Provenance) -> str:
    return _dump(provenance_json(p))


def provenance_of(raw: dict[str, Any]) -> Provenance:
    built_at = raw.get("built_at")
    return Provenance(
        build_id=_opt_str(raw.get("build_id")),
        built_at=float(built_at) if built_at is not None else None,
        build_count=int(raw.get("build_count", 1)),
        source={str(k): str(v) for k, v in (raw.get("source") or {}).items()},
        steps=int(raw.get("steps", 0)),
        cache=tuple(CacheEntry(str(e.get("key")), tuple(str(x) for x in e.get("layers") or ()))
                    for e in raw.get("cache") or () if isinstance(e, dict)),
        layer=_opt_str(raw.get("layer")),
        files=_strs(raw.get("files")),
        tags=_strs(raw.get("tags")),
        shell=_opt_str(raw.get("shell")),
        pulled=bool(raw.get("pulled", False)),
        diff_ids=_strs(raw.get("diff_ids")),
        entrypoint=_strs(raw.get("entrypoint")),
        cmd=_strs(raw.get("cmd")),
    )


def _strs(value: object) -> tuple[str, ...]:
    return tuple(str(x) for x in value) if isinstance(value, list | tuple) else ()


def load(text: str | None) -> dict[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
