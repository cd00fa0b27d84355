"""The AI SDK endpoint against the `ai` package's own chat code (what `useChat` runs).

Node runs the chat (tests/ui/ai_chat.mjs): `AbstractChat` over `DefaultChatTransport`
posts the chat, parses the UI message stream against the protocol's chunk schema and
builds the assistant message from it; a call waiting for approval is answered with
`addToolApprovalResponse`, and the chat sends again by itself. The test reads the chat's
messages. The model is a scripted Messages API on 127.0.0.1.
"""

from __future__ import annotations

from typing import Any

import anyio
from _ui import NodeClient, served

from agentloop import Agent, tool
from agentloop.testing import Fault, MessagesServer, reply, tool_call
from agentloop.ui import VercelAIEndpoint

MODEL = "claude-sonnet-4-5"


def _tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"].startswith("tool-")]


async def test_parallel_calls_then_an_approval_then_the_answer(ai_chat: NodeClient) -> None:
    both_in = anyio.Event()
    entered: list[str] = []

    @tool
    async def get_weather(city: str) -> str:
        """Current weather for a city."""
        entered.append(city)
        if len(entered) == 2:
            both_in.set()
        with anyio.fail_after(10):  # each waits for the other: they run at once
            await both_in.wait()
        return f"Sunny in {city}"

    @tool(requires_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount} on {order}"

    paris = tool_call("get_weather", {"city": "Paris"})
    rome = tool_call("get_weather", {"city": "Rome"})
    back = tool_call("refund", {"order": "B2", "amount": 500})
    script = [
        reply("Checking.", paris, rome, back, model=MODEL),
        reply("Sunny; B2 refunded.", model=MODEL),
    ]
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(), model=MODEL, tools=[get_weather, refund])
        async with served(ai_chat.path, VercelAIEndpoint(agent)) as url:
            out = await ai_chat(url, chatId="c1", prompt="Weather, and refund B2")

    assert out["error"] is None and out["status"] == "ready"
    assert out["headers"] == ["v1", "v1"]
    user, assistant = out["messages"]
    assert user["role"] == "user" and assistant["role"] == "assistant"
    parts = _tool_parts(assistant)
    assert [(p["type"], p["toolCallId"], p["state"]) for p in parts] == [
        ("tool-get_weather", paris["id"], "output-available"),
        ("tool-get_weather", rome["id"], "output-available"),
        ("tool-refund", back["id"], "output-available"),
    ]
    assert [p["input"] for p in parts] == [
        {"city": "Paris"},
        {"city": "Rome"},
        {"order": "B2", "amount": 500},
    ]
    assert [p["output"] for p in parts] == ["Sunny in Paris", "Sunny in Rome", "refunded 500 on B2"]
    assert parts[2]["approval"]["approved"] is True
    texts = [p["text"] for p in assistant["parts"] if p["type"] == "text"]
    assert texts == ["Checking.", "Sunny; B2 refunded."]
    paused, finished = out["finishes"]
    assert paused["finishReason"] == "tool-calls"
    assert finished["finishReason"] == "stop"
    metadata = finished["metadata"]
    assert metadata["usage"]["inputTokens"] == 20 and metadata["usage"]["outputTokens"] == 10
    assert metadata["costUsd"] > 0
    sent = server.requests[-1]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in sent] == [paris["id"], rome["id"], back["id"]]


async def test_a_denied_call_shows_as_denied_and_the_next_message_continues(
    ai_chat: NodeClient,
) -> None:
    @tool(requires_approval=True)
    def delete_user(name: str) -> str:
        """Delete a user."""
        raise AssertionError("a denied call never runs")

    call = tool_call("delete_user", {"name": "bob"})
    async with MessagesServer([reply(call), reply("Not deleted.")]) as server:
        agent = Agent(client=server.client(), tools=[delete_user])
        async with served(ai_chat.path, VercelAIEndpoint(agent)) as url:
            out = await ai_chat(
                url, chatId="c2", prompt="Delete bob", decide={"delete_user": "deny"}
            )
    [part] = _tool_parts(out["messages"][-1])
    assert part["state"] == "output-denied"
    assert server.requests[-1]["messages"][-1]["content"][0]["content"] == "Denied: not today"
    assert out["messages"][-1]["parts"][-1]["text"] == "Not deleted."


async def test_a_failed_run_is_an_error_chunk_the_chat_reports(ai_chat: NodeClient) -> None:
    async with MessagesServer([Fault.http_error(400, "bad things")]) as server:
        agent = Agent(client=server.client())
        async with served(ai_chat.path, VercelAIEndpoint(agent)) as url:
            out = await ai_chat(url, chatId="c3", prompt="hi")
    assert out["status"] == "error"
    assert "bad things" in out["error"]


async def test_the_chats_messages_are_the_next_runs_history(ai_chat: NodeClient) -> None:
    lookup = tool_call("get_weather", {"city": "Oslo"})

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"Snow in {city}"

    script = [reply("Looking.", lookup), reply("Snowing in Oslo."), reply("Wear boots.")]
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(), tools=[get_weather])
        async with served(ai_chat.path, VercelAIEndpoint(agent)) as url:
            out = await ai_chat(url, chatId="c4", prompt="Oslo?", followUp="What to wear?")
    assert out["messages"][-1]["parts"][-1]["text"] == "Wear boots."
    sent = server.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert [b["type"] for b in sent[1]["content"]] == ["text", "tool_use"]
    assert sent[1]["content"][1]["id"] == lookup["id"]
    assert sent[2]["content"][0]["content"] == "Snow in Oslo"
    assert sent[3]["content"][0]["text"] == "Snowing in Oslo."
    assert sent[4]["content"][0]["text"] == "What to wear?"
