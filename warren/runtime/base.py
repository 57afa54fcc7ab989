"""The seam between the orchestrator and an isolation backend.

A backend turns a :class:`SandboxSpec` into a running guest agent reachable at
``SandboxHandle.address:SandboxHandle.agent_port`` and tears it down again. It owns every host
resource it makes for that (bundle dir, overlay mount, netns, veth, cgroups, runtime state) and a
failure half-way through :meth:`Runtime.start` removes all of them before the error propagates.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..store.records import EgressPolicy, PauseMode

AGENT_PORT = 49983
"""The port the guest agent listens on inside every sandbox (envd's port)."""

AGENT_MOUNT = "/.agent"
"""Where the read-only guest agent bundle is bind-mounted inside every sandbox."""


class RuntimeKind(enum.StrEnum):
    """Which isolation a sandbox runs under."""

    RUNC = "runc"  # OCI containers through runc: the fast default
    GVISOR = "gvisor"  # gVisor's runsc (ptrace platform): a user-space kernel, checkpoint/restore


class RuntimeState(enum.StrEnum):
    """A backend's view of one sandbox (``Runtime.state``)."""

    RUNNING = "running"
    PAUSED = "paused"  # frozen (runc) or checkpointed (gVisor)
    STOPPED = "stopped"  # its container exists but no process runs (``created`` counts as stopped)


@dataclass(frozen=True)
class RuntimeProbe:
    """What a backend's start-up probe found (``Runtime.probe``); ``/health`` shows :meth:`to_json`."""

    available: bool
    reason: str | None = None
    """Why it is not available (or a note when it is); None when the probe gave none."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """The rest of the probe's findings (kind, binary, version, platform, disk quota...), shown as is."""

    @classmethod
    def of_mapping(cls, found: Mapping[str, Any]) -> RuntimeProbe:
        rest = {k: v for k, v in found.items() if k not in ("available", "reason")}
        reason = found.get("reason")
        return cls(available=bool(found.get("available")), reason=None if reason is None else str(reason), details=rest)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"available": self.available, **self.details}
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Resources:
    """Per-sandbox limits, enforced with cgroups."""

    cpu_count: int = 2
    memory_mb: int = 512
    pids_max: int = 1024
    disk_mb: int = 2048


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to start one sandbox."""

    sandbox_id: str
    runtime: RuntimeKind
    layers: tuple[Path, ...]
    """Read-only rootfs layer directories, lowest (base) first."""
    resources: Resources = field(default_factory=Resources)
    agent_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the guest agent process."""
    allow_internet: bool = True
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """Where it may connect out (per-sandbox nft sets and the node's egress proxy)."""
    runtime_binary: Path | None = None
    """The runtime CLI staged for this sandbox's runtime hash (seed 003); None: the backend's own.

    A backend records it with the sandbox and uses it for every later command on that sandbox
    (stop, pause, checkpoint, restore), so a sandbox keeps the exact runtime it was made with."""
    tmp_tmpfs: bool = False
    """A tmpfs at ``/tmp`` (in memory, mode 1777) instead of the rootfs's directory on the sandbox's disk,
    which is E2B's default and what builds, snapshots, forks and filesystem pauses keep. No template sets
    it yet."""


@dataclass(frozen=True)
class SandboxHandle:
    """Where a started sandbox's agent can be reached."""

    sandbox_id: str
    runtime: RuntimeKind
    address: str
    agent_port: int = AGENT_PORT
    init_pid: int | None = None


@dataclass(frozen=True)
class SnapshotContents:
    """What :meth:`Runtime.snapshot` wrote."""

    memory: bool
    """True when ``checkpoint/`` holds a memory image (processes resume where they were)."""
    runtime: RuntimeKind
    bytes: int
    """Disk space the snapshot directory takes (allocated blocks)."""
    source: SandboxHandle | None = None
    """The source's handle after the snapshot when it is running, else None (paused). A gVisor source is
    checkpointed and restored into a fresh netns, so its ``address`` and ``init_pid`` may have changed."""


@dataclass(frozen=True)
class SandboxStats:
    """Resource counters of one sandbox, read from its cgroups and upper dir."""

    cpu_count: int
    cpu_usage_ns: int
    memory_used: int
    memory_total: int
    memory_cache: int
    disk_used: int
    disk_total: int


class Runtime(Protocol):
    """One isolation backend. Implementations: ``warren.runtime.oci.OciRuntime`` (runc, runsc)."""

    kind: RuntimeKind

    def probe(self) -> RuntimeProbe:
        """What the startup probe found."""
        ...

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Create every host resource and start the agent; do not wait for it to answer.

        Raises ``RuntimeFailure`` after undoing everything it made.
        """
        ...

    async def stop(self, sandbox_id: str) -> None:
        """Kill the sandbox and remove everything it owns. Idempotent; never raises for a missing one."""
        ...

    async def state(self, sandbox_id: str) -> RuntimeState | None:
        """The runtime's view of the sandbox, or None when it does not know it."""
        ...

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """Counters for metrics. Raises ``NotFoundError`` for an unknown sandbox."""
        ...

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None:
        """Stop the sandbox using CPU (MEMORY) or at all (FILESYSTEM); its upper dir is kept.

        A runtime whose memory pause is destructive when it fails (gVisor checkpoint) raises
        ``RuntimeFailure`` after cleaning up; the caller then treats the sandbox as gone.
        """
        ...

    async def resume(self, spec: SandboxSpec, mode: PauseMode) -> SandboxHandle:
        """Undo :meth:`pause`; the address may change (fresh netns for a restore)."""
        ...

    async def locate(self, sandbox_id: str) -> SandboxHandle | None:
        """Where a running sandbox's agent is now (address, init pid), or None when it is not running."""
        ...

    async def export_filesystem(self, sandbox_id: str, dest: Path) -> None:
        """Write the stopped sandbox's filesystem changes, with 0-based owners, into the new directory ``dest``.

        The sandbox must be paused with ``PauseMode.FILESYSTEM``; stop it afterwards (its changes may have
        moved). The result uses overlay whiteouts and opaque xattrs, so it serves as a read-only layer as it
        is (template builds seal it). A failure or cancellation leaves no ``dest``.
        """
        ...

    async def snapshot(self, sandbox_id: str, dest: Path) -> SnapshotContents:
        """Copy a running or paused sandbox into the empty directory ``dest``; the source keeps its state.

        ``dest/upper`` always (the filesystem), ``dest/checkpoint`` when memory is included (gVisor:
        checkpoint, copy, restore the source into a fresh netns; the source's address may change).
        """
        ...

    async def update_egress(self, sandbox_id: str, egress: EgressPolicy) -> None:
        """Enforce ``egress`` for the sandbox from now on (a paused one without a network gets it from the
        spec it resumes with). ``NotFoundError`` for an unknown sandbox."""
        ...

    def egress_ca(self) -> bytes:
        """The PEM certificate of the CA the egress proxy signs intercepted HTTPS with."""
        ...

    async def restore(self, spec: SandboxSpec, snapshot: Path) -> SandboxHandle:
        """Start a new sandbox ``spec.sandbox_id`` from a snapshot directory (read, never modified).

        With a memory image the processes continue where they were; without one, the agent starts
        afresh on a copy of the snapshot's filesystem.
        """
        ...


__all__ = [
    "AGENT_MOUNT",
    "AGENT_PORT",
    "PauseMode",
    "Resources",
    "Runtime",
    "RuntimeKind",
    "RuntimeProbe",
    "RuntimeState",
    "SandboxHandle",
    "SandboxSpec",
    "SandboxStats",
    "SnapshotContents",
]
