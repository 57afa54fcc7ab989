"""Validated inputs of lifecycle operations (the API parses wire JSON into these)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..config import Settings
from ..errors import InvalidRequestError
from ..store import EgressPolicy, LifecyclePolicy, Requested

Lifecycle = LifecyclePolicy
"""What a timeout does and whether traffic wakes a paused sandbox (kept on the record as its policy)."""


@dataclass(frozen=True)
class CreateRequest:
    template: str
    timeout_s: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    secure: bool = True
    allow_internet: bool = True
    public_traffic: bool = True
    """False (``network.allowPublicTraffic: false``): ports but envd's need the sandbox's traffic token."""
    runtime: str | None = None
    """warren extension: ``runc`` or ``gvisor``; defaults to the template's runtime."""
    lifecycle: Lifecycle | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """``network.allowOut``/``denyOut``/``rules``; an allowed entry beats a denied one."""
    requested: Requested = field(default_factory=Requested)
    """What the create asked for, as asked (shown by ``get_info``)."""


class Order(enum.StrEnum):
    """Sort direction of a list by start time (E2B's ``OrderDirection``; ``desc`` is the default)."""

    ASC = "asc"
    DESC = "desc"


@dataclass(frozen=True)
class ListQuery:
    metadata: dict[str, str] = field(default_factory=dict)
    states: frozenset[str] = frozenset({"running", "paused"})
    limit: int | None = None
    next_token: str | None = None
    order: Order = Order.DESC
    started_after: float | None = None
    """Only sandboxes started at or after this Unix time."""
    template: str | None = None
    """Only sandboxes of this template (its id or its name)."""


def ttl_seconds(settings: Settings, timeout_s: int | None) -> int:
    """A requested TTL in seconds, defaulted and capped by the settings (400 when negative)."""
    if timeout_s is None:
        return settings.default_timeout_s
    if timeout_s < 0:
        raise InvalidRequestError("timeout must not be negative")
    return min(timeout_s, settings.max_timeout_s)
