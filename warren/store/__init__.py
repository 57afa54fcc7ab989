"""SQLite store: the only package that opens the database."""

from .db import Database
from .records import SandboxRecord, TemplateRecord
from .repos import SandboxRepo, TemplateRepo

__all__ = ["Database", "SandboxRecord", "SandboxRepo", "TemplateRecord", "TemplateRepo"]
