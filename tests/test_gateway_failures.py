"""The gateway when its session store fails: wiped, down, locked or deleted.

The gateway served in this process on a real `redis-server` or a real SQLite file; the
upstream is the scripted Messages server.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import anthropic
import pytest
import redis
from _gateway import dump, gateway_on, redis_server

from agentloop import tool
from agentloop.gateway.app import GatewayConfig
from agentloop.testing import MessagesServer, reply, tool_call

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
