"""Session stores and session keys, without a gateway around them.

The memory and sqlite stores run on a clock the tests move; the Redis store runs on a
real `redis-server` and its own clock.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import redis_server

from agentloop.errors import ConfigurationError
from agentloop.gateway import MemoryStore, RedisStore, Sessions, SQLiteStore, open_store
from agentloop.gateway.sessions import (
    Session,
    canonical_json,
    continue_history,
    last_marker,
    moved_markers,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


StoreFactory = Callable[[float], Any]


@pytest.fixture(params=["memory", "sqlite"])
async def clocked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Callable[[float], Any], Clock]]:
    clock = Clock()
    opened: list[Any] = []

    async def make(ttl: float) -> Any:
        if request.param == "memory":
            store: Any = MemoryStore(ttl=ttl, clock=clock)
        else:
            store = SQLiteStore(tmp_path / "sub" / "s.db", ttl=ttl, clock=clock)
        await store.open()
        opened.append(store)
        return store

    yield make, clock
    for store in opened:
        await store.aclose()


async def test_the_first_write_wins(clocked: Any) -> None:
    make, _ = clocked
    store = await make(60)
    assert await store.put("k", b"first") is True
    assert await store.put("k", b"second") is False
    assert await store.get_many(["k", "missing", "k"]) == [b"first", None, b"first"]


async def test_values_expire_and_refresh_restarts_the_ttl(clocked: Any) -> None:
    make, clock = clocked
    store = await make(10)
    await store.put("parent", b"p")
    await store.put("lonely", b"l")
    clock.now += 6
    await store.put("child", b"c", refresh=["parent"])
    clock.now += 6
    assert await store.get_many(["parent", "child", "lonely"]) == [b"p", b"c", None]
    assert await store.put("lonely", b"again") is True, "an expired key can be written anew"
    clock.now += 11
    assert await store.get_many(["parent", "child", "lonely"]) == [None, None, None]
    assert await store.purge() == 3


async def test_sqlite_purge_deletes_the_rows(tmp_path: Path) -> None:
    clock = Clock()
    store = SQLiteStore(tmp_path / "p.db", ttl=5, clock=clock)
    await store.open()
    try:
        await store.put("a", b"1")
        clock.now += 6
        await store.purge()
    finally:
        await store.aclose()
    with sqlite3.connect(tmp_path / "p.db") as db:
        assert db.execute("SELECT count(*) FROM snapshots").fetchone() == (0,)


async def test_a_sqlite_purge_shrinks_the_file(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "shrink.db"
    store = SQLiteStore(path, ttl=5, clock=clock)
    await store.open()
    try:
        for i in range(1000):
            await store.put(f"k{i}", bytes(10_000))
        full = _size(tmp_path)
        clock.now += 6
        assert await store.purge() == 1000
        emptied = _size(tmp_path)
    finally:
        await store.aclose()
    assert full > 10_000_000
    assert emptied < full / 10, (full, emptied)


def _size(folder: Path) -> int:
    """Bytes of the SQLite files in `folder` (the database and its WAL)."""
    return sum(p.stat().st_size for p in folder.glob("shrink.db*"))


async def test_the_sqlite_secret_outlives_the_process(tmp_path: Path) -> None:
    secrets = []
    for _ in range(2):
        store = SQLiteStore(tmp_path / "x.db", ttl=5)
        await store.open()
        secrets.append(await store.secret())
        await store.aclose()
    assert secrets[0] == secrets[1] and len(secrets[0]) == 32


async def test_redis_store(redis_url: str) -> None:
    one = RedisStore(redis_url, ttl=0.5)
    two = RedisStore(redis_url, ttl=0.5)
    await one.open()
    await two.open()
    try:
        assert await one.secret() == await two.secret()
        assert await one.put("k", b"first") is True
        assert await two.put("k", b"second") is False
        assert await two.get_many(["k", "nope"]) == [b"first", None]
        ttl_ms = await one._redis.pttl(RedisStore.PREFIX + "k")
        assert 0 < ttl_ms <= 500
        # Redis expires the key itself: the TTL passing is what is tested.
        deadline = time.monotonic() + 10
        while await one.get_many(["k"]) != [None]:
            assert time.monotonic() < deadline, "the key never expired"
            await anyio.sleep(0.05)
        assert await one._redis.exists(RedisStore.PREFIX + "k") == 0
    finally:
        await one.aclose()
        await two.aclose()


def test_store_urls() -> None:
    assert isinstance(open_store("memory://", ttl=1), MemoryStore)
    assert isinstance(open_store("redis://localhost:6379/0", ttl=1), RedisStore)
    sqlite_store = open_store("sqlite:////tmp/abs.db", ttl=1)
    assert isinstance(sqlite_store, SQLiteStore) and sqlite_store.path == Path("/tmp/abs.db")
    relative = open_store("sqlite:///rel/s.db", ttl=1)
    assert isinstance(relative, SQLiteStore) and relative.path == Path("rel/s.db")
    for bad in ["postgres://x", "sqlite:///", "memory://"]:
        with pytest.raises(ConfigurationError):
            open_store(bad, ttl=0 if bad == "memory://" else 1)


# --------------------------------------------------------------------------- session keys


def test_canonical_json_ignores_how_a_client_wrote_the_conversation() -> None:
    a = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "yo", "citations": None}],
        },
    ]
    b = [
        {
            "content": [{"text": "hi", "type": "text", "cache_control": {"type": "ephemeral"}}],
            "role": "user",
        },
        {"role": "assistant", "content": [{"text": "yo", "type": "text"}]},
    ]
    assert canonical_json(a) == canonical_json(b)
    changed = [a[0], {"role": "assistant", "content": "yo!"}]
    assert canonical_json(a) != canonical_json(changed)
    # Tool inputs are data: a null in them is kept.
    with_null = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": None}}],
        }
    ]
    without = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
        }
    ]
    assert canonical_json(with_null) != canonical_json(without)


def test_canonical_json_writes_a_whole_number_one_way() -> None:
    def asked(value: Any) -> list[Any]:
        call = {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": value, "y": [value]}}
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": [call]}]

    # What Python sent, and what a JavaScript client echoes back (`JSON.stringify`).
    assert canonical_json(asked(1.0)) == canonical_json(asked(1))
    assert canonical_json(asked(1e21)) == canonical_json(asked(10**21))
    assert canonical_json(asked(1.5)) != canonical_json(asked(1))


async def test_keys_are_scoped_by_credential_and_secret() -> None:
    store = MemoryStore(ttl=60)
    visible = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    one = Sessions(store, b"secret-1")
    assert one.key("sk-a", visible) == one.key("sk-a", list(visible))
    assert one.key("sk-a", visible) != one.key("sk-b", visible)
    assert one.key("sk-a", visible) != Sessions(store, b"secret-2").key("sk-a", visible)
    assert one.key("sk-a", visible) != one.thread_key("sk-a", "msg_1")


async def test_snapshots_are_deltas_and_need_every_ancestor() -> None:
    clock = Clock()
    store = MemoryStore(ttl=10, clock=clock)
    sessions = Sessions(store, b"s")
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    await sessions.save("k1", first, parent=None)
    parent = await sessions.load("k1")
    assert parent is not None and parent.messages == first
    second = [*first, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    await sessions.save("k2", second, parent=parent)
    raw = (await store.get_many(["k2"]))[0]
    assert raw is not None and b'"a"' not in raw, "the child stores only what it adds"
    child = await sessions.load("k2")
    assert child is not None and child.messages == second and child.ancestors == ("k1",)
    del store._values["k1"]
    assert await sessions.load("k2") is None, "a snapshot whose ancestor is gone is gone"


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_key_two_conversations_wrote_restores_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        store: Any = SQLiteStore(tmp_path / "a.db", ttl=60)
    else:
        store = RedisStore(request.getfixturevalue("redis_url"), ttl=60)
    await store.open()
    try:
        sessions = Sessions(store, b"s")
        mine = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "secret-1"}]
        theirs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "secret-2"}]
        await sessions.save("same", mine, parent=None)
        await sessions.save("same", mine, parent=None)  # a retry storing the same turns
        found = await sessions.find("same")
        assert found.session is not None and not found.ambiguous
        await sessions.save("same", theirs, parent=None)
        found = await sessions.find("same")
        assert found.session is None and found.ambiguous
        assert await sessions.load("same") is None
    finally:
        await store.aclose()


def test_continue_history_answers_every_call_in_order() -> None:
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "c1", "name": "client", "input": {}},
            {"type": "tool_use", "id": "g1", "name": "ours", "input": {}},
            {"type": "tool_use", "id": "c2", "name": "client", "input": {}},
        ],
    }
    held = [{"type": "tool_result", "tool_use_id": "g1", "content": "ours"}]
    session = Session("k", (), [{"role": "user", "content": "go"}, assistant], held)
    theirs = [
        {"type": "text", "text": "here"},
        {"type": "tool_result", "tool_use_id": "c2", "content": "2"},
        {"type": "tool_result", "tool_use_id": "c1", "content": "1"},
    ]
    history = continue_history(session, [{"role": "user", "content": theirs}])
    assert [b.get("tool_use_id") for b in history[-1]["content"]] == ["c1", "g1", "c2", None]


def test_continue_history_merges_into_a_stored_user_message() -> None:
    stored = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "g", "name": "n", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "g", "content": "x"}]},
    ]
    history = continue_history(Session("k", (), stored), [{"role": "user", "content": "more"}])
    assert history[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "g", "content": "x"},
        {"type": "text", "text": "more"},
    ]
    assert len(history) == 3


def test_stored_markers_give_way_to_the_clients_latest_one() -> None:
    one_hour = {"type": "ephemeral", "ttl": "1h"}
    nested = {"type": "text", "text": "r", "cache_control": {"type": "ephemeral"}}
    stored = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "g", "name": "n", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "g", "content": [nested]}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "done"},
                {"type": "text", "text": ""},
                {"type": "thinking", "thinking": "t", "signature": "s"},
            ],
        },
    ]
    assert last_marker(stored) == {"type": "ephemeral"}
    history = continue_history(
        Session("k", (), stored), [{"role": "user", "content": "next"}], marker=one_hour
    )
    marked = [
        (i, j)
        for i, m in enumerate(history)
        for j, b in enumerate(m["content"] if isinstance(m["content"], list) else [])
        if "cache_control" in b or "cache_control" in str(b.get("content"))
    ]
    # The one marker sits on the last block that takes one (not thinking, not empty text).
    assert marked == [(3, 0)]
    assert history[3]["content"][0]["cache_control"] == one_hour
    assert history[2]["content"][0]["content"] == [{"type": "text", "text": "r"}]
    assert stored[0]["content"][0]["cache_control"] == {"type": "ephemeral"}, "not changed"
    # Without a marker from the client, none is put back.
    assert last_marker(moved_markers(stored, None)) is None
    assert moved_markers([{"role": "user", "content": "plain"}], one_hour) == [
        {"role": "user", "content": [{"type": "text", "text": "plain", "cache_control": one_hour}]}
    ]


def test_the_gateway_package_imports_without_its_server_dependencies() -> None:
    code = (
        "import sys\n"
        "for name in ('starlette', 'uvicorn', 'redis'): sys.modules[name] = None\n"
        "import agentloop, agentloop.gateway\n"
        "from agentloop.gateway import open_store\n"
        "open_store('memory://', ttl=1)\n"
        "from agentloop.gateway.cli import serve_command\n"
        "import argparse\n"
        "args = argparse.Namespace(plugins=None, tools=None)\n"
        "sys.exit(serve_command(args))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "agentloop-runner[gateway]" in done.stderr


class _EngineThatFailsToStop:
    """A durable part whose stop fails (the gateway only opens and stops it here)."""

    async def open(self) -> None:
        pass

    async def aclose(self) -> None:
        raise RuntimeError("the engine did not stop")


async def test_a_gateway_closes_its_upstream_and_store_when_its_engine_fails_to_stop(
    tmp_path: Path,
) -> None:
    from agentloop.gateway.app import Gateway, GatewayConfig

    store = SQLiteStore(tmp_path / "g.db", ttl=60)
    config = GatewayConfig(upstream="http://127.0.0.1:9", store="memory://")
    gateway = Gateway(config, store=store, durable=_EngineThatFailsToStop())  # type: ignore[arg-type]
    await gateway.start()
    assert gateway.upstream is not None
    with pytest.raises(RuntimeError, match="did not stop"):
        await gateway.aclose()
    assert gateway.upstream is None
    with pytest.raises(RuntimeError, match="not open"):
        await store.secret()
