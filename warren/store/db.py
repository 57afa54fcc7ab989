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
from .migrations import migrate

T = TypeVar("T")


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
            migrate(self._conn)
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

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one immediate transaction (rolled back if it raises), off the event loop."""

        def tx(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return out

        return await asyncio.to_thread(self._run, tx)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
