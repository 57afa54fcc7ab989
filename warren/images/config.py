"""How warren reaches registries: credentials, mirrors, plain-http registries, limits.

``RegistryConfig`` is built once (from warren's config and/or a docker ``config.json``) and passed
to every pull; nothing here reads the environment or the user's home directory on its own.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from warren.errors import InvalidRequestError
from warren.images.reference import DOCKER_HUB, DOCKER_HUB_API, normalize_registry


@dataclass(frozen=True)
class Credentials:
    """A registry username and password (or access token used as password)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Endpoint:
    """One place to fetch a registry's content from: a mirror, or the registry itself."""

    base_url: str
    """``scheme://host[:port][/prefix]`` without trailing slash; requests go to ``<base_url>/v2/...``."""
    host: str
    """Normalized host[:port], the key for credentials."""
    mirror: bool


@dataclass(frozen=True)
class RegistryConfig:
    """Registry access settings for pulls."""

    credentials: Mapping[str, Credentials] = field(default_factory=dict)
    """Keyed by registry host[:port] (any spelling ``normalize_registry`` accepts; ``docker.io`` for Hub)."""
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Registry host -> mirror base URLs (``https://mirror.example``), tried in order before the registry."""
    insecure: frozenset[str] = frozenset()
    """Hosts reached over plain http. Loopback hosts (localhost, 127.0.0.0/8, ::1) always are, as in Docker."""
    platform: tuple[str, str] | None = None
    """(os, architecture) to select from image indexes; None means linux and this host's architecture."""
    max_parallel_downloads: int = 3
    max_parallel_unpacks: int = 2
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    retries: int = 3
    """Extra attempts per blob after a dropped connection (each resumes with HTTP Range when possible)."""
    max_layer_bytes: int | None = None
    """Largest compressed layer blob a pull accepts (None: no cap); counted as it downloads."""
    max_layer_unpacked_bytes: int | None = None
    """Largest uncompressed layer tar stream a pull accepts (None: no cap); counted as it unpacks."""
    user_agent: str = "warren/0.1"

    def __post_init__(self) -> None:
        if self.max_parallel_downloads < 1 or self.max_parallel_unpacks < 1 or self.retries < 0:
            raise InvalidRequestError("registry config: parallelism must be >= 1 and retries >= 0")
        norm = {normalize_registry(k): v for k, v in self.credentials.items()}
        object.__setattr__(self, "credentials", norm)
        object.__setattr__(self, "mirrors", {normalize_registry(k): tuple(v) for k, v in self.mirrors.items()})
        object.__setattr__(self, "insecure", frozenset(normalize_registry(h) for h in self.insecure))

    def credentials_for(self, host: str) -> Credentials | None:
        """Credentials for ``host`` (Hub's API host and aliases share ``docker.io``'s)."""
        return self.credentials.get(normalize_registry(host))

    def is_insecure(self, host: str) -> bool:
        """True if ``host`` is reached over plain http."""
        host = normalize_registry(host)
        return host in self.insecure or _is_loopback(host)

    def endpoints(self, registry: str) -> list[Endpoint]:
        """Where to fetch ``registry``'s content from, in order: its mirrors, then itself."""
        registry = normalize_registry(registry)
        out = []
        for url in self.mirrors.get(registry, ()):
            url = url.rstrip("/")
            if "://" not in url:
                url = f"{'http' if self.is_insecure(url) else 'https'}://{url}"
            out.append(Endpoint(base_url=url, host=normalize_registry(url), mirror=True))
        api = DOCKER_HUB_API if registry == DOCKER_HUB else registry
        scheme = "http" if self.is_insecure(registry) else "https"
        out.append(Endpoint(base_url=f"{scheme}://{api}", host=registry, mirror=False))
        return out

    def with_docker_config(self, path: Path) -> RegistryConfig:
        """A copy with the credentials of a docker ``config.json`` added (this config's win on conflicts)."""
        merged = {**load_docker_config(path), **self.credentials}
        return replace(self, credentials=merged)


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def load_docker_config(path: Path) -> dict[str, Credentials]:
    """Registry credentials from a docker-style ``config.json`` (``auths`` entries only).

    Entries are ``{"auth": base64("user:password")}`` or ``{"username": ..., "password": ...}``.
    ``credsStore`` / ``credHelpers`` (external ``docker-credential-*`` programs) and ``identitytoken``
    are not supported and are ignored. A missing file is no credentials; a malformed one is an
    ``InvalidRequestError``.
    """
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InvalidRequestError(f"cannot read docker config {path}: {exc}") from exc
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"docker config {path} is not valid JSON: {exc}") from exc
    auths = doc.get("auths", {}) if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise InvalidRequestError(f"docker config {path}: 'auths' must be an object")
    out: dict[str, Credentials] = {}
    for key, entry in auths.items():
        if not isinstance(entry, Mapping):
            continue
        creds = _entry_credentials(entry, path, key)
        if creds is not None:
            out[normalize_registry(key)] = creds
    return out


def _entry_credentials(entry: Mapping[str, object], path: Path, key: str) -> Credentials | None:
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise InvalidRequestError(f"docker config {path}: bad 'auth' for {key}") from exc
        if not sep:
            raise InvalidRequestError(f"docker config {path}: 'auth' for {key} is not base64(user:password)")
        return Credentials(user, password)
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(secret, str) and name:
        return Credentials(name, secret)
    return None


__all__ = ["Credentials", "Endpoint", "RegistryConfig", "load_docker_config"]
