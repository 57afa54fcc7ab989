"""Node settings: read once by the CLI (or a test) and passed down explicitly."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
    api_key: str | None = None
    """Overrides the key generated into the state dir (``WARREN_API_KEY``)."""
    default_timeout_s: int = 300
    max_timeout_s: int = 24 * 3600
    network_cidr: str = "10.77.0.0/16"
    node_name: str = "warren"
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
    """How long sandbox creation waits for a template's ready command to succeed."""
    import_roots: tuple[Path, ...] = ()
    """Directories ``/warren/templates/import`` may read from (``WARREN_IMPORT_ROOTS``, colon-separated);
    empty: the cache dir only. See :meth:`allowed_import_roots`."""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, state_dir: Path, **overrides: object) -> Settings:
        """Settings with ``WARREN_*`` environment values applied, then explicit overrides."""
        env: dict[str, object] = {}
        for var, (name, parse) in _ENV.items():
            if raw := os.environ.get(var):
                env[name] = parse(raw)
        if stall := os.environ.get("WARREN_TEST_STALL"):
            env["extra"] = {"test_stall": stall}
        env.update({k: v for k, v in overrides.items() if v is not None})
        return cls(state_dir=state_dir, **env)  # type: ignore[arg-type]

    def allowed_import_roots(self) -> tuple[Path, ...]:
        """The import roots in force: ``import_roots``, or the cache dir when none are set."""
        return self.import_roots or (self.cache_dir,)


def _paths(text: str) -> tuple[Path, ...]:
    return tuple(Path(p.strip()) for p in text.split(":") if p.strip())


def _csv(text: str) -> tuple[str, ...]:
    return tuple(h.strip() for h in text.split(",") if h.strip())


_ENV: dict[str, tuple[str, Callable[[str], object]]] = {
    "WARREN_API_KEY": ("api_key", str),
    "WARREN_CACHE_DIR": ("cache_dir", Path),
    "WARREN_RUNSC": ("runsc_path", Path),
    "WARREN_RUNTIMES": ("runtimes_file", Path),
    "WARREN_WARM_POOL": ("warm_pool_size", int),
    "WARREN_LOCK_BUDGET_S": ("lock_budget_s", float),
    "WARREN_SHUTDOWN_CONCURRENCY": ("shutdown_concurrency", int),
    "WARREN_REGISTRY_MIRRORS": ("registry_mirrors", lambda text: parse_mirrors(text)),
    "WARREN_INSECURE_REGISTRIES": ("insecure_registries", _csv),
    "WARREN_REGISTRY_AUTH": ("registry_auth_file", Path),
    "WARREN_IMPORT_ROOTS": ("import_roots", _paths),
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
