"""External tools: announced to the model, their calls handed back to the caller."""

from __future__ import annotations

from typing import Any

import pytest

from agentloop import Agent, ConfigurationError, lint_history, tool
from agentloop.messages import parse_history
from agentloop.testing import ScriptedProvider, SteppedProvider, reply, tool_call

CLIENT_TOOL = {
    "name": "client_search",
    "description": "Search the client's files.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}
ran: list[str] = []


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value of {key}"


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_stream"])
async def test_a_mixed_turn_runs_its_own_calls_and_hands_the_others_back(streamed: bool) -> None:
    ran.clear()
    own, theirs = tool_call("lookup", {"key": "k"}), tool_call("client_search", {"q": "x"})
    script = [reply("Checking.", own, theirs), reply("All done.")]
    provider = SteppedProvider(script) if streamed else ScriptedProvider(script)
    agent = Agent(provider=provider, tools=[lookup])
    if streamed:
        async with agent.run_stream("go", external_tools=[CLIENT_TOOL]) as stream:
            async for _ in stream:
                pass
        result = stream.result
        assert result is not None
    else:
        result = await agent.run("go", external_tools=[CLIENT_TOOL])

    assert result.stop_reason == "tool_use" and ran == ["k"]
    assert result.pending == [theirs]
    assert result.held == [
        {"type": "tool_result", "tool_use_id": own["id"], "content": "value of k"}
    ]
    assert result.messages[-1]["role"] == "assistant"
    sent_tools = provider.model.requests[0]["tools"]
    assert [t["name"] for t in sent_tools] == ["lookup", "client_search"]
    assert sent_tools[1] == CLIENT_TOOL

    # The caller answers every call of the turn, in the model's order, and continues.
    answer = {"type": "tool_result", "tool_use_id": theirs["id"], "content": "found it"}
    history = [*result.messages, {"role": "user", "content": [*result.held, answer]}]
    lint_history(parse_history(history))
    again = Agent(provider=ScriptedProvider(script[1:]), tools=[lookup])
    final = await again.run(history=history, external_tools=[CLIENT_TOOL])
    assert final.text == "All done." and final.stop_reason == "end_turn"


async def test_only_external_calls_are_handed_back_without_running_anything() -> None:
    ran.clear()
    call = tool_call("client_search", {"q": "x"})
    agent = Agent(provider=ScriptedProvider([reply(call)]), tools=[lookup])
    result = await agent.run("go", external_tools=[CLIENT_TOOL])
    assert (result.stop_reason, result.pending, result.held, ran) == ("tool_use", [call], [], [])


async def test_an_external_name_that_is_also_an_own_tool_is_refused() -> None:
    agent = Agent(provider=ScriptedProvider([]), tools=[lookup])
    with pytest.raises(ConfigurationError, match="lookup"):
        await agent.run("go", external_tools=[{**CLIENT_TOOL, "name": "lookup"}])


async def test_a_tool_kind_without_a_name_is_announced_as_it_is(http_agent: Any) -> None:
    toolset = {"type": "mcp_toolset", "mcp_server_name": "docs"}
    agent, server = http_agent([reply("From the docs.")], tools=[lookup], cache="off")
    result = await agent.run("go", external_tools=[toolset, CLIENT_TOOL])
    assert result.text == "From the docs."
    assert server.requests[0]["tools"][1:] == [toolset, CLIENT_TOOL]


@pytest.mark.parametrize(
    "definition",
    [
        pytest.param({"description": "neither a name nor a type"}, id="untyped"),
        pytest.param({**CLIENT_TOOL, "name": ""}, id="empty-name"),
        pytest.param({"type": "custom", "name": 7}, id="not-a-string"),
    ],
)
async def test_an_external_tool_without_a_name_or_a_type_is_refused(
    definition: dict[str, Any],
) -> None:
    provider = ScriptedProvider([reply("never")])
    with pytest.raises(ConfigurationError, match="external tool: a tool needs a name"):
        await Agent(provider=provider).run("go", external_tools=[definition])
    assert provider.requests == []


async def test_a_turn_that_ended_otherwise_answers_external_calls_too() -> None:
    call: dict[str, Any] = tool_call("client_search", {"q": "x"})
    agent = Agent(provider=ScriptedProvider([reply(call, stop_reason="refusal")]))
    result = await agent.run("go", external_tools=[CLIENT_TOOL])
    assert result.stop_reason == "refusal" and result.pending == []
    lint_history(parse_history(result.messages))
