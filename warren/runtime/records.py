"""What a sandbox runtime *is*: the record a runtime hash is computed from, and the node's runtime configs.

A :class:`RuntimeRecord` names a sandbox class, the content-addressed assets it runs with (runsc, a
kernel, ...) and the options that change snapshot compatibility (e.g. ``{"platform": "ptrace"}``).
Its :meth:`~RuntimeRecord.hash` is the runtime's identity: two records with one hash run the same
bytes the same way, so a snapshot taken under one restores under the other.

The hash is the sha256 of the record's canonical JSON (sorted keys, no whitespace, UTF-8): class,
assets with their URLs and sha256, and options. Moving an asset to another URL is a new runtime;
register it and the old hash keeps resolving for what was made under it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from warren.errors import InvalidRequestError

SandboxClass = Literal["runc", "gvisor", "microvm"]
SANDBOX_CLASSES: tuple[SandboxClass, ...] = ("runc", "gvisor", "microvm")

_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class InvalidRuntimeRecord(InvalidRequestError):
    """A runtime record or runtime config is malformed."""


def is_sha256_hex(value: object) -> bool:
    """Whether ``value`` is 64 lowercase hex characters (an asset digest or a runtime hash)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


@dataclass(frozen=True)
class Asset:
    """One content-addressed file: where to fetch it and the sha256 its bytes must have."""

    url: str
    sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise InvalidRuntimeRecord(f"asset url must be a non-empty string, got {self.url!r}")
        if not is_sha256_hex(self.sha256):
            raise InvalidRuntimeRecord(f"asset sha256 must be 64 lowercase hex characters, got {self.sha256!r}")

    def to_dict(self) -> dict[str, str]:
        return {"sha256": self.sha256, "url": self.url}


@dataclass(frozen=True)
class RuntimeRecord:
    """The record a runtime hash is computed from. Immutable: its mappings are read-only copies."""

    sandbox_class: SandboxClass
    assets: Mapping[str, Asset]
    options: Mapping[str, str] = field(default_factory=dict)
    _hash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.sandbox_class not in SANDBOX_CLASSES:
            raise InvalidRuntimeRecord(
                f"sandbox_class must be one of {', '.join(SANDBOX_CLASSES)}, got {self.sandbox_class!r}"
            )
        if not isinstance(self.assets, Mapping):
            raise InvalidRuntimeRecord("assets must be a mapping of name to asset")
        if not isinstance(self.options, Mapping):
            raise InvalidRuntimeRecord("options must be a mapping of string to string")
        for name, asset in self.assets.items():
            _check_name("asset name", name)
            if not isinstance(asset, Asset):
                raise InvalidRuntimeRecord(f"asset {name!r} must be an Asset, got {type(asset).__name__}")
        for key, value in self.options.items():
            _check_name("option name", key)
            if not isinstance(value, str):
                raise InvalidRuntimeRecord(f"option {key!r} must be a string, got {value!r}")
        object.__setattr__(self, "assets", MappingProxyType(dict(sorted(self.assets.items()))))
        object.__setattr__(self, "options", MappingProxyType(dict(sorted(self.options.items()))))
        object.__setattr__(self, "_hash", hashlib.sha256(self.canonical_json()).hexdigest())

    def __hash__(self) -> int:
        return hash(self._hash)

    def to_dict(self) -> dict[str, Any]:
        """The whole record as plain JSON-able data (the shape :meth:`from_dict` reads)."""
        return {
            "assets": {name: asset.to_dict() for name, asset in self.assets.items()},
            "options": dict(self.options),
            "sandbox_class": self.sandbox_class,
        }

    def canonical_json(self) -> bytes:
        """The whole record, URLs included: sorted keys, no whitespace, UTF-8."""
        return _canonical(self.to_dict())

    def hash(self) -> str:
        """The runtime hash: sha256 hex of :meth:`canonical_json` (the issue's definition)."""
        return self._hash

    @classmethod
    def from_dict(cls, data: object) -> RuntimeRecord:
        """Parse the shape :meth:`to_dict` writes; unknown keys are refused, not dropped."""
        if not isinstance(data, Mapping):
            raise InvalidRuntimeRecord(f"a runtime record must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"sandbox_class", "assets", "options"}
        if unknown:
            raise InvalidRuntimeRecord(f"runtime record has unknown keys: {', '.join(sorted(map(str, unknown)))}")
        if "sandbox_class" not in data:
            raise InvalidRuntimeRecord("runtime record has no sandbox_class")
        raw_assets = data.get("assets", {})
        if not isinstance(raw_assets, Mapping):
            raise InvalidRuntimeRecord("runtime record assets must be an object")
        assets: dict[str, Asset] = {}
        for name, raw in raw_assets.items():
            if not isinstance(raw, Mapping) or set(raw) != {"url", "sha256"}:
                raise InvalidRuntimeRecord(f"asset {name!r} must be an object with exactly url and sha256")
            assets[name] = Asset(url=raw["url"], sha256=raw["sha256"])
        options = data.get("options", {})
        if not isinstance(options, Mapping):
            raise InvalidRuntimeRecord("runtime record options must be an object")
        return cls(sandbox_class=cast(SandboxClass, data["sandbox_class"]), assets=assets, options=dict(options))

    @classmethod
    def from_json(cls, text: str | bytes) -> RuntimeRecord:
        """Parse JSON text (canonical or not) into a record."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRuntimeRecord(f"runtime record is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


@dataclass(frozen=True)
class RuntimeConfig:
    """A runtime the node's config declares: a named, versioned record; one per class is the default."""

    name: str
    version: str
    record: RuntimeRecord
    default: bool = False

    def __post_init__(self) -> None:
        _check_name("runtime config name", self.name)
        if not isinstance(self.version, str) or not self.version:
            raise InvalidRuntimeRecord(f"runtime config {self.name!r}: version must be a non-empty string")
        if not isinstance(self.record, RuntimeRecord):
            raise InvalidRuntimeRecord(f"runtime config {self.name!r}: record must be a RuntimeRecord")

    @classmethod
    def from_dict(cls, data: object) -> RuntimeConfig:
        """Parse ``{"name", "version", "default"?, "sandbox_class", "assets", "options"?}``."""
        if not isinstance(data, Mapping):
            raise InvalidRuntimeRecord(f"a runtime config must be an object, got {type(data).__name__}")
        rest = {k: v for k, v in data.items() if k not in ("name", "version", "default")}
        name, version, default = data.get("name"), data.get("version"), data.get("default", False)
        if not isinstance(name, str) or not isinstance(version, str) or not isinstance(default, bool):
            raise InvalidRuntimeRecord("a runtime config needs string name and version and a boolean default")
        try:
            record = RuntimeRecord.from_dict(rest)
        except InvalidRuntimeRecord as exc:
            raise InvalidRuntimeRecord(f"runtime config {name!r} version {version!r}: {exc}") from exc
        return cls(name=name, version=version, record=record, default=default)


def validate_runtime_configs(configs: Iterable[RuntimeConfig]) -> dict[SandboxClass, RuntimeConfig]:
    """Check a node's runtime configs; return the default config of each class that has any.

    Each (name, version) appears once, and each sandbox class with at least one config has exactly
    one default. Raises :class:`InvalidRuntimeRecord` naming every problem found.
    """
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    by_class: dict[SandboxClass, list[RuntimeConfig]] = {}
    for config in configs:
        key = (config.name, config.version)
        if key in seen:
            problems.append(f"{config.name}@{config.version} is declared more than once")
        seen.add(key)
        by_class.setdefault(config.record.sandbox_class, []).append(config)
    defaults: dict[SandboxClass, RuntimeConfig] = {}
    for sandbox_class, members in by_class.items():
        marked = [c for c in members if c.default]
        if len(marked) == 1:
            defaults[sandbox_class] = marked[0]
        elif not marked:
            names = ", ".join(f"{c.name}@{c.version}" for c in members)
            problems.append(f"class {sandbox_class!r} has no default runtime (configs: {names})")
        else:
            names = ", ".join(f"{c.name}@{c.version}" for c in marked)
            problems.append(
                f"class {sandbox_class!r} has {len(marked)} default runtimes ({names}); exactly one is required"
            )
    if problems:
        raise InvalidRuntimeRecord("invalid runtime configs: " + "; ".join(problems))
    return defaults


REQUIRED_ASSETS: Mapping[str, tuple[str, ...]] = MappingProxyType({"runc": ("runc",), "gvisor": ("runsc",)})
"""The assets a record of each class must carry (the runtime CLI it runs); every class needs at least one."""
ASSET_SCHEMES = ("file", "http", "https", "s3")


def check_usable(record: RuntimeRecord) -> RuntimeRecord:
    """``record`` if a node could run it: its class's assets are there, every URL is ``file://`` (an
    absolute local path), ``http(s)://`` (with a host) or ``s3://bucket/key``. Else
    :class:`InvalidRuntimeRecord` (400). Applied where records come from outside: the API, config files.
    """
    missing = [name for name in REQUIRED_ASSETS.get(record.sandbox_class, ()) if name not in record.assets]
    if missing or not record.assets:
        raise InvalidRuntimeRecord(
            f"a {record.sandbox_class} runtime record needs the asset(s) {', '.join(missing) or '(any)'}; "
            f"it has {', '.join(record.assets) or 'none'}"
        )
    for name, asset in record.assets.items():
        _check_url(name, asset.url)
    return record


def _check_url(name: str, url: str) -> None:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ASSET_SCHEMES:
        raise InvalidRuntimeRecord(
            f"asset {name!r} url {url!r}: use {', '.join(s + '://' for s in ASSET_SCHEMES)} "
            "(a relative path or another scheme is not fetchable)"
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidRuntimeRecord(f"asset {name!r} url {url!r}: a file URL must name an absolute local path")
    elif scheme == "s3":
        if not parts.netloc or parts.path.strip("/") == "":
            raise InvalidRuntimeRecord(f"asset {name!r} url {url!r}: an s3 URL needs a bucket and a key")
    elif not parts.hostname:
        raise InvalidRuntimeRecord(f"asset {name!r} url {url!r}: an {scheme} URL needs a host")


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise InvalidRuntimeRecord(f"{what} must match {_NAME.pattern}, got {value!r}")


def _canonical(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


__all__ = [
    "ASSET_SCHEMES",
    "REQUIRED_ASSETS",
    "SANDBOX_CLASSES",
    "Asset",
    "InvalidRuntimeRecord",
    "RuntimeConfig",
    "RuntimeRecord",
    "SandboxClass",
    "check_usable",
    "is_sha256_hex",
    "validate_runtime_configs",
]
