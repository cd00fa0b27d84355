"""Session stores: where the gateway keeps its snapshots between requests.

A store holds opaque values under keys, each kept for a time-to-live and never changed
once written: the first write of a key wins, so concurrent requests can never overwrite
each other's snapshot. `open_store` picks one from a URL: `sqlite:///PATH` (embedded, the
default), `redis://HOST:PORT/DB` (shared by several gateway processes) or `memory://`.
The server secret that keys are derived with lives in the store too, under `SECRET_KEY`
(readable with `get_many` like any value, so a gateway can check it is still there in the
same round trip as a lookup), and every process sharing a store derives the same keys.
"""

from __future__ import annotations

import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread

from agentloop.errors import ConfigurationError
from agentloop.logs import get_logger
from agentloop.storage import connect_sqlite, redis_client

from .defaults import DEFAULT_STORE

__all__ = (
    "DEFAULT_STORE",
    "SECRET_KEY",
    "MemoryStore",
    "RedisStore",
    "SQLiteStore",
    "Store",
    "open_store",
)

_log = get_logger()

SECRET_KEY = "secret"
"""The key the store keeps the server secret under (it never expires)."""

Clock = Callable[[], float]


@runtime_checkable
class Store(Protocol):
    """What the gateway needs from a session store."""

    ttl: float
    """Seconds a value is kept after it (or a value written with it in `refresh`) was last
    written."""

    async def open(self) -> None:
        """Connect, create what is missing (a file, tables)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...

    async def secret(self, candidate: bytes | None = None) -> bytes:
        """The server secret under `SECRET_KEY`; it never expires.

        When there is none, `candidate` (or, when None, 32 random bytes) is kept and
        returned: the first process to ask after the store was created or wiped decides.
        """
        ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys`, in order; None for a key missing or expired."""
        ...

    async def put(self, key: str, value: bytes, *, refresh: Sequence[str] = ()) -> bool:
        """Write `value` under `key` unless a live value is already there.

        The TTL of `key` and of every key in `refresh` restarts. Returns whether `value`
        was written.
        """
        ...

    async def purge(self) -> int:
        """Delete expired values now; returns how many (where the store can tell)."""
        ...


def open_store(url: str, *, ttl: float, clock: Clock | None = None) -> Store:
    """The store a URL names (not yet opened).

    Args:
        url: `sqlite:///relative/path.db`, `sqlite:////absolute/path.db`,
            `redis://HOST:PORT/DB` (or `rediss://`), or `memory://`.
        ttl: Seconds each snapshot is kept.
        clock: Wall clock for the sqlite and memory stores (tests move it).

    Raises:
        ConfigurationError: the URL names no store this version knows, or `ttl` <= 0.
    """
    if not ttl > 0:
        raise ConfigurationError(f"the session TTL must be > 0 seconds, not {ttl!r}")
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if not path:
            raise ConfigurationError(f"a sqlite store needs a file path: {url!r}")
        return SQLiteStore(Path(path), ttl=ttl, clock=clock or time.time)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url, ttl=ttl)
    if url.rstrip("/") == "memory:":
        return MemoryStore(ttl=ttl, clock=clock or time.time)
    raise ConfigurationError(
        f"unknown store {url!r}: use sqlite:///PATH, redis://HOST:PORT/DB or memory://"
    )


class MemoryStore:
    """Values in this process's memory: for tests and single-process experiments."""

    def __init__(self, *, ttl: float, clock: Clock = time.time) -> None:
        """A store keeping values `ttl` seconds by `clock`."""
        self.ttl = ttl
        self.clock = clock
        self._values: dict[str, tuple[bytes, float]] = {}

    async def open(self) -> None:
        """Nothing to open."""

    async def aclose(self) -> None:
        """Nothing to close (the values stay until the object goes)."""

    async def secret(self, candidate: bytes | None = None) -> bytes:
        """This store's secret (kept under `SECRET_KEY` with no expiry)."""
        if self._live(SECRET_KEY, self.clock()) is None:
            self._values[SECRET_KEY] = (candidate or secrets.token_bytes(32), math.inf)
        return self._values[SECRET_KEY][0]

    def _live(self, key: str, now: float) -> bytes | None:
        item = self._values.get(key)
        return item[0] if item is not None and item[1] > now else None

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The live values of `keys`."""
        now = self.clock()
        return [self._live(key, now) for key in keys]

    async def put(self, key: str, value: bytes, *, refresh: Sequence[str] = ()) -> bool:
        """First live write wins; TTLs of `key` and `refresh` restart."""
        now = self.clock()
        expires = now + self.ttl
        existing = self._live(key, now)
        self._values[key] = (existing if existing is not None else value, expires)
        for other in refresh:
            kept = self._live(other, now)
            if kept is not None:
                self._values[other] = (kept, expires)
        return existing is None

    async def purge(self) -> int:
        """Drop expired values."""
        now = self.clock()
        dead = [k for k, (_, expires) in self._values.items() if expires <= now]
        for key in dead:
            del self._values[key]
        return len(dead)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_expires ON snapshots (expires);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
"""


class SQLiteStore:
    """Values in a SQLite file, created on first use; the embedded default.

    The secret is a row of the `meta` table, which `get_many` reads under `SECRET_KEY`.

    One connection, used from worker threads one call at a time; the file is in WAL
    mode, so a gateway restarted on the same file finds every live snapshot. A file
    deleted or replaced while the gateway runs is noticed on the next call (a `stat`),
    and the store starts again on a new file.
    """

    def __init__(self, path: Path, *, ttl: float, clock: Clock = time.time) -> None:
        """A store in the file at `path` keeping values `ttl` seconds by `clock`."""
        self.path = path
        self.ttl = ttl
        self.clock = clock
        self._db: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(1)

    async def _call(self, function: Callable[[sqlite3.Connection], Any]) -> Any:
        def locked() -> Any:
            with self._lock:
                if self._db is None:
                    raise RuntimeError("the sqlite store is not open")
                if self._file != _identity(self.path):
                    # The file was deleted (or replaced) under the open connection,
                    # which would go on writing where nobody can read: start again.
                    _log.warning("gateway.sqlite_recreated", path=str(self.path))
                    self._db.close()
                    self._db, self._file = self._connect()
                with self._db:  # one transaction per call
                    return function(self._db)

        return await anyio.to_thread.run_sync(locked, limiter=self._limiter)

    def _connect(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        """A connection to the file (made with its folder and tables when missing)."""
        db = connect_sqlite(self.path, _SCHEMA)
        db.isolation_level = "DEFERRED"
        return db, _identity(self.path)

    async def open(self) -> None:
        """Create the file (and its folder) and tables when missing."""
        if self._db is None:
            self._db, self._file = await anyio.to_thread.run_sync(self._connect)

    async def aclose(self) -> None:
        """Close the connection."""
        db, self._db = self._db, None
        if db is not None:
            with self._lock:
                db.close()

    async def secret(self, candidate: bytes | None = None) -> bytes:
        """The secret, kept in the `meta` table (made on first use)."""
        value = candidate or secrets.token_bytes(32)

        def get(db: sqlite3.Connection) -> bytes:
            db.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES (?, ?)", (SECRET_KEY, value)
            )
            row = db.execute("SELECT value FROM meta WHERE name = ?", (SECRET_KEY,)).fetchone()
            return bytes(row[0])

        result: bytes = await self._call(get)
        return result

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The live values of `keys` (one query)."""
        if not keys:
            return []
        now = self.clock()
        wanted = list(dict.fromkeys(keys))

        def get(db: sqlite3.Connection) -> dict[str, bytes]:
            marks = ",".join("?" * len(wanted))
            rows = db.execute(
                f"SELECT key, value FROM snapshots WHERE key IN ({marks}) AND expires > ?",
                (*wanted, now),
            ).fetchall()
            if SECRET_KEY in wanted:
                rows += db.execute(
                    "SELECT name, value FROM meta WHERE name = ?", (SECRET_KEY,)
                ).fetchall()
            return {str(k): bytes(v) for k, v in rows}

        found: dict[str, bytes] = await self._call(get)
        return [found.get(key) for key in keys]

    async def put(self, key: str, value: bytes, *, refresh: Sequence[str] = ()) -> bool:
        """Insert unless a live value is there (an expired one is replaced); restart TTLs."""
        now = self.clock()
        expires = now + self.ttl
        others = [k for k in dict.fromkeys(refresh) if k != key]

        def put(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "INSERT INTO snapshots (key, value, expires) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "expires = excluded.expires WHERE snapshots.expires <= ?",
                (key, value, expires, now),
            )
            written = cursor.rowcount > 0
            if not written:
                db.execute("UPDATE snapshots SET expires = ? WHERE key = ?", (expires, key))
            for start in range(0, len(others), 500):
                chunk = others[start : start + 500]
                marks = ",".join("?" * len(chunk))
                db.execute(
                    f"UPDATE snapshots SET expires = ? WHERE key IN ({marks}) AND expires > ?",
                    (expires, *chunk, now),
                )
            return written

        written: bool = await self._call(put)
        return written

    async def purge(self) -> int:
        """Delete the expired rows, and give their space back to the file system."""
        now = self.clock()

        def purge(db: sqlite3.Connection) -> int:
            return db.execute("DELETE FROM snapshots WHERE expires <= ?", (now,)).rowcount

        def shrink(db: sqlite3.Connection) -> None:
            db.executescript("PRAGMA incremental_vacuum;")  # steps it to the end
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        deleted: int = await self._call(purge)
        if deleted:
            await self._call(shrink)
        return deleted


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` as (device, inode), or None when there is none."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


class RedisStore:
    """Values in a Redis server, shared by every gateway process that points at it.

    Each value is a Redis string with a millisecond expiry (`SET ... PX ttl NX`), so
    Redis itself forgets expired sessions; the secret is a key without expiry.
    """

    PREFIX = "agentloop:gateway:"

    def __init__(self, url: str, *, ttl: float) -> None:
        """A store on the Redis server at `url`, keeping values `ttl` seconds."""
        self.url = url
        self.ttl = ttl
        self._redis: Any = None

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    async def open(self) -> None:
        """Connect (and check the server answers).

        Raises:
            ConfigurationError: the `redis` package is not installed.
        """
        if self._redis is None:
            self._redis = redis_client(self.url)
            await self._redis.ping()

    async def aclose(self) -> None:
        """Close the connection pool."""
        client, self._redis = self._redis, None
        if client is not None:
            await client.aclose()

    async def secret(self, candidate: bytes | None = None) -> bytes:
        """The secret under `agentloop:gateway:secret` (set by whichever process is first)."""
        name = self.PREFIX + SECRET_KEY
        await self._redis.set(name, candidate or secrets.token_bytes(32), nx=True)
        value = await self._redis.get(name)
        return bytes(value)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """`MGET` of `keys`."""
        if not keys:
            return []
        values = await self._redis.mget([self.PREFIX + k for k in keys])
        return [bytes(v) if v is not None else None for v in values]

    async def put(self, key: str, value: bytes, *, refresh: Sequence[str] = ()) -> bool:
        """`SET NX PX`, then `PEXPIRE` of `key` and `refresh`, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self.PREFIX + key, value, px=self._ttl_ms, nx=True)
            for other in dict.fromkeys((key, *refresh)):
                pipe.pexpire(self.PREFIX + other, self._ttl_ms)
            replies = await pipe.execute()
        return bool(replies[0])

    async def purge(self) -> int:
        """Nothing to do: Redis expires keys itself."""
        return 0
