"""The node's SQLite database: one connection, WAL, synchronous=FULL, calls run off the event loop.

Only this package opens SQLite. Each write is one transaction (``BEGIN IMMEDIATE``) on a single
connection guarded by a lock, executed in a worker thread so the loop never blocks on fsync.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import HostError

T = TypeVar("T")

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS sandboxes (
        id TEXT PRIMARY KEY,
        template_id TEXT NOT NULL,
        alias TEXT,
        runtime TEXT NOT NULL,
        state TEXT NOT NULL,
        metadata TEXT NOT NULL,
        env_vars TEXT NOT NULL,
        started_at REAL NOT NULL,
        end_at REAL NOT NULL,
        cpu_count INTEGER NOT NULL,
        memory_mb INTEGER NOT NULL,
        disk_mb INTEGER NOT NULL,
        access_token TEXT,
        address TEXT,
        allow_internet INTEGER NOT NULL,
        extra TEXT NOT NULL DEFAULT '{}'
    )
    """,
    "CREATE INDEX IF NOT EXISTS sandboxes_started ON sandboxes(started_at, id)",
    """
    CREATE TABLE IF NOT EXISTS templates (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        runtime TEXT NOT NULL,
        layers TEXT NOT NULL,
        env TEXT NOT NULL,
        workdir TEXT,
        user TEXT,
        start_cmd TEXT,
        ready_cmd TEXT,
        cpu_count INTEGER NOT NULL,
        memory_mb INTEGER NOT NULL,
        disk_mb INTEGER NOT NULL,
        created_at REAL NOT NULL
    )
    """,
)

_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("templates", "build", "TEXT NOT NULL DEFAULT '{}'"),
)
"""Columns added after a table was first created: (table, column, definition), applied when missing."""


def _migrate(conn: sqlite3.Connection) -> None:
    for table, column, definition in _COLUMNS:
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")


class Database:
    """One SQLite file. ``close()`` is idempotent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            # Root's alone: it holds every access token and env var. SQLite gives the -wal and -shm
            # files the database file's mode, so creating it 0600 first covers all three.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            os.chmod(path, 0o600)
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            for stmt in _SCHEMA:
                self._conn.execute(stmt)
            _migrate(self._conn)
        except sqlite3.Error as exc:
            raise HostError(f"cannot open the store at {path}: {exc}") from exc
        self._lock = threading.Lock()
        self._closed = False

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._closed:
                raise HostError("the store is closed")
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise HostError(f"store error: {exc}") from exc

    async def read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of one query."""
        return await asyncio.to_thread(self._run, lambda c: c.execute(sql, params).fetchall())

    async def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in its own immediate transaction; returns the changed row count."""

        def tx(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                n = conn.execute(sql, params).rowcount
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return n

        return await asyncio.to_thread(self._run, tx)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
