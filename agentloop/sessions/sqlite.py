"""`SQLiteSession`: sessions in a SQLite file, the embedded default.

Each operation opens the file, runs one transaction in a worker thread and closes it, so
a session object holds no connection: it works from any event loop (`run_sync` makes a
new one each time) and from several processes on one file. An append takes the write
lock first (`BEGIN IMMEDIATE`), checks the version and writes every message in that one
transaction: a process killed before `COMMIT` leaves the session as it was.

A session with a time-to-live has its deadline in `sessions.expires_at`, moved on by
every write: a read past it finds nothing, a write past it starts a new session, and the
file's regular purge (sqlite_file.py) deletes it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from agentloop.errors import ConfigurationError

from .base import UNCHANGED, SessionSnapshot, Unchanged, check_ttl, conflict, decode, encode
from .sqlite_file import PURGE_EVERY, connect, purge, purge_due, transaction

__all__ = ("SQLiteSession",)

_T = TypeVar("_T")


class SQLiteSession:
    """One conversation in a SQLite file, created (with its folder) on first use.

    Many sessions share one file; each is a row of `sessions` (its version, stored state
    and expiry) and its rows of `session_messages`.
    """

    PURGE_EVERY = PURGE_EVERY
    """Seconds between two purges of the file's expired sessions (any session object
    operating on the file runs the purge when it is due)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        session_id: str,
        *,
        ttl: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """The session `session_id` in the file at `path`.

        Args:
            path: The SQLite file (made with its folder on first use).
            session_id: Which conversation of the file this is.
            ttl: Seconds the session is kept after its last write (an append, `clear`,
                `save_state`, `clear_state`); None (the default) keeps it until cleared.
                Each write sets the expiry by the `ttl` of the object that writes.
            clock: The wall clock expiry is measured by, in seconds (tests move it).

        Raises:
            ConfigurationError: `session_id` is empty or not a string, or `ttl` is not
                a number of seconds > 0.
        """
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError(f"a session id is a non-empty string, not {session_id!r}")
        self.path = Path(path)
        self.session_id = session_id
        self.ttl = check_ttl(ttl)
        self.clock = clock

    def __repr__(self) -> str:
        return f"SQLiteSession({str(self.path)!r}, {self.session_id!r})"

    async def _call(
        self, function: Callable[[sqlite3.Connection, float], _T], *, upkeep: bool = True
    ) -> _T:
        """`function(db, now)` in a worker thread, on a connection closed afterwards.

        With `upkeep`, the file's purge of expired sessions runs first when it is due.
        """

        def call() -> _T:
            db = connect(self.path)
            try:
                now = self.clock()
                if upkeep and purge_due(db, now):
                    purge(db, now, every=self.PURGE_EVERY)
                return function(db, now)
            finally:
                db.close()

        return await anyio.to_thread.run_sync(call)

    def _transaction(
        self, db: sqlite3.Connection, body: Callable[[], _T], *, write: bool = True
    ) -> _T:
        """`body()` in one transaction: committed when it returns, rolled back if it raises."""
        with transaction(db, write=write):
            value = body()
            if write:
                self._commit_point()
        return value

    def _commit_point(self) -> None:
        """Called in a write transaction just before `COMMIT` (tests stop a process here)."""

    def _live(self, db: sqlite3.Connection, now: float) -> tuple[int, str | None] | None:
        """The session's (version, state) at `now`; None when it has none or it expired."""
        row = db.execute(
            "SELECT version, state, expires_at FROM sessions WHERE id = ?", (self.session_id,)
        ).fetchone()
        if row is None or (row[2] is not None and row[2] <= now):
            return None
        return int(row[0]), row[1]

    def _start_write(self, db: sqlite3.Connection, now: float) -> int:
        """The version a write starts from, after forgetting the session if it expired."""
        live = self._live(db, now)
        if live is None:
            # An expired session's rows go now, so a new one never sees them.
            db.execute("DELETE FROM session_messages WHERE session_id = ?", (self.session_id,))
            db.execute("DELETE FROM sessions WHERE id = ?", (self.session_id,))
            return 0
        return live[0]

    def _end_write(self, db: sqlite3.Connection, now: float) -> None:
        """Restart the session's time-to-live (or keep it for good, without one)."""
        expires_at = None if self.ttl is None else now + self.ttl
        db.execute("UPDATE sessions SET expires_at = ? WHERE id = ?", (expires_at, self.session_id))

    def _set_version(self, db: sqlite3.Connection, version: int) -> None:
        db.execute(
            "INSERT INTO sessions (id, version) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            (self.session_id, version),
        )

    async def load(self) -> SessionSnapshot:
        """The messages, version and state, read in one transaction."""

        def load(db: sqlite3.Connection, now: float) -> SessionSnapshot:
            def read() -> SessionSnapshot:
                live = self._live(db, now)
                if live is None:
                    return SessionSnapshot([], 0)
                rows = db.execute(
                    "SELECT message FROM session_messages WHERE session_id = ? ORDER BY seq",
                    (self.session_id,),
                ).fetchall()
                messages = [decode(text, "message") for (text,) in rows]
                version, state = live
                return SessionSnapshot(
                    messages, version, decode(state, "state") if state is not None else None
                )

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

        def append(db: sqlite3.Connection, now: float) -> int:
            def write() -> int:
                current = self._start_write(db, now)
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
                self._end_write(db, now)
                return current + 1

            return self._transaction(db, write)

        return await self._call(append)

    async def clear(self) -> None:
        """Delete the messages and the state; the version moves on."""

        def clear(db: sqlite3.Connection, now: float) -> None:
            def write() -> None:
                current = self._start_write(db, now)
                db.execute("DELETE FROM session_messages WHERE session_id = ?", (self.session_id,))
                self._set_version(db, current + 1)
                db.execute("UPDATE sessions SET state = NULL WHERE id = ?", (self.session_id,))
                self._end_write(db, now)

            self._transaction(db, write)

        await self._call(clear)

    async def save_state(self, state: Mapping[str, Any]) -> None:
        """Keep `state` (replacing any earlier one)."""
        text = encode(dict(state))

        def save(db: sqlite3.Connection, now: float) -> None:
            def write() -> None:
                self._start_write(db, now)
                db.execute(
                    "INSERT INTO sessions (id, version, state) VALUES (?, 0, ?) "
                    "ON CONFLICT (id) DO UPDATE SET state = excluded.state",
                    (self.session_id, text),
                )
                self._end_write(db, now)

            self._transaction(db, write)

        await self._call(save)

    async def load_state(self) -> dict[str, Any] | None:
        """The stored state, or None."""

        def load(db: sqlite3.Connection, now: float) -> dict[str, Any] | None:
            live = self._live(db, now)
            return None if live is None or live[1] is None else dict(decode(live[1], "state"))

        return await self._call(load)

    async def clear_state(self) -> None:
        """Forget the stored state."""

        def clear(db: sqlite3.Connection, now: float) -> None:
            def write() -> None:
                self._start_write(db, now)
                db.execute("UPDATE sessions SET state = NULL WHERE id = ?", (self.session_id,))
                self._end_write(db, now)

            self._transaction(db, write)

        await self._call(clear)

    async def purge(self) -> int:
        """Delete every expired session of the file now and give its space back.

        The purge also runs by itself every `PURGE_EVERY` seconds; this is for a
        service that wants the file small at a time of its choosing. Returns how many
        sessions were deleted.
        """

        def purge_now(db: sqlite3.Connection, now: float) -> int:
            return purge(db, now, every=self.PURGE_EVERY)

        return await self._call(purge_now, upkeep=False)
