"""Frozen records the store returns. They carry data only; behaviour lives in the orchestrator.

A sandbox record is flat columns plus seven typed sub-records, each stored as one JSON column:

    image     ImageConfig      layers, env, workdir, user: what resume and snapshot need of its template
    policy    LifecyclePolicy  what a timeout does, whether traffic wakes it, how a timeout pauses
    binding   RuntimeBinding   the runtime hash it runs on, its init pid, how it was last paused
    origin    str | None       the snapshot it was restored from (``from_snapshot``), if any
    requested Requested        what the create asked for (internet access, network), as asked
    ingress   IngressPolicy    who may reach its ports (E2B's ``allowPublicTraffic`` and traffic token)
    egress    EgressPolicy     where it may connect out (``network.allowOut``/``denyOut``/``rules``)
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field


class OnTimeout(enum.StrEnum):
    """What a sandbox's timeout does."""

    KILL = "kill"
    PAUSE = "pause"


class PauseMode(enum.StrEnum):
    """What a pause keeps (re-exported by ``warren.runtime.base``; defined here, in the lowest layer,
    because a record keeps the mode a sandbox was paused with)."""

    MEMORY = "memory"  # every process keeps its memory: runc freezer, gVisor checkpoint
    FILESYSTEM = "filesystem"  # processes end, the upper dir stays; resume starts the agent afresh


@dataclass(frozen=True)
class ImageConfig:
    """The rootfs and agent defaults a sandbox was made from, so resume and snapshot never need its template."""

    layers: tuple[str, ...] = ()
    """Read-only layer directories, lowest first."""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class LifecyclePolicy:
    """What a timeout does, and whether traffic wakes a paused sandbox."""

    on_timeout: OnTimeout = OnTimeout.KILL
    auto_resume: bool = False
    pause_memory: bool = True
    """False: a timeout pauses filesystem-only."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_timeout", OnTimeout(self.on_timeout))  # "pause" from a caller is PAUSE


@dataclass(frozen=True)
class RuntimeBinding:
    """What ties a sandbox to its runtime on this node."""

    runtime_hash: str | None = None
    """The staged runtime it was made with (seed 003); resume and snapshot restore need exactly it."""
    init_pid: int | None = None
    pause_mode: PauseMode | None = None
    """Recorded with ``pausing``, so a crash mid-pause still knows how to resume."""
    restore_dir: str | None = None
    """A paused sandbox moved here from another node: the snapshot dir its resume restores from (the
    runtime has no sandbox of that id until then)."""


@dataclass(frozen=True)
class NetworkConfig:
    """The ``network`` object a create sent (E2B's ``SandboxNetworkConfig``), the parts warren applies."""

    allow_public_traffic: bool | None = None
    allow_out: tuple[str, ...] | None = None
    deny_out: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Requested:
    """What a create asked for, as it asked (``get_info`` shows it; None: not set at create)."""

    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None


@dataclass(frozen=True)
class IngressPolicy:
    """Who may reach the sandbox's ports other than envd's through the proxy (E2B's private traffic)."""

    public: bool = True
    """False: every request to a port but envd's must carry ``traffic_token`` (``e2b-traffic-access-token``)."""
    traffic_token: str | None = None
    """The token a private sandbox's create and connect answers carry; None for a public one."""


@dataclass(frozen=True)
class HostRule:
    """Headers the egress proxy sets on every HTTP(S) request to ``host`` (an exact name or ``*.suffix``)."""

    host: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class UpstreamProxy:
    """A SOCKS5 proxy a sandbox's outbound TCP is tunneled through (E2B's ``egressProxy``)."""

    address: str
    """``host:port``; the host is re-resolved at every dial and must not be in a blocked range."""
    username: str | None = None
    password: str | None = None
    tls: bool = False
    server_name: str | None = None
    ca_cert: str | None = None
    """PEM CAs that replace the system store for the TLS hop to the proxy."""


@dataclass(frozen=True)
class EgressPolicy:
    """A sandbox's outbound policy, as E2B's ``SandboxNetworkConfig`` says it (already validated).

    ``allow_out`` holds CIDRs (``a.b.c.d/n``) and lowercase domains (``name`` or ``*.suffix``); ``deny_out``
    CIDRs only. Nothing is denied unless ``deny_out`` says so; an allowed entry beats a denied one."""

    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    rules: tuple[HostRule, ...] = ()
    dns_servers: tuple[str, ...] | None = None
    """Resolvers opened when ``allow_out`` names a domain (None: E2B's default, 8.8.8.8)."""
    upstream: UpstreamProxy | None = None

    @property
    def is_open(self) -> bool:
        """Nothing to enforce: no deny entry, no header rule, no upstream proxy."""
        return not self.deny_out and not self.rules and self.upstream is None


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    template_id: str
    alias: str | None
    runtime: str
    state: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: float
    end_at: float
    cpu_count: int
    memory_mb: int
    disk_mb: int
    access_token: str | None
    address: str | None
    allow_internet: bool
    image: ImageConfig = field(default_factory=ImageConfig)
    policy: LifecyclePolicy = field(default_factory=LifecyclePolicy)
    binding: RuntimeBinding = field(default_factory=RuntimeBinding)
    origin: str | None = None
    """The snapshot this sandbox was restored from, if any."""
    requested: Requested = field(default_factory=Requested)
    ingress: IngressPolicy = field(default_factory=IngressPolicy)
    egress: EgressPolicy = field(default_factory=EgressPolicy)


@dataclass(frozen=True)
class CacheEntry:
    """One step-prefix cache key of a build and the layers that prefix made."""

    key: str
    layers: tuple[str, ...]


@dataclass(frozen=True)
class Provenance:
    """How a template was made: by a build (steps, cache keys, its own layer, upload hashes), an image
    pull (the image's digests, entrypoint and cmd), or an import (nothing but a stable build id)."""

    build_id: str | None = None
    built_at: float | None = None
    build_count: int = 1
    source: dict[str, str] = field(default_factory=dict)
    """Where the base came from: ``{"template": name}`` or ``{"image": ref, "digest": ..., "config": ...}``."""
    steps: int = 0
    cache: tuple[CacheEntry, ...] = ()
    layer: str | None = None
    """The layer this build sealed (None: every step came from the cache, or not a build)."""
    files: tuple[str, ...] = ()
    """Hashes of the uploads its COPY steps used (kept while the template exists)."""
    tags: tuple[str, ...] = ()
    shell: str | None = None
    pulled: bool = False
    diff_ids: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


@dataclass(frozen=True)
class TemplateRecord:
    id: str
    name: str
    runtime: str
    layers: tuple[str, ...]
    env: dict[str, str]
    workdir: str | None
    user: str | None
    start_cmd: str | None
    ready_cmd: str | None
    cpu_count: int
    memory_mb: int
    disk_mb: int
    created_at: float
    build: Provenance = field(default_factory=lambda: Provenance())
    """How the template was made (``warren.templates.build``): build id, source, cache keys, own layers."""


def build_id_of(rec: TemplateRecord) -> str:
    """The template's current build id (imported templates get a stable one derived from their id)."""
    value = rec.build.build_id
    return value if value else str(uuid.uuid5(uuid.NAMESPACE_URL, f"warren:template:{rec.id}"))


@dataclass(frozen=True)
class TemplateTag:
    """One tag of a template and the build it points to (E2B's ``TemplateTag``)."""

    tag: str
    build_id: str
    created_at: float
