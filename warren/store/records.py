"""Frozen records the store returns. They carry data only; behaviour lives in the orchestrator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    template_id: str
    alias: str | None
    runtime: str
    state: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: float
    end_at: float
    cpu_count: int
    memory_mb: int
    disk_mb: int
    access_token: str | None
    address: str | None
    allow_internet: bool
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TemplateRecord:
    id: str
    name: str
    runtime: str
    layers: tuple[str, ...]
    env: dict[str, str]
    workdir: str | None
    user: str | None
    start_cmd: str | None
    ready_cmd: str | None
    cpu_count: int
    memory_mb: int
    disk_mb: int
    created_at: float
    build: dict[str, Any] = field(default_factory=dict)
    """How the template was made (``warren.templates.build``): build id, source, cache keys, own layers."""
