"""The SQLite file `SQLiteSession` keeps sessions in: its schema, and its upkeep.

`connect` opens the file for one operation, bringing a file made before sessions could
expire up to the current schema. `purge` deletes the sessions whose time-to-live has
run out and gives their space back; it runs whenever the file's next purge is due
(`purge_due`), which the file itself records, so the processes sharing a file purge it
every `PURGE_EVERY` seconds between them, and a process that opens a file overdue
purges it at once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentloop.storage import connect_sqlite

__all__ = ("PURGE_EVERY", "connect", "purge", "purge_due", "transaction")

PURGE_EVERY = 300.0
"""Seconds between two purges of a file's expired sessions."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, version INTEGER NOT NULL, state TEXT, expires_at REAL
);
CREATE TABLE IF NOT EXISTS session_messages (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, message TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS session_meta (name TEXT PRIMARY KEY, value REAL NOT NULL);
"""
# `sessions.expires_at` is NULL for a session kept until cleared. The index is made by
# `_migrate`, once the column exists in files of either schema.

_INDEX = "sessions_expires_at"
_NEXT_PURGE = "next_purge"


@contextmanager
def transaction(db: sqlite3.Connection, *, write: bool = True) -> Iterator[None]:
    """One transaction on `db`: committed when the block ends, rolled back if it raises.

    A write transaction takes the write lock first (`BEGIN IMMEDIATE`), so what it
    reads stays true until it commits.
    """
    db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the sessions file at `path`, made (with its folder) if missing."""
    db = connect_sqlite(path, _SCHEMA)
    try:
        _migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def _current(db: sqlite3.Connection) -> bool:
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    index = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (_INDEX,)
    ).fetchone()
    return "expires_at" in columns and index is not None


def _migrate(db: sqlite3.Connection) -> None:
    """Add `sessions.expires_at` (NULL: kept until cleared) and its index where missing.

    Checked again under the write lock: another process may be migrating the same file.
    """
    if _current(db):
        return
    with transaction(db):
        if "expires_at" not in {row[1] for row in db.execute("PRAGMA table_info(sessions)")}:
            db.execute("ALTER TABLE sessions ADD COLUMN expires_at REAL")
        db.execute(f"CREATE INDEX IF NOT EXISTS {_INDEX} ON sessions (expires_at)")


def purge_due(db: sqlite3.Connection, now: float) -> bool:
    """Whether the file's next purge is due at `now` (a file never purged is due)."""
    row = db.execute("SELECT value FROM session_meta WHERE name = ?", (_NEXT_PURGE,)).fetchone()
    return row is None or float(row[0]) <= now


def purge(db: sqlite3.Connection, now: float, *, every: float = PURGE_EVERY) -> int:
    """Delete the sessions expired at `now` and shrink the file; returns how many.

    The next purge is due `every` seconds later.
    """
    with transaction(db):
        db.execute(
            "DELETE FROM session_messages WHERE session_id IN "
            "(SELECT id FROM sessions WHERE expires_at <= ?)",
            (now,),
        )
        deleted = db.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,)).rowcount
        db.execute(
            "INSERT INTO session_meta (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (_NEXT_PURGE, now + every),
        )
    if deleted:
        _shrink(db)
    return deleted


def _shrink(db: sqlite3.Connection) -> None:
    """Give the free pages back to the file system (the file is in incremental auto-vacuum).

    In WAL mode the smaller file is written by a checkpoint; one that readers of other
    connections hold back is finished by a later one.
    """
    db.executescript("PRAGMA incremental_vacuum;")  # a script steps it to the end
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
