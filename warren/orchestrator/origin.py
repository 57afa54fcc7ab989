"""What a new sandbox starts from: a template, or a snapshot (which names its template's layers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..snapshots import SnapshotManifest
from ..store import ImageConfig, TemplateRecord


@dataclass(frozen=True)
class Origin:
    template_id: str
    alias: str | None
    runtime: str
    layers: tuple[str, ...]
    env: dict[str, str]
    workdir: str | None
    user: str | None
    cpu_count: int
    memory_mb: int
    disk_mb: int
    start_cmd: str | None = None
    ready_cmd: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    """Sandbox env vars the origin carries (a snapshot keeps its source's)."""
    snapshot_dir: Path | None = None
    snapshot_id: str | None = None
    agent_token: str | None = None
    """The token the agent inside a memory snapshot still holds; /init must present it to rotate it."""
    runtime_hash: str | None = None
    """The runtime a snapshot was taken under; restoring it needs exactly that runtime."""

    @classmethod
    def of_template(cls, t: TemplateRecord) -> Origin:
        return cls(
            template_id=t.id,
            alias=t.name,
            runtime=t.runtime,
            layers=t.layers,
            env=dict(t.env),
            workdir=t.workdir,
            user=t.user,
            cpu_count=t.cpu_count,
            memory_mb=t.memory_mb,
            disk_mb=t.disk_mb,
            start_cmd=t.start_cmd,
            ready_cmd=t.ready_cmd,
        )

    @classmethod
    def of_snapshot(cls, m: SnapshotManifest, data_dir: Path) -> Origin:
        return cls(
            template_id=m.template_id,
            alias=m.names[0] if m.names else m.snapshot_id,
            runtime=m.runtime,
            layers=m.layers,
            env=dict(m.env),
            workdir=m.workdir,
            user=m.user,
            cpu_count=m.cpu_count,
            memory_mb=m.memory_mb,
            disk_mb=m.disk_mb,
            env_vars=dict(m.env_vars),
            snapshot_dir=data_dir,
            snapshot_id=m.snapshot_id,
            agent_token=m.agent_token if m.memory else None,
            runtime_hash=m.runtime_hash,
        )

    def image(self) -> ImageConfig:
        """What the sandbox record keeps so that resume and snapshot never need the template again."""
        return ImageConfig(layers=self.layers, env=dict(self.env), workdir=self.workdir, user=self.user)
