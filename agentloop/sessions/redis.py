"""`RedisSession`: sessions on a Redis server, shared by every replica of a service.

A session is three keys: a list of JSON messages, a version counter and the stored
state. They share a hash tag (`{session_id}`), so a Redis Cluster keeps them on one
node and a transaction can cover all three. An append `WATCH`es the version, checks it,
and queues the messages and the new version in one `MULTI`/`EXEC`: Redis applies all of
it or nothing, and a client that dies before `EXEC` leaves the session as it was.

With a time-to-live, every write sets the expiry of all three keys in its transaction,
so they share one deadline and Redis forgets the whole session at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from agentloop.errors import ConfigurationError
from agentloop.storage import redis_client

from .base import UNCHANGED, SessionSnapshot, Unchanged, check_ttl, conflict, decode, encode

__all__ = ("RedisSession",)


class RedisSession:
    """One conversation on a Redis server.

    Without `client`, each operation connects and disconnects (a session then works from
    any event loop, `run_sync` included); pass a `redis.asyncio.Redis` to share its
    connection pool (it stays yours to close).
    """

    PREFIX = "agentloop:session:"

    def __init__(
        self, url: str, session_id: str, *, client: Any = None, ttl: float | None = None
    ) -> None:
        """The session `session_id` on the server at `url` (`redis://HOST:PORT/DB`).

        Args:
            url: The server (`redis://HOST:PORT/DB`, `rediss://`, `unix://`).
            session_id: Which conversation of the server this is.
            client: A `redis.asyncio.Redis` to use instead of a connection per operation.
            ttl: Seconds the session is kept after its last write (an append, `clear`,
                `save_state`, `clear_state`), by the server's clock; None (the default)
                keeps it until cleared. Each write sets the expiry of the session's keys
                by the `ttl` of the object that writes.

        Raises:
            ConfigurationError: `session_id` is empty or not a string, or `ttl` is not
                a number of seconds > 0.
        """
        if not isinstance(session_id, str) or not session_id:
            raise ConfigurationError(f"a session id is a non-empty string, not {session_id!r}")
        self.url = url
        self.session_id = session_id
        self.client = client
        self.ttl = check_ttl(ttl)
        base = f"{self.PREFIX}{{{session_id}}}"
        self._messages = base + ":messages"
        self._version = base + ":version"
        self._state = base + ":state"

    def __repr__(self) -> str:
        return f"RedisSession({self.url!r}, {self.session_id!r})"

    @asynccontextmanager
    async def _redis(self) -> AsyncIterator[Any]:
        if self.client is not None:
            yield self.client
            return
        client = redis_client(self.url)
        try:
            yield client
        finally:
            await client.aclose()

    def _keep(self, pipe: Any) -> None:
        """Queue the expiry of every key of the session: `ttl` from now, or none."""
        for key in (self._messages, self._version, self._state):
            if self.ttl is None:
                pipe.persist(key)
            else:
                pipe.pexpire(key, max(1, round(self.ttl * 1000)))

    def _commit_point(self) -> None:
        """Called with an append's transaction queued, just before `EXEC` (tests stop here)."""

    async def load(self) -> SessionSnapshot:
        """The messages, version and state, read in one transaction."""
        async with self._redis() as redis, redis.pipeline(transaction=True) as pipe:
            pipe.get(self._version)
            pipe.lrange(self._messages, 0, -1)
            pipe.get(self._state)
            version, texts, state = await pipe.execute()
        return SessionSnapshot(
            [decode(text, "message") for text in texts],
            int(version or 0),
            decode(state, "state") if state is not None else None,
        )

    async def append(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        version: int | None = None,
        state: Mapping[str, Any] | Unchanged | None = UNCHANGED,
    ) -> int:
        """Add `messages` (and set `state`) in one `MULTI`/`EXEC`; see `Session.append`."""
        from redis.exceptions import WatchError

        texts = [encode(dict(m)) for m in messages]
        state_text = None if state is None or state is UNCHANGED else encode(dict(state))
        async with self._redis() as redis, redis.pipeline(transaction=True) as pipe:
            if version is not None:
                await pipe.watch(self._version)
                current = int(await pipe.get(self._version) or 0)
                if current != version:
                    raise conflict(self.session_id, version, current)
                pipe.multi()
            pipe.incr(self._version)  # first, so its reply (the new version) is replies[0]
            if texts:
                pipe.rpush(self._messages, *texts)
            if state_text is not None:
                pipe.set(self._state, state_text)
            elif state is None:
                pipe.delete(self._state)
            self._keep(pipe)
            self._commit_point()
            try:
                replies = await pipe.execute()
            except WatchError:
                # Another client moved the version between our read and EXEC.
                actual = int(await redis.get(self._version) or 0)
                raise conflict(self.session_id, version or 0, actual) from None
        return int(replies[0])

    async def clear(self) -> None:
        """Delete the messages and the state; the version moves on."""
        async with self._redis() as redis, redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._messages, self._state)
            pipe.incr(self._version)
            self._keep(pipe)
            await pipe.execute()

    async def save_state(self, state: Mapping[str, Any]) -> None:
        """Keep `state` (replacing any earlier one)."""
        text = encode(dict(state))
        async with self._redis() as redis, redis.pipeline(transaction=True) as pipe:
            pipe.set(self._state, text)
            self._keep(pipe)
            await pipe.execute()

    async def load_state(self) -> dict[str, Any] | None:
        """The stored state, or None."""
        async with self._redis() as redis:
            text = await redis.get(self._state)
        return dict(decode(text, "state")) if text is not None else None

    async def clear_state(self) -> None:
        """Forget the stored state."""
        async with self._redis() as redis, redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._state)
            self._keep(pipe)
            await pipe.execute()
