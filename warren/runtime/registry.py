"""The node's runtimes by hash (seed 003): config → durable index → prewarm → staged binaries.

A sandbox, snapshot or template records the hash of the runtime it runs on. Create uses the
default hash of its class; resume, restore and fork resolve the recorded hash through the index
and stage *that* record — a miss is a 409 naming the hash, raised before anything is fetched or
created, and there is no fallback to the current default.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidRequestError
from .assets import AssetCache
from .index import RuntimeIndex, register_configs
from .prewarm import Prewarmer
from .records import Asset, RuntimeConfig, RuntimeRecord, check_usable, validate_runtime_configs
from .staging import RuntimeStager

log = logging.getLogger(__name__)

BINARY_ASSET = {"runc": "runc", "gvisor": "runsc"}
"""The asset of each class that is the runtime CLI."""


@dataclass(frozen=True)
class StagedRuntime:
    runtime_hash: str
    record: RuntimeRecord
    paths: Mapping[str, Path]

    @property
    def binary(self) -> Path | None:
        name = BINARY_ASSET.get(self.record.sandbox_class)
        return self.paths.get(name) if name else None


def file_asset(path: Path) -> Asset:
    """A local file as an asset (``file://`` URL and its sha256)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return Asset(url=path.resolve().as_uri(), sha256=digest.hexdigest())


def local_configs(runc: Path, runsc: Path | None, platform: str = "ptrace") -> list[RuntimeConfig]:
    """The default configs of a node without a runtimes file: the binaries it has."""
    configs = [RuntimeConfig("runc", "local", RuntimeRecord("runc", {"runc": file_asset(runc)}), default=True)]
    if runsc is not None and runsc.is_file():
        record = RuntimeRecord("gvisor", {"runsc": file_asset(runsc)}, {"platform": platform})
        configs.append(RuntimeConfig("gvisor", "local", record, default=True))
    return configs


def load_configs(path: Path) -> list[RuntimeConfig]:
    """``{"runtimes": [{name, version, default, sandbox_class, assets, options}, ...]}``."""
    try:
        doc = json.loads(path.read_text())
        configs = [RuntimeConfig.from_dict(item) for item in doc["runtimes"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError(f"cannot read runtime configs from {path}: {exc}") from exc
    for config in configs:
        try:
            check_usable(config.record)
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"{path}: runtime config {config.name}@{config.version}: {exc}") from exc
    return configs


class RuntimeRegistry:
    def __init__(self, index: RuntimeIndex, cache: AssetCache, *, prewarmer: Prewarmer | None = None) -> None:
        self.index = index
        self.stager = RuntimeStager(cache)
        self.prewarmer = prewarmer or Prewarmer(index, self.stager)
        self._defaults: dict[str, str] = {}
        self._configs: list[RuntimeConfig] = []

    async def configure(self, configs: Sequence[RuntimeConfig]) -> None:
        """Register every config durably, then switch the defaults and queue their prewarm."""
        defaults = validate_runtime_configs(configs)
        await register_configs(self.index, configs)
        self._configs = list(configs)
        self._defaults = {cls: config.record.hash() for cls, config in defaults.items()}
        self.prewarmer.on_config(configs)
        log.info("runtime defaults: %s", self._defaults)

    def default_hash(self, sandbox_class: str) -> str | None:
        return self._defaults.get(sandbox_class)

    async def stage(self, runtime_hash: str) -> StagedRuntime:
        """Resolve (409 on a miss, before any fetch) and stage; shares an in-flight prewarm."""
        record = self.index.resolve(runtime_hash)
        await self.prewarmer.ensure_staged(runtime_hash)
        return StagedRuntime(runtime_hash, record, await self.stager.stage(record))

    def describe(self) -> list[dict[str, Any]]:
        """For ``GET /runtimes``: every hash the index holds, with class, default flag and prewarm state."""
        out = []
        for runtime_hash in self.index.hashes():
            record = self.index.resolve(runtime_hash)
            provenance = self.index.provenance(runtime_hash)
            out.append(
                {
                    "hash": runtime_hash,
                    "class": record.sandbox_class,
                    "default": self._defaults.get(record.sandbox_class) == runtime_hash,
                    "prewarm": self.prewarmer.state(runtime_hash),
                    "options": dict(record.options),
                    "config": {"name": provenance.config_name, "version": provenance.config_version},
                    "registeredAt": provenance.registered_at,
                }
            )
        return out
