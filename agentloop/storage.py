"""Opening the databases agentloop keeps state in: a SQLite file, a Redis server.

Two stores sit on top: the gateway's snapshots (`agentloop.gateway.stores`: immutable
values with a time-to-live) and the conversation sessions (`agentloop.sessions`:
append-only histories with a version). Their data differ; how a file is made and set up,
and how a Redis client is made, is the same for both and lives here.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

__all__ = ("connect_sqlite", "redis_client")

_INCREMENTAL = 2
"""`PRAGMA auto_vacuum` for incremental vacuuming."""


def connect_sqlite(path: Path, schema: str) -> sqlite3.Connection:
    """A connection to the SQLite file at `path`, made with its folder and `schema` if missing.

    The file is in WAL mode (readers never wait for a writer, and a writer in another
    process waits up to 5 s for the lock rather than failing), with incremental
    auto-vacuum so deleted rows can give their space back. The connection is in
    autocommit mode (`isolation_level=None`): callers open their transactions themselves.
    It may be used from any thread, one at a time.

    Setting a file up (the auto-vacuum rewrite, the switch to WAL) needs the file to
    itself, and SQLite does not wait on the busy timeout for that: so it is done once per
    file and process, under a lock, and a connection to a file already set up only reads
    the settings back.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        with _setup_lock(path):
            _set_up(db, schema)
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        db.close()
        raise
    return db


_BUSY_TIMEOUT_MS = 5000

_setup_locks: dict[Path, threading.Lock] = {}
_setup_locks_guard = threading.Lock()


def _setup_lock(path: Path) -> threading.Lock:
    """The lock this process takes while it sets up the file at `path`."""
    with _setup_locks_guard:
        return _setup_locks.setdefault(path.resolve(), threading.Lock())


def _set_up(db: sqlite3.Connection, schema: str) -> None:
    """Incremental auto-vacuum, WAL and `schema` on `db`'s file, changing only what is missing.

    Another process setting the same file up at the same moment can make a switch fail
    with "database is locked" at once: such a switch is tried again until the busy
    timeout has passed.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if db.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
                # Set before the first table (a file made without it is rewritten once).
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")
                db.execute("VACUUM")
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(schema)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


REDIS_HEALTH_CHECK_INTERVAL = 10
"""Seconds a pooled Redis connection may sit unused before it is pinged when borrowed."""


def redis_client(url: str) -> Any:
    """A `redis.asyncio.Redis` for `url` (not yet connected: it connects on first use).

    After a Redis restart, every pooled connection is dead, and the first command on each
    would fail: a command that meets a connection error (or a timeout) is sent once more
    on a new connection, and a connection unused for `REDIS_HEALTH_CHECK_INTERVAL`
    seconds is pinged before it is used. (redis-py retries only the errors it is told
    to, and is told none by default.)

    Raises:
        ConfigurationError: the `redis` package is not installed.
    """
    try:
        from redis import asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError, TimeoutError
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigurationError(
            "a Redis store needs the redis package: pip install 'agentloop-runner[redis]' "
            "(the gateway extra includes it)"
        ) from exc
    return aioredis.from_url(
        url,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=REDIS_HEALTH_CHECK_INTERVAL,
    )
