"""``SandboxManager``: every sandbox of this node, composed of the layered operation sets.

    ManagerCore      records, routes, create (template, snapshot, warm pool), kill, timeouts, metrics
    LifecycleOps     pause, resume, connect, auto-resume, TTL expiry, exit reaping, recovery
    SnapshotOps      snapshots, forks, gVisor templates sealed as memory snapshots
"""

from __future__ import annotations

from .core import AGENT_PORT, MAX_FORKS, new_sandbox_id, template_snapshot_name
from .snapshotting import SnapshotOps


class SandboxManager(SnapshotOps):
    """Owns every sandbox of this node."""


__all__ = ["AGENT_PORT", "MAX_FORKS", "SandboxManager", "new_sandbox_id", "template_snapshot_name"]
