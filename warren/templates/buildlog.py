"""A build's log and status as the E2B SDK polls them, pure.

``GET /templates/{id}/builds/{buildID}/status?logsOffset=N&limit=L`` answers the entries from ``N``
on (at most ``L``, default 100). The SDK advances ``logsOffset`` by the number it got and, once the
status is ``ready`` or ``error``, keeps polling until an answer holds no entries: so entries are
only ever appended, and a finished build's last entries are served like any others.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_ENTRIES = 20_000
"""A build that prints more keeps its first entries and a note; the SDK would take minutes to drain more."""
MAX_LINE = 4096
REASON_TAIL = 20
"""How many of the failing step's entries ``reason.logEntries`` repeats."""


class BuildStatus(enum.StrEnum):
    WAITING = "waiting"
    BUILDING = "building"
    READY = "ready"
    ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in (BuildStatus.READY, BuildStatus.ERROR)


def rfc3339(ts: float) -> str:
    frac = f"{ts % 1:.6f}"[1:]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + frac + "Z"


@dataclass(frozen=True)
class LogEntry:
    timestamp: float
    level: str
    message: str
    step: str | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"timestamp": rfc3339(self.timestamp), "level": self.level, "message": self.message}
        if self.step is not None:
            out["step"] = self.step
        return out


@dataclass
class BuildLog:
    """Append-only entries plus the build's status and failure reason."""

    clock: Callable[[], float] = time.time
    entries: list[LogEntry] = field(default_factory=list)
    status: BuildStatus = BuildStatus.WAITING
    reason: str | None = None
    reason_step: str | None = None
    dropped: int = 0

    def add(self, message: str, *, level: str = "info", step: str | None = None, always: bool = False) -> None:
        if len(self.entries) >= MAX_ENTRIES and not always:
            if not self.dropped:
                self.entries.append(LogEntry(self.clock(), "warn", f"(log truncated after {MAX_ENTRIES} entries)"))
            self.dropped += 1
            return
        if len(message) > MAX_LINE:
            message = message[:MAX_LINE] + f"... ({len(message) - MAX_LINE} more characters)"
        self.entries.append(LogEntry(self.clock(), level, message, step))

    def fail(self, message: str, step: str | None = None) -> None:
        """Finish as ``error``; the reason is also the last log entry."""
        self.add(message, level="error", step=step, always=True)
        self.status = BuildStatus.ERROR
        self.reason = message
        self.reason_step = step

    def succeed(self, message: str = "Build finished") -> None:
        self.add(message, always=True)
        self.status = BuildStatus.READY

    def page(self, offset: int, limit: int | None) -> list[LogEntry]:
        """Entries ``[offset, offset + limit)``; an offset past the end gives none."""
        size = DEFAULT_PAGE if limit is None else max(0, min(limit, MAX_PAGE))
        start = max(0, offset)
        return self.entries[start : start + size]

    def body(self, template_id: str, build_id: str, offset: int, limit: int | None) -> dict[str, Any]:
        """The ``TemplateBuildInfo`` the SDK parses."""
        entries = self.page(offset, limit)
        out: dict[str, Any] = {
            "templateID": template_id,
            "buildID": build_id,
            "status": self.status.value,
            "logEntries": [e.body() for e in entries],
            "logs": [f"[{rfc3339(e.timestamp)}] {e.message}" for e in entries],
        }
        if self.status is BuildStatus.ERROR:
            reason: dict[str, Any] = {"message": self.reason or "build failed"}
            if self.reason_step is not None:
                reason["step"] = self.reason_step
                tail = [e for e in self.entries if e.step == self.reason_step][-REASON_TAIL:]
                reason["logEntries"] = [e.body() for e in tail]
            out["reason"] = reason
        return out


__all__ = ["DEFAULT_PAGE", "MAX_ENTRIES", "BuildLog", "BuildStatus", "LogEntry", "rfc3339"]
