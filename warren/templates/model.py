"""What the template build modules share: a build's record, its failure, and the names and defaults.

build.py     ``BuildService``: the facade the API and the node use; the queue of builds
executor.py  one build: its base, the cache, the build sandbox, the seal, the template record
runner.py    the steps of a build, run in its sandbox through the guest agent
sandbox.py   a build sandbox's life: start, agent ready, stop
seal.py      a stopped build sandbox's filesystem becomes a read-only layer
pulls.py     image pulls (slots, progress, error messages)
layers.py    pins, the gc lock and layer garbage collection
records.py   template records: names, ids, resources, the records a build or pull writes, deletion
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from warren.errors import WarrenError
from warren.templates.buildlog import BuildLog

LAYER_PREFIX = "build-"
"""Layers a build sealed: ``state_dir/layers/build-<key>-<rand>/``; ``.tmp-build-…`` while being sealed."""
SANDBOX_PREFIX = "bld"
"""Build sandboxes' ids (never listed by the manager; stopped at node start when a crash left them)."""
BASE_STEP = "base"
FINALIZE_STEP = "finalize"
DEFAULT_CPU = 2
DEFAULT_MEMORY_MB = 512
DEFAULT_DISK_MB = 2048


class BuildFailed(WarrenError):
    """A build step (or its base) failed; ``step`` is the SDK's step name (``base``, ``"3"``, ``finalize``)."""

    def __init__(self, message: str, step: str | None = None) -> None:
        super().__init__(message)
        self.step = step


@dataclass
class Build:
    """One requested build, from ``POST /v3/templates`` until some time after it finished."""

    template_id: str
    build_id: str
    name: str
    cpu_count: int
    memory_mb: int
    tags: tuple[str, ...]
    runtime: str | None
    created_at: float
    log: BuildLog
    finished_at: float | None = None
    task: asyncio.Task[None] | None = None
    base_template_id: str | None = None
    files: set[str] = field(default_factory=set)

    @property
    def running(self) -> bool:
        """Started and not finished (a build only requested holds nothing)."""
        return self.task is not None and not self.log.status.finished


__all__ = [
    "BASE_STEP",
    "DEFAULT_CPU",
    "DEFAULT_DISK_MB",
    "DEFAULT_MEMORY_MB",
    "FINALIZE_STEP",
    "LAYER_PREFIX",
    "SANDBOX_PREFIX",
    "Build",
    "BuildFailed",
]
