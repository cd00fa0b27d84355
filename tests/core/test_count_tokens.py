"""Token counting: `agent.count_tokens` counts the request a run would send, by the API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentloop import Agent, ConfigurationError, OpenAIChatProvider, ProviderError, tool
from agentloop.testing import ChatCompletionsServer, MessagesServer, reply
from agentloop.testing.server import count_tokens

EARLIER = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": [{"type": "text", "text": "4."}]},
]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _counted(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("system", "tools", "messages") if k in body}


async def test_count_tokens_counts_what_the_first_request_sends(
    serve: Callable[..., MessagesServer],
) -> None:
    server = serve([reply("8.")])
    agent = Agent(client=server.client(), system="Be brief.", tools=[add])
    counted = await agent.count_tokens("And 4 + 4?", history=EARLIER)
    [count] = server.recorded
    assert count.path == "/v1/messages/count_tokens"
    assert counted == count_tokens(count.body)
    await agent.run("And 4 + 4?", history=EARLIER)
    sent = server.requests[0]
    # The same system, tools and history, the cache markers a sent request has included.
    assert _counted(count.body) == _counted(sent)
    assert "cache_control" in str(count.body["messages"])
    assert count.body["model"] == sent["model"] and "max_tokens" not in count.body


async def test_a_held_run_counted_first_then_runs_that_request(
    serve: Callable[..., MessagesServer],
) -> None:
    server = serve([reply("hello")])
    run = Agent(client=server.client(), tools=[add]).start("hi")
    counted = await run.count_tokens()
    async with run:
        pass
    assert run.result.text == "hello"
    count, sent = server.recorded
    assert counted == count_tokens(count.body)
    assert _counted(count.body) == _counted(sent.body)
    with pytest.raises(ConfigurationError, match="before it is entered"):
        await run.count_tokens()


async def test_count_tokens_with_a_typed_output_counts_its_tool(
    serve: Callable[..., MessagesServer],
) -> None:
    server = serve([])
    agent = Agent(client=server.client(), output_mode="tool", output_type=int)
    plain = await Agent(client=server.client()).count_tokens("How many?")
    typed = await agent.count_tokens("How many?")
    assert typed > plain
    assert server.recorded[1].body["tools"][0]["name"] == "final_result"


async def test_count_tokens_refusals(
    serve: Callable[..., MessagesServer],
    serve_chat: Callable[..., ChatCompletionsServer],
) -> None:
    chat = serve_chat([])
    with pytest.raises(ConfigurationError, match="cannot count tokens"):
        await Agent(provider=OpenAIChatProvider(chat.client())).count_tokens("hi")
    server = serve([])
    # A result answering no call: the endpoint refuses it as the API would (a 400).
    orphan = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]
    with pytest.raises(ProviderError, match="tool_result"):
        await Agent(client=server.client(), history_check="off").count_tokens(history=orphan)
    assert [r.path for r in server.recorded] == ["/v1/messages/count_tokens"]
