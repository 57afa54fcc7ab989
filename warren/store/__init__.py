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
    UpstreamProxy,
)
from .repos import SandboxRepo, TemplateRepo

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
    "TemplateRecord",
    "TemplateRepo",
    "UpstreamProxy",
    "provenance_json",
]
