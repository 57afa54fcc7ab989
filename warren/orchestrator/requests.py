"""Validated inputs of lifecycle operations (the API parses wire JSON into these)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CreateRequest:
    template: str
    timeout_s: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    secure: bool = True
    allow_internet: bool = True
    runtime: str | None = None
    """warren extension: ``runc`` or ``gvisor``; defaults to the template's runtime."""


@dataclass(frozen=True)
class ListQuery:
    metadata: dict[str, str] = field(default_factory=dict)
    states: frozenset[str] = frozenset({"running", "paused"})
    limit: int | None = None
    next_token: str | None = None
