"""JSON columns of a sandbox record: each typed sub-record to a JSON object and back.

Reading is lenient about absent keys (a default takes their place) and strict about types that
cannot be right (a ``ValueError`` from an enum), so a record written by an older node still reads.
"""

from __future__ import annotations

import json
from typing import Any

from .records import ImageConfig, LifecyclePolicy, OnTimeout, PauseMode, RuntimeBinding


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
    return _dump({"runtime_hash": binding.runtime_hash, "init_pid": binding.init_pid, "pause_mode": mode})


def binding_of(raw: dict[str, Any]) -> RuntimeBinding:
    pid = raw.get("init_pid")
    mode = raw.get("pause_mode")
    return RuntimeBinding(
        runtime_hash=_opt_str(raw.get("runtime_hash")),
        init_pid=int(pid) if pid is not None else None,
        pause_mode=PauseMode(mode) if mode is not None else None,
    )


def load(text: str | None) -> dict[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
