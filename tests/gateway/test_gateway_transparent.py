"""The gateway is transparent: a request shaped like Claude Code's goes upstream untouched.

Claude Code's default model gets a `system` message in the middle of `messages` (under
the `mid-conversation-system-2026-04-07` beta), adaptive thinking, `context_management`
and `output_config`. The real `anthropic` SDK sends such a request through the gateway
(served in this process, with a gateway tool); the scripted upstream must receive the
client's messages in place, its fields and its beta, also around the gateway's own hidden
tool round and when the conversation continues.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import pytest
from _gateway import CLIENT_TOOL, gateway_on

from agentloop import tool
from agentloop.gateway.app import GatewayConfig
from agentloop.testing import MessagesServer, reply, tool_call
from agentloop.testing.server import count_tokens

pytestmark = pytest.mark.timeout(60)

BETA = "mid-conversation-system-2026-04-07"
REMINDER = {"role": "system", "content": "<system-reminder>Today is Tuesday.</system-reminder>"}
OPTIONS: dict[str, Any] = {
    "model": "claude-default",
    "max_tokens": 32000,
    "system": [{"type": "text", "text": "You are a coding agent."}],
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "tools": [CLIENT_TOOL],
    "metadata": {"user_id": "user-1"},
    "betas": [BETA, "context-management-2025-06-27"],
}
FIELDS = ("thinking", "context_management", "output_config", "system", "metadata")


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@asynccontextmanager
async def served(*script: Any) -> AsyncIterator[tuple[anthropic.AsyncAnthropic, MessagesServer]]:
    """An SDK client of the gateway (in this task), and the gateway's upstream."""
    upstream = MessagesServer(list(script)).start()
    config = GatewayConfig(upstream=upstream.base_url, store="memory://", tools=[lookup])
    try:
        async with gateway_on(config) as url:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-client", max_retries=0)
            async with client:
                yield client, upstream
    finally:
        upstream.stop()


def first_messages() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "Look a up."}]},
        copy.deepcopy(REMINDER),
    ]


async def ask(
    client: anthropic.AsyncAnthropic, messages: list[dict[str, Any]], *, stream: bool = True
) -> Any:
    """Send as Claude Code does: on the beta endpoint, streamed unless told otherwise."""
    if not stream:  # a timeout of its own: the SDK wants a stream for a large max_tokens
        return await client.beta.messages.create(messages=messages, timeout=60, **OPTIONS)  # type: ignore[arg-type]
    async with client.beta.messages.stream(messages=messages, **OPTIONS) as events:  # type: ignore[arg-type]
        return await events.get_final_message()


def assert_passed_on(body: dict[str, Any], beta_header: str) -> None:
    """The client's own fields and beta reached the upstream as sent."""
    for name in FIELDS:
        assert body[name] == OPTIONS[name], name
    assert BETA in beta_header.split(",")


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_a_mid_conversation_system_message_goes_upstream_in_place(stream: bool) -> None:
    thinking = {"type": "thinking", "thinking": "Look it up.", "signature": "sig-1"}
    call = tool_call("lookup", {"key": "a"})
    async with served(reply(thinking, call), reply("It is value of a.")) as (client, upstream):
        messages = first_messages()
        sent = copy.deepcopy(messages)
        message = await ask(client, messages, stream=stream)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[-1].text == "It is value of a."
    first, second = upstream.recorded
    # The first round: the client's messages exactly, the system message in place.
    assert first.body["messages"] == sent
    assert_passed_on(first.body, first.headers["anthropic-beta"])
    assert [t["name"] for t in first.body["tools"]] == ["lookup", "client_tool"]
    # The hidden round: the gateway's turn is added after the client's, which stay put.
    assert second.body["messages"] == [
        *sent,
        {"role": "assistant", "content": [thinking, call]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": "value of a"}
            ],
        },
    ]
    assert_passed_on(second.body, second.headers["anthropic-beta"])


async def test_the_hidden_round_is_restored_around_system_messages() -> None:
    call = tool_call("lookup", {"key": "a"})
    script = [reply(call), reply("It is value of a."), reply("Glad to help.")]
    async with served(*script) as (client, upstream):
        messages = first_messages()
        first = await ask(client, messages)
        shown = first.model_dump(mode="json", exclude_none=True)
        following = [
            *messages,
            {"role": "assistant", "content": shown["content"]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
            {"role": "system", "content": "<system-reminder>Still Tuesday.</system-reminder>"},
        ]
        sent = copy.deepcopy(following)
        await ask(client, following)
    last = upstream.recorded[-1].body["messages"]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "value of a"}
    # The stored conversation (hidden turn included) keeps the first system message in
    # place, and the client's new messages follow it as sent.
    assert last == [
        *sent[:2],
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
        {"role": "assistant", "content": [{"type": "text", "text": "It is value of a."}]},
        *sent[3:],
    ]


async def test_count_tokens_takes_the_same_body() -> None:
    async with served() as (client, upstream):
        messages = first_messages()
        sent = copy.deepcopy(messages)
        options = {k: v for k, v in OPTIONS.items() if k not in ("max_tokens", "metadata")}
        counted = await client.beta.messages.count_tokens(messages=messages, **options)  # type: ignore[arg-type]
    (seen,) = upstream.recorded
    assert seen.path == "/v1/messages/count_tokens"
    assert seen.body["messages"] == sent
    for name in ("thinking", "context_management", "output_config", "system"):
        assert seen.body[name] == OPTIONS[name], name
    assert BETA in seen.headers["anthropic-beta"].split(",")
    assert [t["name"] for t in seen.body["tools"]] == ["lookup", "client_tool"]
    assert counted.input_tokens == count_tokens(seen.body)


async def test_a_mixed_turn_is_answered_across_a_system_message() -> None:
    theirs = tool_call("client_tool", {"x": 7})
    ours = tool_call("lookup", {"key": "b"})
    mixed = reply("Both at once.", theirs, ours)
    async with served(mixed, reply("Done: 7 and value of b.")) as (client, upstream):
        messages = first_messages()
        first = await ask(client, messages)
        assert first.stop_reason == "tool_use"
        shown = first.model_dump(mode="json", exclude_none=True)["content"]
        assert shown == [{"type": "text", "text": "Both at once."}, theirs]
        result = {"type": "tool_result", "tool_use_id": theirs["id"], "content": "seven"}
        following = [
            *messages,
            {"role": "assistant", "content": shown},
            copy.deepcopy(REMINDER),
            {"role": "user", "content": [result]},
        ]
        sent = copy.deepcopy(following)
        second = await ask(client, following)
    assert second.content[-1].text == "Done: 7 and value of b."
    ours_result = {"type": "tool_result", "tool_use_id": ours["id"], "content": "value of b"}
    # The stored assistant message, the client's system message where it stood, then
    # one user message answering both calls in the model's order.
    assert upstream.recorded[-1].body["messages"] == [
        *sent[:2],
        {"role": "assistant", "content": mixed["content"]},
        sent[3],
        {"role": "user", "content": [result, ours_result]},
    ]


async def test_the_system_message_is_part_of_the_session_key() -> None:
    call = tool_call("lookup", {"key": "a"})
    script = [reply(call), reply("It is value of a."), reply("Glad to help.")]
    async with served(*script) as (client, upstream):
        messages = first_messages()
        first = await ask(client, messages)
        shown = first.model_dump(mode="json", exclude_none=True)
        other = {"role": "system", "content": "<system-reminder>Today is Friday.</system-reminder>"}
        following = [
            messages[0],
            other,
            {"role": "assistant", "content": shown["content"]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        ]
        sent = copy.deepcopy(following)
        await ask(client, following)
    # Another system message makes another conversation: no hidden turn is restored.
    assert upstream.recorded[-1].body["messages"] == sent
