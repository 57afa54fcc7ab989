"""A snapshot's manifest: what it holds and how to start a sandbox from it. Verified on every read.

The file carries a magic string, a format version and the sha256 of its own canonical body, so a
truncated, hand-edited or foreign file is refused rather than half-trusted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import HostError

MAGIC = "warren-snapshot"
VERSION = 1
MAX_MANIFEST_BYTES = 1 << 20


class ManifestError(HostError):
    """A manifest that cannot be trusted (bad magic, version, checksum or shape)."""


@dataclass(frozen=True)
class SnapshotManifest:
    snapshot_id: str
    names: tuple[str, ...]
    source_sandbox_id: str
    template_id: str
    runtime: str
    layers: tuple[str, ...]
    env: dict[str, str]
    workdir: str | None
    user: str | None
    memory: bool
    created_at: float
    cpu_count: int
    memory_mb: int
    disk_mb: int
    env_vars: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    runtime_hash: str | None = None
    agent_token: str | None = None
    """The access token the agent inside a memory image holds (it is in that memory anyway)."""

    def body(self) -> dict[str, Any]:
        data = asdict(self)
        data["names"] = list(self.names)
        data["layers"] = list(self.layers)
        return data

    def encode(self) -> bytes:
        body = self.body()
        digest = hashlib.sha256(_canonical(body)).hexdigest()
        return json.dumps({"magic": MAGIC, "version": VERSION, "sha256": digest, "snapshot": body}, indent=1).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SnapshotManifest:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError("snapshot manifest is too large")
        try:
            doc = json.loads(raw)
            if doc.get("magic") != MAGIC:
                raise ManifestError("not a warren snapshot manifest")
            if doc.get("version") != VERSION:
                raise ManifestError(f"unsupported snapshot manifest version {doc.get('version')!r}")
            body = doc["snapshot"]
            if hashlib.sha256(_canonical(body)).hexdigest() != doc.get("sha256"):
                raise ManifestError("snapshot manifest checksum mismatch")
            body["names"] = tuple(body["names"])
            body["layers"] = tuple(body["layers"])
            return cls(**body)
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"malformed snapshot manifest: {exc}") from exc


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
