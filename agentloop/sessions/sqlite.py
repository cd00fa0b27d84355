"""`SQLiteSession`: sessions in a SQLite file, the embedded default.

Each operation opens the file, runs one transaction in a worker thread and closes it, so
a session object holds no connection: it works from any event loop (`run_sync` makes a
new one each time) and from several processes on one file. An append takes the write
lock first (`BEGIN IMMEDIATE`), checks the version and writes every message in that one
transaction: a process killed before `COMMIT` leaves the session as it was.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from agentloop.errors import ConfigurationError
from agentloop.storage import connect_sqlite

from .base import UNCHANGED, SessionSnapshot, Unchanged, conflict, decode, encode

__all__ = ("SQLiteSession",)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, version INTEGER NOT NULL, state TEXT
);
CREATE TABLE IF NOT EXISTS session_messages (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, message TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""

_T = TypeVar("_T")


class SQLiteSession:
    """One conversation in a SQLite file, created (with its folder) on first use.

    Many sessions share one file; each is a row of `sessions` (its version and stored
    state) and its rows of `session_messages`.
    """

    def __init__(self, path: str | os.PathLike[str], session_id: str) -> None:
        """The session `session_id` in the file at `path`.

        Raises:
            ConfigurationError: `session_id` is empty or not a string.
        """
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError(f"a session id is a non-empty string, not {session_id!r}")
        self.path = Path(path)
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"SQLiteSession({str(self.path)!r}, {self.session_id!r})"

    async def _call(self, function: Callable[[sqlite3.Connection], _T]) -> _T:
        """`function(db)` in a worker thread, on a connection closed afterwards."""

        def call() -> _T:
            db = connect_sqlite(self.path, _SCHEMA)
            try:
                return function(db)
            finally:
                db.close()

        return await anyio.to_thread.run_sync(call)

    def _transaction(
        self, db: sqlite3.Connection, body: Callable[[], _T], *, write: bool = True
    ) -> _T:
        """`body()` in one transaction: committed when it returns, rolled back if it raises."""
        db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            value = body()
            if write:
                self._commit_point()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return value

    def _commit_point(self) -> None:
        """Called in a write transaction just before `COMMIT` (tests stop a process here)."""

    def _version(self, db: sqlite3.Connection) -> int:
        row = db.execute("SELECT version FROM sessions WHERE id = ?", (self.session_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    def _set_version(self, db: sqlite3.Connection, version: int) -> None:
        db.execute(
            "INSERT INTO sessions (id, version) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            (self.session_id, version),
        )

    async def load(self) -> SessionSnapshot:
        """The messages, version and state, read in one transaction."""

        def load(db: sqlite3.Connection) -> SessionSnapshot:
            def read() -> SessionSnapshot:
                row = db.execute(
                    "SELECT version, state FROM sessions WHERE id = ?", (self.session_id,)
                ).fetchone()
                rows = db.execute(
                    "SELECT message FROM session_messages WHERE session_id = ? ORDER BY seq",
                    (self.session_id,),
                ).fetchall()
                messages = [decode(text, "message") for (text,) in rows]
                if row is None:
                    return SessionSnapshot(messages, 0)
                state = decode(row[1], "state") if row[1] is not None else None
                return SessionSnapshot(messages, int(row[0]), state)

            return self._transaction(db, read, write=False)

        return await self._call(load)

    async def append(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        version: int | None = None,
        state: Mapping[str, Any] | Unchanged | None = UNCHANGED,
    ) -> int:
        """Add `messages` (and set `state`) in one transaction; see `Session.append`."""
        texts = [encode(dict(m)) for m in messages]
        state_text = None if state is None or state is UNCHANGED else encode(dict(state))

        def append(db: sqlite3.Connection) -> int:
            def write() -> int:
                current = self._version(db)
                if version is not None and current != version:
                    raise conflict(self.session_id, version, current)
                (last,) = db.execute(
                    "SELECT COALESCE(MAX(seq), -1) FROM session_messages WHERE session_id = ?",
                    (self.session_id,),
                ).fetchone()
                db.executemany(
                    "INSERT INTO session_messages (session_id, seq, message) VALUES (?, ?, ?)",
                    [(self.session_id, last + 1 + i, text) for i, text in enumerate(texts)],
                )
                self._set_version(db, current + 1)
                if state is not UNCHANGED:
                    db.execute(
                        "UPDATE sessions SET state = ? WHERE id = ?", (state_text, self.session_id)
                    )
                return current + 1

            return self._transaction(db, write)

        return await self._call(append)

    async def clear(self) -> None:
        """Delete the messages and the state; the version moves on."""

        def clear(db: sqlite3.Connection) -> None:
            def write() -> None:
                current = self._version(db)
                db.execute("DELETE FROM session_messages WHERE session_id = ?", (self.session_id,))
                self._set_version(db, current + 1)
                db.execute("UPDATE sessions SET state = NULL WHERE id = ?", (self.session_id,))

            self._transaction(db, write)

        await self._call(clear)

    async def save_state(self, state: Mapping[str, Any]) -> None:
        """Keep `state` (replacing any earlier one)."""
        text = encode(dict(state))

        def save(db: sqlite3.Connection) -> None:
            def write() -> None:
                db.execute(
                    "INSERT INTO sessions (id, version, state) VALUES (?, 0, ?) "
                    "ON CONFLICT (id) DO UPDATE SET state = excluded.state",
                    (self.session_id, text),
                )

            self._transaction(db, write)

        await self._call(save)

    async def load_state(self) -> dict[str, Any] | None:
        """The stored state, or None."""

        def load(db: sqlite3.Connection) -> dict[str, Any] | None:
            row = db.execute(
                "SELECT state FROM sessions WHERE id = ?", (self.session_id,)
            ).fetchone()
            return None if row is None or row[0] is None else dict(decode(row[0], "state"))

        return await self._call(load)

    async def clear_state(self) -> None:
        """Forget the stored state."""

        def clear(db: sqlite3.Connection) -> None:
            def write() -> None:
                db.execute("UPDATE sessions SET state = NULL WHERE id = ?", (self.session_id,))

            self._transaction(db, write)

        await self._call(clear)
