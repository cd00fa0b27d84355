"""Opening the databases agentloop keeps state in: a SQLite file, a Redis server.

Two stores sit on top: the gateway's snapshots (`agentloop.gateway.stores`: immutable
values with a time-to-live) and the conversation sessions (`agentloop.sessions`:
append-only histories with a version). Their data differ; how a file is made and set up,
and how a Redis client is made, is the same for both and lives here.
"""

from __future__ import annotations

import sqlite3
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
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA busy_timeout=5000")
        if db.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
            # Set before the first table (a file made without it is rewritten once).
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            db.execute("VACUUM")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(schema)
    except BaseException:
        db.close()
        raise
    return db


def redis_client(url: str) -> Any:
    """A `redis.asyncio.Redis` for `url` (not yet connected: it connects on first use).

    Raises:
        ConfigurationError: the `redis` package is not installed.
    """
    try:
        from redis import asyncio as aioredis
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigurationError(
            "a Redis store needs the redis package: pip install 'agentloop-runner[redis]' "
            "(the gateway extra includes it)"
        ) from exc
    return aioredis.from_url(url)
