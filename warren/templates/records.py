"""Template records: names, ids and resources checked, and the records a build or a pull writes.

Pure: nothing here reads or writes the store (:class:`warren.templates.build.BuildService` does).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from warren import names
from warren.config import Settings
from warren.errors import InvalidRequestError
from warren.ids import new_template_id
from warren.images import PulledImage
from warren.runtime.base import RuntimeKind
from warren.store import CacheEntry, Provenance, TemplateRecord
from warren.templates.model import DEFAULT_CPU, DEFAULT_DISK_MB, DEFAULT_MEMORY_MB, Build
from warren.templates.steps import ROOT, BuildRequest, Metadata, account_name, env_from_image


def validate_name(name: str) -> str:
    """A template name (``warren.names``: the one rule for template and snapshot names)."""
    return names.validate_name(name, "template")


def check_runtime(runtime: str | None) -> None:
    if runtime is not None and runtime not in {k.value for k in RuntimeKind}:
        raise InvalidRequestError(f"unknown runtime {runtime!r}; expected one of {[k.value for k in RuntimeKind]}")


def check_resources(settings: Settings, cpu_count: int | None, memory_mb: int | None) -> None:
    """A template's ``cpuCount``/``memoryMB`` within the node's bounds, else 400 naming the bound (E2B's wording)."""
    for value, what in ((cpu_count, "cpuCount"), (memory_mb, "memoryMB")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidRequestError(f"{what} must be an integer")
    if cpu_count is not None:
        if cpu_count < settings.min_cpu:
            raise InvalidRequestError(f"CPU count must be at least {settings.min_cpu}")
        if cpu_count > settings.max_cpu:
            raise InvalidRequestError(f"CPU count can't be higher than {settings.max_cpu} (WARREN_MAX_CPU)")
    if memory_mb is not None:
        if memory_mb < settings.min_memory_mb:
            raise InvalidRequestError(f"Memory must be at least {settings.min_memory_mb} MiB")
        if memory_mb > settings.max_memory_mb:
            raise InvalidRequestError(
                f"Memory can't be higher than {settings.max_memory_mb} MiB (WARREN_MAX_MEMORY_MB)"
            )


def built_record(
    build: Build,
    req: BuildRequest,
    *,
    previous: TemplateRecord | None,
    runtime: str,
    source: Mapping[str, Any],
    layers: Sequence[str],
    meta: Metadata,
    cache: Sequence[CacheEntry],
    new_layer: Path | None,
    shell: str | None,
    now: float,
) -> TemplateRecord:
    """The template a finished build makes (``previous``: the template's record before it, if any)."""
    return TemplateRecord(
        id=build.template_id,
        name=build.name,
        runtime=runtime,
        layers=tuple(layers),
        env=dict(meta.env),
        workdir=meta.workdir,
        user=meta.user,
        start_cmd=req.start_cmd,
        ready_cmd=req.ready_cmd,
        cpu_count=build.cpu_count,
        memory_mb=build.memory_mb,
        disk_mb=previous.disk_mb if previous else DEFAULT_DISK_MB,
        created_at=previous.created_at if previous else now,
        build=Provenance(
            build_id=build.build_id,
            built_at=now,
            build_count=previous.build.build_count + 1 if previous else 1,
            source={str(k): str(v) for k, v in source.items()},
            steps=len(req.steps),
            cache=tuple(cache),
            layer=str(new_layer) if new_layer else None,
            files=tuple(sorted(build.files)),
            tags=tuple(build.tags),
            shell=shell,
        ),
    )


def pulled_record(pulled: PulledImage, name: str, runtime: str, now: float) -> TemplateRecord:
    """The template an image pull makes: the image's layers, env, workdir and user as they are."""
    return TemplateRecord(
        id=new_template_id(),
        name=name,
        runtime=runtime,
        layers=tuple(str(p) for p in pulled.layers),
        env=env_from_image(pulled.env),
        workdir=pulled.workdir or None,
        user=account_name(pulled.user) if pulled.user else ROOT,
        start_cmd=None,
        ready_cmd=None,
        cpu_count=DEFAULT_CPU,
        memory_mb=DEFAULT_MEMORY_MB,
        disk_mb=DEFAULT_DISK_MB,
        created_at=now,
        build=Provenance(
            build_id=str(uuid.uuid4()),
            source={"image": pulled.reference, "digest": pulled.digest, "config": pulled.config_digest},
            pulled=True,
            diff_ids=tuple(pulled.diff_ids),
            entrypoint=tuple(pulled.entrypoint),
            cmd=tuple(pulled.cmd),
        ),
    )


__all__ = [
    "built_record",
    "check_resources",
    "check_runtime",
    "new_template_id",
    "pulled_record",
    "validate_name",
]
