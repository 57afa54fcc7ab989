"""SQLite store: the only package that opens the database."""

from .codec import provenance_json
from .db import Database
from .records import (
    CacheEntry,
    EgressPolicy,
    HostRule,
    ImageConfig,
    IngressPolicy,
    LifecyclePolicy,
    NetworkConfig,
    OnTimeout,
    PauseMode,
    Provenance,
    Requested,
    RuntimeBinding,
    SandboxRecord,
    TemplateRecord,
    TemplateTag,
    UpstreamProxy,
    build_id_of,
)
from .repos import SandboxRepo, TemplateRepo, sandbox_of_json, sandbox_to_json
from .tags import TagRepo

__all__ = [
    "CacheEntry",
    "Database",
    "EgressPolicy",
    "HostRule",
    "ImageConfig",
    "IngressPolicy",
    "LifecyclePolicy",
    "NetworkConfig",
    "OnTimeout",
    "PauseMode",
    "Provenance",
    "Requested",
    "RuntimeBinding",
    "SandboxRecord",
    "SandboxRepo",
    "TagRepo",
    "TemplateRecord",
    "TemplateRepo",
    "TemplateTag",
    "UpstreamProxy",
    "build_id_of",
    "provenance_json",
    "sandbox_of_json",
    "sandbox_to_json",
]
