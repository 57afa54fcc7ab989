"""Node settings: read once by the CLI (or a test) and passed down explicitly."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .ints import parse_int

DEFAULT_CACHE_DIR = Path("/var/cache/warren")


@dataclass(frozen=True)
class Settings:
    """Everything a node needs to know at start; nothing reads the environment after this."""

    state_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 3000
    cache_dir: Path = DEFAULT_CACHE_DIR
    runsc_path: Path | None = None
    domain: str | None = None
    """Domain mode: sandboxes at ``https://<port>-<id>.<domain>`` (``:port`` included when not 443), so
    the E2B SDK needs only ``E2B_API_URL`` and ``E2B_DOMAIN``. None: header mode (``E2B_SANDBOX_URL``)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """The operator's certificate (for ``<domain>`` and ``*.<domain>``) and key; with a domain and none
    given, the node makes a CA and a certificate in ``<state_dir>/tls`` (``warren.node_tls``)."""
    api_key: str | None = None
    """Overrides the key generated into the state dir (``WARREN_API_KEY``)."""
    default_timeout_s: int = 300
    max_timeout_s: int = 24 * 3600
    network_cidr: str = "10.77.0.0/16"
    network_table: str = "warren"
    """The nft table of this node's sandboxes (``WARREN_NETWORK_TABLE``); with ``network_prefix`` and
    ``network_cidr`` it lets nodes on one host keep their sandbox networks apart (tests do)."""
    network_prefix: str = ""
    """One letter naming this node's netns and veths (``WARREN_NETWORK_PREFIX=x``: netns ``wrx-<id>``,
    veths ``wx<slot>``); empty: ``wrn-`` and ``wv``."""
    dns_servers: tuple[str, ...] = ()
    """The resolvers sandboxes get (``WARREN_DNS_SERVERS``, comma-separated IPv4); empty: the host's
    non-loopback ones, else 1.1.1.1 and 8.8.8.8."""
    egress_upstream_ca: Path | None = None
    """Extra CA certificates (PEM) the egress proxy trusts for the upstreams of HTTPS hosts that have
    header rules, besides the system store (``WARREN_EGRESS_UPSTREAM_CA``)."""
    node_name: str = "warren"
    """This node's name (``WARREN_NODE_NAME``): its cgroup parent, and what ``GET /nodes`` on it calls it."""
    default_runtime: str = "runc"
    runtimes_file: Path | None = None
    """JSON runtime configs (seed 003); None: one config per local binary (runc, runsc)."""
    warm_pool_size: int = 2
    """Sandboxes kept started per template once it has been used (0: no warm pool)."""
    lock_budget_s: float = 120.0
    """How long start-up keeps retrying a state dir held by another server (seed 001)."""
    shutdown_concurrency: int = 8
    """Sandboxes paused at once when the node stops (seed 000)."""
    registry_mirrors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Registry host -> mirror base URLs tried before it (``WARREN_REGISTRY_MIRRORS``:
    ``docker.io=https://mirror.example,https://m2;ghcr.io=https://m3``)."""
    insecure_registries: tuple[str, ...] = ()
    """Registries reached over plain http besides loopback ones (``WARREN_INSECURE_REGISTRIES``, comma-separated)."""
    registry_auth_file: Path | None = None
    """A docker ``config.json`` with registry credentials (``WARREN_REGISTRY_AUTH``)."""
    build_concurrency: int = 2
    """Template builds that run at once; later ones wait (status ``waiting``)."""
    build_step_timeout_s: float = 3600.0
    """A RUN step still running after this long is killed and fails its build."""
    start_ready_timeout_s: float = 30.0
    """How long sandbox creation (or a warm-pool spare's start) waits for a template's ready command to
    succeed (``WARREN_START_READY_TIMEOUT_S``)."""
    max_sandboxes: int = 100
    """Sandboxes holding CPU and memory at once (creating, running, pausing, resuming; 0: no cap).
    Paused sandboxes do not count, as in E2B; resuming one takes a slot again. Over it, create,
    resume and fork answer 429. Warm-pool spares fill only the free slots and give theirs up to a create."""
    pull_concurrency: int = 2
    """Image pulls that run at once (API pulls and builds from an image); later ones wait their turn."""
    max_layer_bytes: int = 8 << 30
    """Largest compressed image layer a pull accepts, counted as it downloads."""
    max_layer_unpacked_bytes: int = 16 << 30
    """Largest uncompressed image layer (tar stream) a pull accepts, counted as it unpacks."""
    max_upload_bytes: int = 4 << 30
    """Largest build-context upload (``PUT /warren/uploads/...``); over it: 413."""
    min_cpu: int = 1
    max_cpu: int = 8
    """Bounds of a template's ``cpuCount`` (E2B: at least 1, at most the team's limit, 8 by default)."""
    min_memory_mb: int = 128
    max_memory_mb: int = 8192
    """Bounds of a template's ``memoryMB`` in MiB (E2B: at least 128, at most the team's limit)."""
    http_header_timeout_s: float = 10.0
    """A connection that has not sent a complete request head this long after connecting (or after
    the first byte of its next request) is closed: slow-loris clients cannot hold descriptors."""
    http_max_concurrency: int = 1024
    """Open HTTP connections or running requests above which new requests get 503."""
    import_roots: tuple[Path, ...] = ()
    """Directories ``/warren/templates/import`` may read from (``WARREN_IMPORT_ROOTS``, colon-separated);
    empty: the cache dir only. See :meth:`allowed_import_roots`."""
    hardening: bool = True
    """User namespaces (runc), seccomp, a cgroup namespace, fewer capabilities, masked host paths, a high
    OOM score (``WARREN_HARDENING=0`` turns them off: only to measure what they cost)."""
    disk_quota: bool = True
    """Enforce each sandbox's disk size with a size-capped filesystem per sandbox (``WARREN_DISK_QUOTA=0``
    turns it off: the upper dir then lives on the host filesystem, unbounded). See ``warren.runtime.disk``."""
    sandbox_disk_mb: int | None = None
    """When set, the disk size of every sandbox this node starts, instead of its template's ``diskSizeMB``
    (``WARREN_SANDBOX_DISK_MB``)."""
    profile_file: Path | None = None
    """Append the wall-clock phases of API operations to this file as JSON lines (``WARREN_PROFILE``;
    ``bench --profile``). See ``warren.phases``."""
    cluster_redis: str | None = None
    """Redis URL of the cluster this node joins (``--cluster-redis``, ``WARREN_CLUSTER_REDIS``); None: standalone."""
    node_id: str | None = None
    """This node's id in the cluster (``WARREN_NODE_ID``); None: one generated once into the state dir."""
    advertise_url: str | None = None
    """The URL gateways reach this node's API and proxy at (``WARREN_ADVERTISE_URL``); None: the listen address."""
    cluster_heartbeat_s: float = 2.0
    """How often the node writes its membership record into Redis (``WARREN_CLUSTER_HEARTBEAT_S``)."""
    cluster_ttl_s: float = 10.0
    """A node whose last heartbeat is older than this is dead (``WARREN_CLUSTER_TTL_S``)."""
    shared_store: str | None = None
    """Where paused sandboxes and snapshots are shared between nodes (``--shared-store``,
    ``WARREN_SHARED_STORE``): ``file:///mount/path`` (or an absolute path) or ``s3://bucket[/prefix]``;
    see ``warren.snapshots.shared.config``. None: none."""
    metrics_public: bool = True
    """``GET /metrics`` (Prometheus) answers without the API key, as ``/health`` does; ``WARREN_METRICS_PUBLIC=0``
    asks for it (``X-API-Key`` or ``Authorization: Bearer``)."""

    @classmethod
    def from_env(cls, state_dir: Path, **overrides: object) -> Settings:
        """Settings with ``WARREN_*`` environment values applied, then explicit overrides."""
        env: dict[str, object] = {}
        for var, (name, parse) in _ENV.items():
            if raw := os.environ.get(var):
                env[name] = parse_int(raw, var) if parse is int else parse(raw)
        env.update({k: v for k, v in overrides.items() if v is not None})
        return cls(state_dir=state_dir, **env)  # type: ignore[arg-type]

    def allowed_import_roots(self) -> tuple[Path, ...]:
        """The import roots in force: ``import_roots``, or the cache dir when none are set."""
        return self.import_roots or (self.cache_dir,)


def _paths(text: str) -> tuple[Path, ...]:
    return tuple(Path(p.strip()) for p in text.split(":") if p.strip())


def _csv(text: str) -> tuple[str, ...]:
    return tuple(h.strip() for h in text.split(",") if h.strip())


def parse_flag(text: str) -> bool:
    """A ``WARREN_*`` switch: anything but ``0``, ``false``, ``no``, ``off`` (any case) is on."""
    return text.strip().lower() not in ("0", "false", "no", "off")


_ENV: dict[str, tuple[str, Callable[[str], object]]] = {
    "WARREN_API_KEY": ("api_key", str),
    "WARREN_CACHE_DIR": ("cache_dir", Path),
    "WARREN_RUNSC": ("runsc_path", Path),
    "WARREN_DOMAIN": ("domain", str),
    "WARREN_TLS_CERT": ("tls_cert", Path),
    "WARREN_TLS_KEY": ("tls_key", Path),
    "WARREN_RUNTIMES": ("runtimes_file", Path),
    "WARREN_WARM_POOL": ("warm_pool_size", int),
    "WARREN_LOCK_BUDGET_S": ("lock_budget_s", float),
    "WARREN_SHUTDOWN_CONCURRENCY": ("shutdown_concurrency", int),
    "WARREN_REGISTRY_MIRRORS": ("registry_mirrors", lambda text: parse_mirrors(text)),
    "WARREN_INSECURE_REGISTRIES": ("insecure_registries", _csv),
    "WARREN_REGISTRY_AUTH": ("registry_auth_file", Path),
    "WARREN_MAX_SANDBOXES": ("max_sandboxes", int),
    "WARREN_PULL_CONCURRENCY": ("pull_concurrency", int),
    "WARREN_BUILD_CONCURRENCY": ("build_concurrency", int),
    "WARREN_START_READY_TIMEOUT_S": ("start_ready_timeout_s", float),
    "WARREN_MAX_LAYER_BYTES": ("max_layer_bytes", int),
    "WARREN_MAX_LAYER_UNPACKED_BYTES": ("max_layer_unpacked_bytes", int),
    "WARREN_MAX_UPLOAD_BYTES": ("max_upload_bytes", int),
    "WARREN_MIN_CPU": ("min_cpu", int),
    "WARREN_MAX_CPU": ("max_cpu", int),
    "WARREN_MIN_MEMORY_MB": ("min_memory_mb", int),
    "WARREN_MAX_MEMORY_MB": ("max_memory_mb", int),
    "WARREN_HTTP_HEADER_TIMEOUT_S": ("http_header_timeout_s", float),
    "WARREN_HTTP_MAX_CONCURRENCY": ("http_max_concurrency", int),
    "WARREN_HARDENING": ("hardening", lambda text: text.strip().lower() not in ("0", "false", "no", "off")),
    "WARREN_IMPORT_ROOTS": ("import_roots", _paths),
    "WARREN_DISK_QUOTA": ("disk_quota", lambda text: text.strip().lower() not in ("0", "false", "no", "off")),
    "WARREN_SANDBOX_DISK_MB": ("sandbox_disk_mb", int),
    "WARREN_DNS_SERVERS": ("dns_servers", _csv),
    "WARREN_NETWORK_CIDR": ("network_cidr", str),
    "WARREN_NETWORK_TABLE": ("network_table", str),
    "WARREN_NETWORK_PREFIX": ("network_prefix", str),
    "WARREN_EGRESS_UPSTREAM_CA": ("egress_upstream_ca", Path),
    "WARREN_PROFILE": ("profile_file", Path),
    "WARREN_CLUSTER_REDIS": ("cluster_redis", str),
    "WARREN_NODE_ID": ("node_id", str),
    "WARREN_NODE_NAME": ("node_name", str),
    "WARREN_ADVERTISE_URL": ("advertise_url", str),
    "WARREN_CLUSTER_HEARTBEAT_S": ("cluster_heartbeat_s", float),
    "WARREN_CLUSTER_TTL_S": ("cluster_ttl_s", float),
    "WARREN_SHARED_STORE": ("shared_store", str),
    "WARREN_METRICS_PUBLIC": ("metrics_public", parse_flag),
}
"""Environment variable → (Settings field, parser), applied by :meth:`Settings.from_env`."""


def parse_mirrors(text: str) -> dict[str, tuple[str, ...]]:
    """``host=url,url;host2=url`` as ``{host: (url, ...)}``; malformed parts are ignored."""
    out: dict[str, tuple[str, ...]] = {}
    for part in text.split(";"):
        host, sep, urls = part.partition("=")
        if sep and host.strip():
            out[host.strip()] = tuple(u.strip() for u in urls.split(",") if u.strip())
    return out
