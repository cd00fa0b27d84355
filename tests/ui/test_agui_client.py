"""The AG-UI endpoint against the protocol's own client, `@ag-ui/client`'s `HttpAgent`.

Node runs the client (tests/ui/agui_client.mjs): it posts its `RunAgentInput`, verifies
the event stream as the protocol requires (a run opened and closed once, every message
and tool call started before its content and ended before the run's end) and applies it
to its messages and state; the test reads what it parsed. The model is a scripted
Messages API on 127.0.0.1.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from _ui import NodeClient, served

from agentloop import Agent, tool
from agentloop.testing import MessagesServer, reply, tool_call
from agentloop.ui import AGUIEndpoint

MODEL = "claude-sonnet-4-5"  # a model the price table knows: the run has a cost


def _types(run: dict[str, Any]) -> list[str]:
    return [e["type"] for e in run["events"]]


async def test_parallel_calls_then_an_approval_then_the_answer(agui_client: NodeClient) -> None:
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

    @tool(requires_approval=lambda ctx, input: f"refund of {input['amount']}")
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return f"refunded {amount} on {order}"

    paris = tool_call("get_weather", {"city": "Paris"})
    rome = tool_call("get_weather", {"city": "Rome"})
    back = tool_call("refund", {"order": "B2", "amount": 500})
    script = [reply(paris, rome, back, model=MODEL), reply("Sunny; B2 refunded.", model=MODEL)]
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(), model=MODEL, tools=[get_weather, refund])
        async with served(agui_client.path, AGUIEndpoint(agent)) as url:
            out = await agui_client(url, threadId="t1", prompt="Weather, and refund B2")

    first, second = out["runs"]
    assert first["failed"] is None and second["failed"] is None
    types = _types(first)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    starts = [e["toolCallId"] for e in first["events"] if e["type"] == "TOOL_CALL_START"]
    assert starts == [paris["id"], rome["id"], back["id"]]
    results = {e["toolCallId"]: e for e in first["events"] if e["type"] == "TOOL_CALL_RESULT"}
    assert {k: v["content"] for k, v in results.items()} == {
        paris["id"]: "Sunny in Paris",
        rome["id"]: "Sunny in Rome",
    }
    assert all(not r["metadata"]["isError"] for r in results.values())
    outcome = first["events"][-1]["outcome"]
    assert outcome["type"] == "interrupt"
    [interrupt] = outcome["interrupts"]
    assert interrupt["toolCallId"] == back["id"]
    assert interrupt["message"].endswith("refund of 500")

    # the client answered the interrupt: the paused run resumed with the approval
    finished = second["events"][-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "success"
    assert finished["result"] == "Sunny; B2 refunded."
    [refunded] = [e for e in second["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert refunded["content"] == "refunded 500 on B2"
    assert refunded["metadata"]["approved"] is True
    assert "TOOL_CALL_START" not in _types(second)  # the call was shown already
    [usage] = finished["usage"]
    assert usage["inputTokens"] == 20 and usage["outputTokens"] == 10
    assert finished["metadata"]["costUsd"] > 0
    assert out["state"]["costUsd"] == finished["metadata"]["costUsd"]

    # what the client holds is the conversation: one assistant message with the three
    # calls, their results, and the answer
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    calls = out["messages"][1]["toolCalls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Rome"},
        {"order": "B2", "amount": 500},
    ]
    assert out["messages"][-1]["content"] == "Sunny; B2 refunded."
    sent = server.requests[-1]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in sent] == [paris["id"], rome["id"], back["id"]]


async def test_a_denied_call_is_answered_as_denied(agui_client: NodeClient) -> None:
    @tool(requires_approval=True)
    def delete_user(name: str) -> str:
        """Delete a user."""
        raise AssertionError("a denied call never runs")

    call = tool_call("delete_user", {"name": "bob"})
    async with MessagesServer([reply(call), reply("Not deleted.")]) as server:
        agent = Agent(client=server.client(), tools=[delete_user])
        async with served(agui_client.path, AGUIEndpoint(agent)) as url:
            out = await agui_client(
                url, threadId="t2", prompt="Delete bob", decide={"delete_user": "deny"}
            )
    [result] = [e for e in out["runs"][1]["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert result["metadata"] == {**result["metadata"], "isError": True, "approved": False}
    assert result["content"].startswith("Denied")
    assert out["runs"][1]["events"][-1]["result"] == "Not deleted."


async def test_the_pages_tools_go_back_to_the_page(agui_client: NodeClient) -> None:
    ask = tool_call("confirm_address", {"address": "1 Main St"})
    script = [reply("Let me check that address for you.", ask), reply("Shipping to 1 Main St.")]
    page_tool = {
        "name": "confirm_address",
        "description": "Ask the user to confirm an address.",
        "parameters": {"type": "object", "properties": {"address": {"type": "string"}}},
    }
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client())
        async with served(agui_client.path, AGUIEndpoint(agent)) as url:
            out = await agui_client(
                url,
                threadId="t3",
                prompt="Ship it",
                tools=[page_tool],
                results={"confirm_address": "confirmed"},
            )
    first, second = out["runs"]
    outcome = first["events"][-1]["outcome"]
    assert outcome == {"type": "success", "pendingToolCallIds": [ask["id"]]}
    assert server.requests[0]["tools"][0]["name"] == "confirm_address"
    assert second["events"][-1]["result"] == "Shipping to 1 Main St."
    answered = server.requests[1]["messages"][-1]["content"]
    assert [(b["tool_use_id"], b["content"]) for b in answered] == [(ask["id"], "confirmed")]
    texts = [e["delta"] for e in first["events"] if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(texts) == "Let me check that address for you."
    assert _types(first).count("TEXT_MESSAGE_START") == 1  # one block, one message


async def test_a_failed_run_ends_in_run_error(agui_client: NodeClient) -> None:
    from agentloop.testing import Fault

    async with MessagesServer([Fault.http_error(400, "bad things")]) as server:
        agent = Agent(client=server.client())
        async with served(agui_client.path, AGUIEndpoint(agent)) as url:
            out = await agui_client(url, threadId="t4", prompt="hi", maxRuns=1)
    [run] = out["runs"]
    assert _types(run) == ["RUN_STARTED", "RUN_ERROR"]
    assert "bad things" in run["events"][-1]["message"]
    assert run["events"][-1]["code"] == "BadRequestError"
