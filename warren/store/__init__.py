"""SQLite store: the only package that opens the database."""

from .db import Database
from .records import (
    ImageConfig,
    LifecyclePolicy,
    OnTimeout,
    PauseMode,
    RuntimeBinding,
    SandboxRecord,
    TemplateRecord,
)
from .repos import SandboxRepo, TemplateRepo

__all__ = [
    "Database",
    "ImageConfig",
    "LifecyclePolicy",
    "OnTimeout",
    "PauseMode",
    "RuntimeBinding",
    "SandboxRecord",
    "SandboxRepo",
    "TemplateRecord",
    "TemplateRepo",
]
