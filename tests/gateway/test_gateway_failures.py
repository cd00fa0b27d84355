"""The gateway when its session store fails: wiped, down, locked or deleted.

The gateway served in this process on a real `redis-server` or a real SQLite file; the
upstream is the scripted Messages server.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anthropic
import anyio
import pytest
import redis
from _gateway import dump, gateway_on
from support import redis_process, redis_server

from agentloop import tool
from agentloop.gateway.app import SESSION_HEADER, GatewayConfig
from agentloop.testing import Fault, MessagesServer, reply, tool_call

pytestmark = pytest.mark.timeout(60)


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


CALL = tool_call("lookup", {"key": "k"})


@pytest.fixture
def upstream() -> Iterator[MessagesServer]:
    """Answers a request with a hidden turn (`CALL`), then its follow-up."""
    server = MessagesServer([reply(CALL), reply("It is the value of k."), reply("And else?")])
    server.start()
    yield server
    server.stop()


ASK: list[Any] = [{"role": "user", "content": "k?"}]


def follow_up(answer: Any) -> list[Any]:
    return [
        *ASK,
        {"role": "assistant", "content": dump(answer.content)},
        {"role": "user", "content": "And?"},
    ]


def client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-client", max_retries=0)


async def test_replicas_agree_on_the_secret_after_redis_lost_it(upstream: MessagesServer) -> None:
    with redis_server() as url:
        config = GatewayConfig(upstream=upstream.base_url, store=url, tools=[lookup])
        async with AsyncExitStack() as stack:
            old = await stack.enter_async_context(gateway_on(config))
            # Redis restarts empty (as one without persistence does); a new replica starts.
            redis.Redis.from_url(url).flushall()
            new = await stack.enter_async_context(gateway_on(config))
            async with client(old) as one, client(new) as two:
                answer = await one.messages.create(model="m", max_tokens=50, messages=ASK)
                await two.messages.create(model="m", max_tokens=50, messages=follow_up(answer))
    sent = upstream.recorded[-1].body["messages"]
    assert sent[1]["content"] == [CALL], "the new replica restored the old one's hidden turn"


async def test_a_dead_redis_is_an_api_error_and_a_finished_answer_still_arrives(
    upstream: MessagesServer,
) -> None:
    with redis_process() as server:

        @tool
        def lookup(key: str) -> str:
            """Look a key up (the store dies meanwhile)."""
            server.stop()
            return f"value of {key}"

        config = GatewayConfig(upstream=upstream.base_url, store=server.url, tools=[lookup])
        async with gateway_on(config) as url, client(url) as http:
            raw = await http.messages.with_raw_response.create(
                model="m", max_tokens=50, messages=ASK
            )
            answer = await raw.parse()
            # The run ended after its tool ran: the answer is the client's, though unsaved.
            assert dump(answer.content) == [{"type": "text", "text": "It is the value of k."}]
            assert raw.headers[SESSION_HEADER] == "unsaved"
            with pytest.raises(anthropic.InternalServerError) as caught:
                await http.messages.create(model="m", max_tokens=50, messages=follow_up(answer))
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "error"
    assert error["error"]["type"] == "api_error"
    assert "session store" in error["error"]["message"]
    assert len(upstream.requests) == 2, "the failed lookup never went upstream"


async def test_the_first_request_after_a_redis_restart_is_answered(
    upstream: MessagesServer,
) -> None:
    with redis_process() as server:
        config = GatewayConfig(
            upstream=upstream.base_url, store=server.url, tools=[lookup], secret=b"fixed"
        )
        async with gateway_on(config) as url, client(url) as http:
            answer = await http.messages.create(model="m", max_tokens=50, messages=ASK)
            # Every pooled connection to Redis dies with it; the new server is empty.
            await anyio.to_thread.run_sync(server.restart)
            raw = await http.messages.with_raw_response.create(
                model="m", max_tokens=50, messages=follow_up(answer)
            )
    assert raw.http_response.status_code == 200
    assert dump((await raw.parse()).content) == [{"type": "text", "text": "And else?"}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_sqlite_file_locked_by_another_process_loses_no_answer(
    upstream: MessagesServer, tmp_path: Path, stream: bool
) -> None:
    db = tmp_path / "locked.db"
    config = GatewayConfig(upstream=upstream.base_url, store=f"sqlite:///{db}", tools=[lookup])
    holder = "import sqlite3, sys\n" + (
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    async with gateway_on(config) as url, client(url) as http:
        async with await anyio.open_process([sys.executable, "-c", holder, str(db)]) as locker:
            assert locker.stdout is not None and locker.stdin is not None
            assert (await locker.stdout.receive()).startswith(b"locked")
            try:
                if stream:
                    async with http.messages.stream(
                        model="m", max_tokens=50, messages=ASK
                    ) as events:
                        answer = await events.get_final_message()
                else:
                    raw = await http.messages.with_raw_response.create(
                        model="m", max_tokens=50, messages=ASK
                    )
                    assert raw.headers[SESSION_HEADER] == "unsaved"
                    answer = await raw.parse()
            finally:
                await locker.stdin.aclose()
                await locker.wait()
    assert dump(answer.content)[-1] == {"type": "text", "text": "It is the value of k."}
    assert answer.stop_reason == "end_turn"


async def test_a_deleted_sqlite_file_is_made_again(
    upstream: MessagesServer, tmp_path: Path
) -> None:
    db = tmp_path / "gone.db"
    config = GatewayConfig(upstream=upstream.base_url, store=f"sqlite:///{db}", tools=[lookup])
    async with gateway_on(config) as first, client(first) as http:
        _remove(tmp_path, "gone.db*")  # with its WAL files, as `rm gone.db*` does
        answer = await http.messages.create(model="m", max_tokens=50, messages=ASK)
        assert await anyio.Path(db).exists()
        # Another gateway on the same path (a restart, a second process) continues it.
        async with gateway_on(config) as second, client(second) as again:
            await again.messages.create(model="m", max_tokens=50, messages=follow_up(answer))
    assert upstream.recorded[-1].body["messages"][1]["content"] == [CALL]


def _remove(folder: Path, pattern: str) -> None:
    for path in folder.glob(pattern):
        path.unlink()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_retry_after_a_failed_hidden_round_never_runs_the_tools_again(
    stream: bool,
) -> None:
    ran: list[str] = []

    @tool
    def remember(note: str) -> str:
        """Write a note down (a side effect)."""
        ran.append(note)
        return "written"

    failed = Fault.server_error(500, retry_after=0)
    upstream = MessagesServer(
        [reply(tool_call("remember", {"note": "n"})), failed, failed, failed, reply("Noted.")]
    ).start()
    config = GatewayConfig(upstream=upstream.base_url, store="memory://", tools=[remember])
    try:
        async with gateway_on(config) as url, client(url) as http:

            async def ask() -> Any:
                if not stream:
                    return await http.messages.create(model="m", max_tokens=50, messages=ASK)
                async with http.messages.stream(model="m", max_tokens=50, messages=ASK) as s:
                    return await s.get_final_message()

            with pytest.raises(anthropic.APIStatusError):
                await ask()
            answer = await ask()  # the client's retry of the same request
    finally:
        upstream.stop()
    assert ran == ["n"], "the tool ran once"
    assert dump(answer.content)[-1] == {"type": "text", "text": "Noted."}
    last = upstream.recorded[-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert last[2]["content"][0]["content"] == "written"
