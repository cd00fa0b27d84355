"""Sessions that expire: a real SQLite file under a clock the test moves, a real Redis.

A session not written for its `ttl` is read as one that never existed; SQLite purges
expired sessions and shrinks its file, and brings a file of the previous schema up to
date; Redis expires every key of a session at one deadline.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import redis_server
from test_sessions import agentloop_command

from agentloop import Agent, AnthropicProvider, ConfigurationError
from agentloop.sessions import (
    RedisSession,
    SessionConflict,
    SessionSnapshot,
    SQLiteSession,
    open_session,
)
from agentloop.sessions.sqlite_file import connect
from agentloop.storage import connect_sqlite
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

NEVER = SessionSnapshot([], 0)
"""What `load()` returns for a session that never existed."""

ONE = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def echo(body: dict[str, Any]) -> dict[str, Any]:
    """A model that says how many messages it was sent."""
    return reply(f"#{len(body['messages'])}")


def rows(path: Path, table: str) -> int:
    """How many rows `table` of the file holds, expired ones included."""
    with closing(sqlite3.connect(path)) as db:
        (count,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(count)


def size(path: Path) -> int:
    """The size of a file in bytes (0 when there is none)."""
    return path.stat().st_size if path.exists() else 0


# -- SQLite, on a clock the test moves


async def test_a_session_not_written_for_its_ttl_reads_as_one_that_never_existed(
    path: Path, clock: Clock
) -> None:
    session = SQLiteSession(path, "chat", ttl=60, clock=clock)
    await session.append(ONE, version=0, state={"paused": True})
    clock.now += 59.9
    assert await session.load() == SessionSnapshot(ONE, 1, {"paused": True})
    clock.now += 0.1
    never = SQLiteSession(path, "never", ttl=60, clock=clock)
    assert await session.load() == await never.load() == NEVER
    assert await session.load_state() is await never.load_state() is None
    # A write starts a new session: nothing of the expired one comes back.
    assert await session.append([{"role": "user", "content": "again"}], version=0) == 1
    assert await session.load() == SessionSnapshot([{"role": "user", "content": "again"}], 1)


WRITES = [
    pytest.param(lambda s: s.append([{"role": "user", "content": "more"}]), id="append"),
    pytest.param(lambda s: s.save_state({"paused": True}), id="save_state"),
    pytest.param(lambda s: s.clear_state(), id="clear_state"),
    pytest.param(lambda s: s.clear(), id="clear"),
]
"""Every kind of write a session takes: each restarts its TTL."""


@pytest.mark.parametrize("write", WRITES)
async def test_every_write_restarts_the_ttl(
    path: Path, clock: Clock, write: Callable[[SQLiteSession], Any]
) -> None:
    session = SQLiteSession(path, "chat", ttl=60, clock=clock)
    await session.append(ONE)
    clock.now += 50
    await write(session)
    written = await session.load()
    clock.now += 59  # 109 s after the first write, 59 s after the last
    assert await session.load() == written != NEVER
    clock.now += 1
    assert await session.load() == NEVER


async def test_the_ttl_of_the_object_that_writes_decides(path: Path, clock: Clock) -> None:
    kept = SQLiteSession(path, "chat", clock=clock)
    expiring = SQLiteSession(path, "chat", ttl=60, clock=clock)
    await expiring.append(ONE)
    await kept.append([{"role": "user", "content": "keep it"}])
    clock.now += 10**9
    assert (await expiring.load()).version == 2  # no ttl: kept until cleared
    await expiring.clear_state()
    clock.now += 60
    assert await kept.load() == NEVER


async def test_a_run_that_outlasts_its_session_is_refused_and_keeps_its_result(
    path: Path, clock: Clock
) -> None:
    session = SQLiteSession(path, "chat", ttl=60, clock=clock)

    def model(body: dict[str, Any]) -> dict[str, Any]:
        if "two" in json.dumps(body["messages"][-1]):
            clock.now += 61  # the session expires while the model answers
        return echo(body)

    agent = Agent(provider=ScriptedProvider(model))
    assert (await agent.run("one", session=session)).text == "#1"
    with pytest.raises(SessionConflict) as refused:
        await agent.run("two", session=session)
    assert (refused.value.expected, refused.value.actual) == (1, 0)
    assert refused.value.result is not None and refused.value.result.text == "#3"
    # The conversation is gone: the next run starts a new one.
    assert (await agent.run("three", session=session)).text == "#1"


async def test_a_run_in_an_expired_session_sends_only_its_prompt(
    path: Path, clock: Clock, serve: Callable[..., MessagesServer]
) -> None:
    server = serve(echo)
    agent = Agent(provider=AnthropicProvider(server.client()), cache="off")
    session = SQLiteSession(path, "chat", ttl=60, clock=clock)
    assert (await agent.run("one", session=session)).text == "#1"
    assert (await agent.run("two", session=session)).text == "#3"
    clock.now += 60
    assert (await agent.run("three", session=session)).text == "#1"
    assert [m["content"] for m in (await session.load()).messages] == [
        "three",
        [{"type": "text", "text": "#1"}],
    ]
    assert len(server.model.requests[-1]["messages"]) == 1


def test_an_expiring_sqlite_session_works_under_trio(path: Path, clock: Clock) -> None:
    session = SQLiteSession(path, "chat", ttl=60, clock=clock)

    async def main() -> tuple[SessionSnapshot, SessionSnapshot]:
        await session.append(ONE)
        before = await session.load()
        clock.now += 60
        return before, await session.load()

    assert anyio.run(main, backend="trio") == (SessionSnapshot(ONE, 1), NEVER)


@pytest.mark.parametrize(
    "ttl", [0, -1, float("nan"), "60", True], ids=["zero", "negative", "nan", "text", "bool"]
)
def test_a_ttl_is_a_number_of_seconds(ttl: Any, path: Path, redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="ttl must be a number of seconds > 0"):
        SQLiteSession(path, "chat", ttl=ttl)
    with pytest.raises(ConfigurationError, match="ttl must be a number of seconds > 0"):
        RedisSession(redis_url, "chat", ttl=ttl)
    with pytest.raises(ConfigurationError, match="ttl must be a number of seconds > 0"):
        open_session("chat", path, ttl=ttl)


def test_open_session_hands_the_ttl_to_either_store(path: Path, redis_url: str) -> None:
    sqlite = open_session("chat", path, ttl=60)
    redis = open_session("chat", redis_url, ttl=1.5)
    assert isinstance(sqlite, SQLiteSession) and sqlite.ttl == 60
    assert isinstance(redis, RedisSession) and redis.ttl == 1.5
    assert open_session("chat", path).ttl is None  # type: ignore[attr-defined]
    assert SQLiteSession(path, "chat", ttl=float("inf")).ttl is None


# -- SQLite: purging and the file


async def test_expired_sessions_are_purged_when_a_purge_is_due(path: Path, clock: Clock) -> None:
    start = clock.now
    other = SQLiteSession(path, "other", clock=clock)
    await other.load()  # a new file is due at once: nothing to purge, the next in 300 s
    for name in ("a", "b"):
        await SQLiteSession(path, name, ttl=60, clock=clock).append(ONE)
    await other.append(ONE)
    assert (rows(path, "sessions"), rows(path, "session_messages")) == (3, 6)

    clock.now = start + 299  # a and b expired, the next purge not yet due
    assert await SQLiteSession(path, "a", clock=clock).load() == NEVER
    await other.append(ONE)  # a write does not purge before it is due either
    assert (rows(path, "sessions"), rows(path, "session_messages")) == (3, 8)

    clock.now = start + 300
    await other.load()  # the first operation once due purges, a read as a write
    assert (rows(path, "sessions"), rows(path, "session_messages")) == (1, 4)
    assert (await other.load()).version == 2


async def test_a_file_overdue_is_purged_by_the_first_process_that_opens_it(
    path: Path, clock: Clock
) -> None:
    await SQLiteSession(path, "a", ttl=60, clock=clock).append(ONE)
    clock.now += 3600  # nobody opened the file since: a new process finds it overdue
    code = (
        "import sys, anyio; from agentloop.sessions import SQLiteSession\n"
        f"s = SQLiteSession(sys.argv[1], 'unrelated', clock=lambda: {clock.now!r})\n"
        "anyio.run(s.load)\n"
    )
    done = await anyio.run_process([sys.executable, "-c", code, str(path)], check=False)
    assert done.returncode == 0
    assert (rows(path, "sessions"), rows(path, "session_messages")) == (0, 0)


async def test_the_file_shrinks_after_a_purge(path: Path, clock: Clock) -> None:
    big = [{"role": "user", "content": "x" * 20_000}]
    for i in range(40):
        await SQLiteSession(path, f"gone-{i}", ttl=60, clock=clock).append(big)
    kept = SQLiteSession(path, "kept", clock=clock)
    await kept.append(ONE)
    with closing(sqlite3.connect(path)) as db:  # every page in the file itself
        assert db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    before = size(path)
    assert before > 40 * 20_000

    clock.now += 60
    assert await kept.purge() == 40
    after = size(path)
    assert after < before / 10
    assert size(Path(f"{path}-wal")) == 0  # checkpointed, or removed with the last connection
    assert await kept.load() == SessionSnapshot(ONE, 1)
    assert await kept.purge() == 0


OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, version INTEGER NOT NULL, state TEXT
);
CREATE TABLE IF NOT EXISTS session_messages (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, message TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""
"""The schema of a sessions file made before sessions could expire."""


def make_old_file(path: Path) -> None:
    """A file as the previous version wrote it: session `old`, two messages and a state."""
    db = connect_sqlite(path, OLD_SCHEMA)
    try:
        db.execute("INSERT INTO sessions VALUES ('old', 1, ?)", (json.dumps({"paused": 1}),))
        db.executemany(
            "INSERT INTO session_messages VALUES ('old', ?, ?)",
            [(i, json.dumps(m)) for i, m in enumerate(ONE)],
        )
    finally:
        db.close()


async def test_a_file_of_the_previous_schema_is_migrated_on_open(path: Path, clock: Clock) -> None:
    make_old_file(path)
    session = SQLiteSession(path, "old", ttl=60, clock=clock)
    assert await session.load() == SessionSnapshot(ONE, 1, {"paused": 1})
    with closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(sessions)")]
        indexes = [row[1] for row in db.execute("PRAGMA index_list(sessions)")]
    assert columns == ["id", "version", "state", "expires_at"]
    assert "sessions_expires_at" in indexes

    # A session of the old file was never written with a ttl: it is kept...
    clock.now += 10**9
    assert (await session.load()).version == 1
    # ...until a write with one.
    await session.append([{"role": "user", "content": "more"}], version=1)
    clock.now += 60
    assert await session.load() == NEVER


def test_processes_opening_an_old_file_together_migrate_it_once(path: Path) -> None:
    make_old_file(path)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            connect(path).close()
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(sessions)")]
    assert columns == ["id", "version", "state", "expires_at"]


# -- Redis: key expiry on the server


async def expiry_times(url: str, session: RedisSession) -> list[int]:
    """PEXPIRETIME of the session's three keys (-1: no expiry, -2: no key)."""
    from redis import asyncio as aioredis

    keys = [
        f"{RedisSession.PREFIX}{{{session.session_id}}}:{k}"
        for k in ("messages", "version", "state")
    ]
    client = aioredis.from_url(url)
    try:
        return [int(await client.execute_command("PEXPIRETIME", key)) for key in keys]
    finally:
        await client.aclose()


async def shorten(url: str, session: RedisSession, ms: int) -> None:
    """Bring the session's deadline `ms` from now, as if time had passed since its write."""
    from redis import asyncio as aioredis

    client = aioredis.from_url(url)
    try:
        for key in ("messages", "version", "state"):
            await client.pexpire(f"{RedisSession.PREFIX}{{{session.session_id}}}:{key}", ms)
    finally:
        await client.aclose()


async def until_gone(session: RedisSession) -> None:
    """Wait until the session reads as never written, failing after 10 s.

    Redis expires keys on its own clock, and says so to nobody: there is no event to
    wait on, so the session is read every few milliseconds.
    """
    with anyio.fail_after(10):
        while await session.load() != NEVER:  # noqa: ASYNC110 (see above)
            await anyio.sleep(0.01)


@pytest.mark.parametrize("write", WRITES)
async def test_every_redis_write_sets_one_deadline_for_every_key(
    redis_url: str, request: pytest.FixtureRequest, write: Callable[[RedisSession], Any]
) -> None:
    session = RedisSession(redis_url, request.node.name, ttl=100)
    await session.append(ONE, state={"paused": True})
    await shorten(redis_url, session, 5_000)  # as if 95 s had passed
    written = time.time() * 1000
    await write(session)
    deadlines = [t for t in await expiry_times(redis_url, session) if t != -2]
    assert deadlines and len(set(deadlines)) == 1  # every key the session has, one deadline
    assert written + 90_000 < deadlines[0] <= time.time() * 1000 + 100_000


async def test_a_redis_session_without_ttl_has_no_expiry(
    redis_url: str, request: pytest.FixtureRequest
) -> None:
    session = RedisSession(redis_url, request.node.name)
    await session.append(ONE, state={"paused": True})
    assert await expiry_times(redis_url, session) == [-1, -1, -1]
    await RedisSession(redis_url, session.session_id, ttl=100).save_state({"paused": 2})
    assert -1 not in await expiry_times(redis_url, session)
    await session.clear_state()  # the last writer's ttl decides: none
    assert await expiry_times(redis_url, session) == [-1, -1, -2]


async def test_a_redis_session_not_written_for_its_ttl_reads_as_one_that_never_existed(
    redis_url: str, request: pytest.FixtureRequest
) -> None:
    name = request.node.name
    session = RedisSession(redis_url, name, ttl=60)
    await session.append(ONE, version=0, state={"paused": True})
    assert await session.load() == SessionSnapshot(ONE, 1, {"paused": True})
    await RedisSession(redis_url, name, ttl=0.05).clear_state()  # a write with a tiny ttl
    await until_gone(session)
    assert await session.load_state() is None
    assert await session.load() == await RedisSession(redis_url, name + "/never").load()
    assert await session.append([{"role": "user", "content": "again"}], version=0) == 1
    assert await session.load() == SessionSnapshot([{"role": "user", "content": "again"}], 1)


# -- a paused run in an expired session


async def resume_error(agent: Agent, session: Any, tool_use_id: str) -> ConfigurationError:
    from agentloop import Approve

    with pytest.raises(ConfigurationError) as refused:
        await agent.resume(session=session, decisions={tool_use_id: Approve()})
    return refused.value


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_paused_run_in_an_expired_session_resumes_as_an_unknown_one(
    kind: str,
    path: Path,
    clock: Clock,
    request: pytest.FixtureRequest,
    serve: Callable[..., MessagesServer],
) -> None:
    from _approval import make_agent, ran

    call = tool_call("refund", {"order": "A1", "amount": 500})
    server = serve([reply(call)])
    agent = make_agent(server.client())

    def session_named(name: str, ttl: float) -> Any:
        if kind == "sqlite":
            return SQLiteSession(path, name, ttl=ttl, clock=clock)
        return RedisSession(request.getfixturevalue("redis_url"), name, ttl=ttl)

    name = request.node.name
    session = session_named(name, 60)
    paused = await agent.run("Refund A1", session=session)
    assert paused.stop_reason == "approval_required"
    assert (await session.load()).state is not None
    if kind == "sqlite":
        clock.now += 60
    else:
        await session_named(name, 0.05).save_state(paused.state)  # rewritten, tiny ttl
        await until_gone(session)

    ran.clear()
    expired = await resume_error(agent, session, call["id"])
    unknown = await resume_error(agent, session_named(name + "/never", 60), call["id"])
    assert type(expired) is type(unknown)
    assert str(expired) == str(unknown).replace("/never", "")
    assert "holds no paused run" in str(expired)
    assert ran == [] and len(server.model.requests) == 1


async def test_a_paused_run_kept_elsewhere_resumes_into_a_new_session(
    path: Path, clock: Clock, serve: Callable[..., MessagesServer]
) -> None:
    from _approval import make_agent, ran

    from agentloop import Approve

    call = tool_call("refund", {"order": "A1", "amount": 500})
    server = serve([reply(call), reply("Refunded.")])
    agent = make_agent(server.client())
    session = SQLiteSession(path, "refunds", ttl=60, clock=clock)
    paused = await agent.run("Refund A1", session=session)
    kept = json.loads(json.dumps(paused.state))  # the service's own copy
    clock.now += 60

    ran.clear()
    done = await agent.resume(kept, session=session, decisions={call["id"]: Approve()})
    assert done.text == "Refunded." and ran == [("refund", {"order": "A1", "amount": 500})]
    assert await session.load() == SessionSnapshot(done.messages, 1)


# -- the command line


async def test_the_command_line_gives_a_conversation_a_ttl(
    path: Path, serve: Callable[..., MessagesServer]
) -> None:
    server = serve(echo)
    env = {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.base_url}
    where = ["--session", "trip", "--session-db", str(path)]
    before = time.time()
    code, _, err = await agentloop_command("run", "hi", *where, "--session-ttl", "3600", **env)
    assert code == 0, err
    after = time.time()
    assert (await SQLiteSession(path, "trip", clock=lambda: before + 3599).load()).version == 1
    assert await SQLiteSession(path, "trip", clock=lambda: after + 3600).load() == NEVER

    code, out, err = await agentloop_command("run", "hi", "--session-ttl", "60")
    assert (code, out) == (2, "")
    assert err == "agentloop: error: --session-ttl needs --session NAME\n"
    code, out, err = await agentloop_command("run", "hi", *where, "--session-ttl", "0")
    assert code == 2 and "--session-ttl" in err and "seconds > 0" in err
