"""What a node advertises to the cluster, and what the gateways read back: plain records, JSON on the wire.

A node writes a :class:`NodeInfo` with every heartbeat; its sandbox roster (id -> public state) goes
next to it. Gateways see a node as a :class:`NodeView`: its last record, whether its heartbeat is still
live, and the capacity reserved on it by creates in flight.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InvalidRequestError


@dataclass(frozen=True)
class TemplateInfo:
    """A template a node has locally (its layers are on its disk)."""

    id: str
    name: str
    runtime: str
    """The sandbox class it runs on: ``runc`` or ``gvisor``."""


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot a node holds in its repository (``shared``: and in the shared store, so any node can
    start from it)."""

    id: str
    names: tuple[str, ...]
    runtime: str
    runtime_hash: str | None
    shared: bool = False


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    url: str
    """Where gateways reach the node's API and data-plane proxy."""
    max_sandboxes: int
    """The node's cap on sandboxes holding CPU and memory (0: none)."""
    active: int
    """Sandboxes holding a slot of that cap now (creating, running, pausing, resuming)."""
    running: int
    paused: int
    draining: bool
    runtime_classes: tuple[str, ...]
    """Sandbox classes whose runtime is available on the node (``runc``, ``gvisor``)."""
    runtime_hashes: tuple[str, ...]
    """Every runtime hash of the node's runtime index: what restores there can stage (seed 003)."""
    templates: tuple[TemplateInfo, ...] = ()
    snapshots: tuple[SnapshotInfo, ...] = ()
    template_use: dict[str, int] = field(default_factory=dict)
    """Live sandboxes per template id: the locality placement prefers (warm page cache, pool)."""
    allocated_cpu: int = 0
    allocated_memory_mb: int = 0
    heartbeat_at: float = 0.0
    started_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeInfo:
        try:
            raw = json.loads(text)
            return cls(
                **{
                    **{k: v for k, v in raw.items() if k in cls.__dataclass_fields__},
                    "runtime_classes": tuple(raw.get("runtime_classes", ())),
                    "runtime_hashes": tuple(raw.get("runtime_hashes", ())),
                    "templates": tuple(TemplateInfo(**t) for t in raw.get("templates", ())),
                    "snapshots": tuple(
                        SnapshotInfo(**{**s, "names": tuple(s.get("names", ()))}) for s in raw.get("snapshots", ())
                    ),
                    "template_use": {str(k): int(v) for k, v in raw.get("template_use", {}).items()},
                }
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvalidRequestError(f"malformed node record: {exc}") from exc

    def template(self, ref: str) -> TemplateInfo | None:
        """A local template by id or name."""
        return next((t for t in self.templates if ref in (t.id, t.name)), None)

    def snapshot(self, ref: str) -> SnapshotInfo | None:
        """A local snapshot by id or name."""
        return next((s for s in self.snapshots if ref == s.id or ref in s.names), None)


@dataclass(frozen=True)
class NodeView:
    """A node as a gateway sees it."""

    info: NodeInfo
    alive: bool
    reserved: int = 0
    """Creates in flight or not yet in the node's heartbeat (reservations in Redis)."""
    drained: bool = False
    """An admin drained it (``POST /nodes/{id}``): nothing new is placed there."""
    roster_size: int = 0
    """Sandboxes in its roster: the last heartbeat's, plus those created or forked there since."""

    @property
    def node_id(self) -> str:
        return self.info.node_id

    @property
    def status(self) -> str:
        if not self.alive:
            return "stopped" if self.info.draining else "dead"
        return "draining" if self.draining else "ready"

    @property
    def draining(self) -> bool:
        return self.info.draining or self.drained

    @property
    def load(self) -> int:
        return self.info.active + self.reserved

    def body(self, roster: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The ``GET /nodes`` item (with ``roster``: the ``GET /nodes/{id}`` detail)."""
        info = self.info
        out: dict[str, Any] = {
            "nodeID": info.node_id,
            "status": self.status,
            "url": info.url,
            "sandboxCount": info.running + info.paused,
            "runningCount": info.running,
            "pausedCount": info.paused,
            "activeCount": info.active,
            "reserved": self.reserved,
            "maxSandboxes": info.max_sandboxes,
            "allocatedCPU": info.allocated_cpu,
            "allocatedMemoryBytes": info.allocated_memory_mb << 20,
            "runtimeClasses": list(info.runtime_classes),
            "runtimeHashes": list(info.runtime_hashes),
            "templates": [asdict(t) for t in info.templates],
            "heartbeatAt": info.heartbeat_at,
            "startedAt": info.started_at,
        }
        if roster is not None:
            out["sandboxes"] = dict(roster)
            # A dead node's running sandboxes died with it: reported, never silently dropped.
            out["lostSandboxes"] = sorted(s for s, st in roster.items() if st == "running") if not self.alive else []
        return out
