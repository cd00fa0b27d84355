"""Tool approval: calls that wait for a person's decision end the run after the turn's others.

Every run talks to `MessagesServer` through the real SDK, answering in JSON and in SSE.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from unittest.mock import ANY

import pytest
from _approval import CLIENT_TOOL, lookup, make_agent, ran, refund

from agentloop import (
    Agent,
    AnthropicProvider,
    ApprovalRequest,
    ApprovalRequested,
    Approve,
    ConfigurationError,
    RunContext,
    ToolCallReady,
    ToolResultEvent,
    UsageLimitExceeded,
    UsageLimits,
    tool,
)
from agentloop.testing import MessagesServer, reply, tool_call

FORMATS = [pytest.param(False, id="json"), pytest.param(True, id="sse")]


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


@pytest.mark.parametrize("stream", FORMATS)
async def test_a_rule_decides_per_call_and_the_turns_other_calls_run(
    serve: Callable[..., MessagesServer], stream: bool
) -> None:
    small = tool_call("refund", {"order": "A1", "amount": 20})
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply("Refunding both.", small, big)])
    result = await make_agent(server.client(), stream=stream).run("Refund A1 and B2")

    assert result.stop_reason == "approval_required"
    assert ran == [("refund", {"order": "A1", "amount": 20})]
    assert result.approvals == [
        ApprovalRequest(
            big["id"],
            "refund",
            {"order": "B2", "amount": 500},
            "tool 'refund' requires approval: amount 500 is over the limit of 100",
        )
    ]
    assert result.held == [
        {"type": "tool_result", "tool_use_id": small["id"], "content": "refunded 20 on A1"}
    ]
    assert result.pending == []  # no external call: those are the caller's to run
    assert result.messages[-1]["content"][1:] == [small, big]
    assert len(server.requests) == 1
    assert json.loads(json.dumps(result.state)) == result.state
    assert [r.tool_use_id for r in result.tool_calls] == [small["id"]]


async def test_a_call_the_rule_lets_through_runs_and_the_run_goes_on(
    serve: Callable[..., MessagesServer],
) -> None:
    small = tool_call("refund", {"order": "A1", "amount": 20})
    server = serve([reply(small), reply("Done.")])
    result = await make_agent(server.client()).run("Refund A1")
    assert (result.stop_reason, result.text, result.approvals, result.state) == (
        "end_turn",
        "Done.",
        [],
        None,
    )
    assert ran == [("refund", {"order": "A1", "amount": 20})]


@pytest.mark.parametrize(
    "approval_required",
    [
        pytest.param({"delete_user"}, id="names"),
        pytest.param(
            lambda ctx, input: ctx.tool_name == "delete_user" and input["user"] == "root",
            id="rule",
        ),
    ],
)
async def test_the_service_sets_approval_for_plugin_tools(
    serve: Callable[..., MessagesServer], approval_required: Any
) -> None:
    root = tool_call("delete_user", {"user": "root"})
    server = serve([reply(root, tool_call("lookup", {"order": "C3"}))])
    agent = make_agent(server.client(), approval_required=approval_required)
    result = await agent.run("Clean up")
    assert result.stop_reason == "approval_required"
    assert [(a.tool_use_id, a.reason) for a in result.approvals] == [
        (root["id"], "the agent requires approval for 'delete_user'")
    ]
    assert ran == [("lookup", {"order": "C3"})]


async def test_the_agents_rule_is_asked_per_call(serve: Callable[..., MessagesServer]) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    def rule(ctx: RunContext, input: dict[str, Any]) -> bool:
        asked.append((ctx.tool_use_id, input))
        return ctx.tool_name == "delete_user" and input["user"] == "root"

    guest = tool_call("delete_user", {"user": "guest"})
    server = serve([reply(guest), reply("Deleted.")])
    result = await make_agent(server.client(), approval_required=rule).run("Delete guest")
    assert result.stop_reason == "end_turn" and ran == [("delete_user", {"user": "guest"})]
    assert asked == [(guest["id"], {"user": "guest"})]


async def test_a_rule_that_fails_makes_the_call_wait(
    serve: Callable[..., MessagesServer],
) -> None:
    def broken(ctx: RunContext, input: dict[str, Any]) -> bool:
        raise KeyError("limit")

    @tool(requires_approval=broken)
    def wire_money(to: str) -> str:
        """Send money."""
        ran.append(("wire_money", {"to": to}))
        return "sent"

    call = tool_call("wire_money", {"to": "X"})
    server = serve([reply(call)])
    agent = Agent(provider=AnthropicProvider(server.client()), tools=[wire_money])
    result = await agent.run("Pay X")
    assert result.stop_reason == "approval_required" and ran == []
    assert "its approval rule failed (KeyError: 'limit')" in result.approvals[0].reason


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: make_agent(None, approval_required={"nope"}), id="unknown-name"),
        pytest.param(lambda: make_agent(None, approval_required="delete_user"), id="a-string"),
        pytest.param(lambda: make_agent(None, approval_required=[1]), id="not-names"),
        pytest.param(lambda: tool(requires_approval="yes")(len), id="tool-not-a-rule"),
        pytest.param(lambda: refund.replace(requires_approval=3), id="replace-not-a-rule"),
    ],
)
def test_approval_settings_that_cannot_work_are_refused(make: Callable[[], Any]) -> None:
    with pytest.raises(ConfigurationError, match="approval"):
        make()


async def test_replace_changes_a_tools_approval(serve: Callable[..., MessagesServer]) -> None:
    strict = lookup.replace(requires_approval=True)
    call = tool_call("lookup", {"order": "A1"})
    server = serve([reply(call)])
    result = await Agent(provider=AnthropicProvider(server.client()), tools=[strict]).run("?")
    assert result.approvals[0].reason == "tool 'lookup' requires approval" and ran == []
    assert lookup.requires_approval is False


@pytest.mark.parametrize("stream", FORMATS)
async def test_run_stream_reports_the_call_that_waits(
    serve: Callable[..., MessagesServer], stream: bool
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    other = tool_call("lookup", {"order": "B2"})
    server = serve([reply(big, other)])
    async with make_agent(server.client(), stream=stream).run_stream("Refund B2") as events:
        seen = [e async for e in events if isinstance(e, (ApprovalRequested, ToolCallReady))]
    asked = ApprovalRequested(
        1,
        big["id"],
        "refund",
        {"order": "B2", "amount": 500},
        "tool 'refund' requires approval: amount 500 is over the limit of 100",
    )
    ready = ToolCallReady(1, other["id"], "lookup", {"order": "B2"}, True)
    # `lookup` is ready (and starts) as its block closes; the approval is asked once
    # the whole response is in, when nothing can refuse the call any more.
    assert seen == [ready, asked]
    assert events.result is not None and events.result.stop_reason == "approval_required"


@pytest.mark.parametrize("stream", FORMATS)
async def test_a_call_refused_for_a_limit_is_never_announced_as_waiting(
    serve: Callable[..., MessagesServer], stream: bool
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big, usage={"input_tokens": 5, "output_tokens": 50})])
    agent = make_agent(server.client(), stream=stream, usage_limits=UsageLimits(output_tokens=10))
    seen: list[Any] = []
    with pytest.raises(UsageLimitExceeded):
        async with agent.run_stream("Refund B2") as events:
            async for event in events:
                if isinstance(event, (ApprovalRequested, ToolResultEvent)):
                    seen.append(event)
    assert seen == [ToolResultEvent(1, big["id"], "refund", True, ANY, 0.0)]
    assert "output_tokens" in seen[0].output and ran == []


async def test_external_and_approval_calls_wait_together(
    serve: Callable[..., MessagesServer],
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    theirs = tool_call("client_search", {"q": "B2"})
    mine = tool_call("lookup", {"order": "B2"})
    server = serve([reply(big, theirs, mine)])
    result = await make_agent(server.client()).run("B2?", external_tools=[CLIENT_TOOL])
    assert result.stop_reason == "approval_required"
    assert [a.tool_use_id for a in result.approvals] == [big["id"]]
    assert result.pending == [theirs]
    assert [b["tool_use_id"] for b in result.held] == [mine["id"]]
    assert ran == [("lookup", {"order": "B2"})]


@pytest.mark.both_formats
async def test_approval_works_on_every_provider_format(http_agent: Any) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    agent, server = http_agent([reply(big), reply("Refunded.")], tools=[refund], cache="off")
    paused = await agent.run("Refund B2")
    assert paused.stop_reason == "approval_required" and ran == []
    final = await agent.resume(
        json.loads(json.dumps(paused.state)), decisions={big["id"]: Approve()}
    )
    assert final.text == "Refunded." and ran == [("refund", {"order": "B2", "amount": 500})]
    assert server.model.requests[-1]["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": big["id"], "content": "refunded 500 on B2"}
    ]


async def test_a_call_with_input_the_tool_refuses_never_waits(
    serve: Callable[..., MessagesServer],
) -> None:
    bad = tool_call("refund", {"order": "B2", "amount": "lots"})
    server = serve([reply(bad), reply("Let me fix that.")])
    result = await make_agent(server.client()).run("Refund B2")
    assert result.stop_reason == "end_turn" and result.approvals == [] and ran == []
    [answer] = server.requests[1]["messages"][-1]["content"]
    assert answer["is_error"] is True and "amount" in answer["content"]
