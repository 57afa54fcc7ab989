"""The database schema and its in-place upgrades, keyed by SQLite's ``user_version``.

    0 -> 1   the schema before versions were kept; ``templates.build`` added when missing
    1 -> 2   ``sandboxes.extra`` (one JSON dict of 11 string keys) split into the typed JSON columns
             ``image``, ``policy``, ``binding`` and ``origin``; ``extra`` is dropped
    2 -> 3   ``sandboxes.requested``: what the create asked for (``{}`` for older sandboxes: not set)
    3 -> 4   ``sandboxes.ingress`` (JSON ``IngressPolicy``: private traffic and its token), ``{}`` (public)
    4 -> 5   ``template_builds`` (the record of every build a tag points to) and ``template_tags``; an
             older template has no tags until one is assigned: its current build is its ``default``
    5 -> 6   ``sandboxes.egress``: the sandbox's outbound policy (JSON, ``{}`` = open, what older rows get)

Every upgrade runs in one transaction with the version bump: a crash leaves the old schema whole.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from . import codec

VERSION = 6

_TABLES = (
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
        image TEXT NOT NULL DEFAULT '{}',
        policy TEXT NOT NULL DEFAULT '{}',
        binding TEXT NOT NULL DEFAULT '{}',
        origin TEXT,
        requested TEXT NOT NULL DEFAULT '{}',
        ingress TEXT NOT NULL DEFAULT '{}',
        egress TEXT NOT NULL DEFAULT '{}'
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
        created_at REAL NOT NULL,
        build TEXT NOT NULL DEFAULT '{}'
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS template_builds (
        build_id TEXT PRIMARY KEY,
        id TEXT NOT NULL,
        name TEXT NOT NULL,
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
        created_at REAL NOT NULL,
        build TEXT NOT NULL DEFAULT '{}'
    )
    """,
    "CREATE INDEX IF NOT EXISTS template_builds_template ON template_builds(id)",
    """
    CREATE TABLE IF NOT EXISTS template_tags (
        template_id TEXT NOT NULL,
        tag TEXT NOT NULL,
        build_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (template_id, tag)
    )
    """,
)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _to_1(conn: sqlite3.Connection) -> None:
    if "build" not in _columns(conn, "templates"):
        conn.execute("ALTER TABLE templates ADD COLUMN build TEXT NOT NULL DEFAULT '{}'")


def _to_2(conn: sqlite3.Connection) -> None:
    present = _columns(conn, "sandboxes")
    for column in ("image", "policy", "binding"):
        if column not in present:
            conn.execute(f"ALTER TABLE sandboxes ADD COLUMN {column} TEXT NOT NULL DEFAULT '{{}}'")
    if "origin" not in present:
        conn.execute("ALTER TABLE sandboxes ADD COLUMN origin TEXT")
    if "extra" not in present:
        return
    for sandbox_id, text in conn.execute("SELECT id, extra FROM sandboxes").fetchall():
        extra = codec.load(text)
        conn.execute(
            "UPDATE sandboxes SET image = ?, policy = ?, binding = ?, origin = ? WHERE id = ?",
            (
                codec.image_to_json(codec.image_of(extra)),
                codec.policy_to_json(codec.policy_of(extra)),
                codec.binding_to_json(codec.binding_of(extra)),
                str(extra["from_snapshot"]) if extra.get("from_snapshot") else None,
                sandbox_id,
            ),
        )
    conn.execute("ALTER TABLE sandboxes DROP COLUMN extra")


def _to_3(conn: sqlite3.Connection) -> None:
    if "requested" not in _columns(conn, "sandboxes"):
        conn.execute("ALTER TABLE sandboxes ADD COLUMN requested TEXT NOT NULL DEFAULT '{}'")


def _to_4(conn: sqlite3.Connection) -> None:
    if "ingress" not in _columns(conn, "sandboxes"):
        conn.execute("ALTER TABLE sandboxes ADD COLUMN ingress TEXT NOT NULL DEFAULT '{}'")


def _to_5(conn: sqlite3.Connection) -> None:
    """The tag tables are made by ``_TABLES``; no template has tags yet (its current build is its default)."""


def _to_6(conn: sqlite3.Connection) -> None:
    if "egress" not in _columns(conn, "sandboxes"):
        conn.execute("ALTER TABLE sandboxes ADD COLUMN egress TEXT NOT NULL DEFAULT '{}'")


_UPGRADES: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _to_1, 2: _to_2, 3: _to_3, 4: _to_4, 5: _to_5, 6: _to_6,
}
"""Target version -> the step that reaches it from the one before."""


def migrate(conn: sqlite3.Connection) -> None:
    """Create the tables on a new database, or upgrade an older one in place to :data:`VERSION`."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    fresh = not _columns(conn, "sandboxes")
    conn.execute("BEGIN IMMEDIATE")
    try:
        for stmt in _TABLES:
            conn.execute(stmt)
        if not fresh:
            for target in range(version + 1, VERSION + 1):
                _UPGRADES[target](conn)
        if version > VERSION:
            raise sqlite3.DatabaseError(f"the store is schema {version}, newer than this node's {VERSION}")
        conn.execute(f"PRAGMA user_version = {VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
