"""SQLite store: the only package that opens the database."""

from .codec import provenance_json
from .db import Database
from .records import (
    CacheEntry,
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
)
from .repos import SandboxRepo, TemplateRepo

__all__ = [
    "CacheEntry",
    "Database",
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
    "provenance_json",
]
