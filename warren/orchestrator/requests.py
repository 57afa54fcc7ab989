"""Validated inputs of lifecycle operations (the API parses wire JSON into these)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lifecycle:
    """What a timeout does, and whether traffic wakes a paused sandbox."""

    on_timeout: str = "kill"  # "kill" or "pause"
    auto_resume: bool = False
    pause_memory: bool = True  # False: a timeout pauses filesystem-only

    def to_extra(self) -> dict[str, object]:
        return {"on_timeout": self.on_timeout, "auto_resume": self.auto_resume, "pause_memory": self.pause_memory}

    @classmethod
    def of_extra(cls, extra: dict[str, object]) -> Lifecycle:
        return cls(
            on_timeout=str(extra.get("on_timeout", "kill")),
            auto_resume=bool(extra.get("auto_resume", False)),
            pause_memory=bool(extra.get("pause_memory", True)),
        )


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
    lifecycle: Lifecycle | None = None


@dataclass(frozen=True)
class ListQuery:
    metadata: dict[str, str] = field(default_factory=dict)
    states: frozenset[str] = frozenset({"running", "paused"})
    limit: int | None = None
    next_token: str | None = None
