"""What the HTTP layer is handed by the node: built in ``warren.node``, never global."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from ..config import Settings
from ..orchestrator.manager import SandboxManager
from ..runtime.registry import RuntimeRegistry
from ..snapshots import SnapshotRepository
from ..store import TemplateRecord, TemplateRepo
from ..templates.build import BuildService
from ..templates.codeinterp import Provisioner
from .metrics import NodeMetrics


@dataclass
class Services:
    settings: Settings
    manager: SandboxManager
    templates: TemplateRepo
    api_key: str
    probes: Callable[[], Mapping[str, Any]]
    import_template: Callable[[Path, str, str | None], Awaitable[TemplateRecord]]
    info: Mapping[str, Any] = field(default_factory=dict)
    snapshots: SnapshotRepository | None = None
    registry: RuntimeRegistry | None = None
    reload_runtimes: Callable[[], Awaitable[None]] | None = None
    builds: BuildService | None = None
    """Template builds, image pulls and template deletion (``warren.templates.build``)."""
    code_interpreter: Provisioner | None = None
    """Builds ``code-interpreter-v1`` on first use (``warren.templates.codeinterp``)."""
    metrics: NodeMetrics | None = None
    """What ``GET /metrics`` serves (``warren.api.metrics``); None: a node built without them (404)."""
    """Static node facts shown at /health (node name, agent bundle path)."""


def services(request: Request) -> Services:
    svc = request.app.state.services
    assert isinstance(svc, Services)
    return svc
