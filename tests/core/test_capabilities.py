"""Capabilities: each hook point, their order, and what they may do to a run.

Every run talks to `MessagesServer` through the SDK, JSON and streamed (`http_agent`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentloop import (
    Agent,
    AgentloopError,
    Capability,
    ConfigurationError,
    RunContext,
    ToolError,
    lint_history,
    tool,
)
from agentloop.calls import AnnouncedTool, ToolCall, ToolDefinition, ToolResult
from agentloop.capabilities import NextCall, NextRequest
from agentloop.messages import parse_history
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.result import RunResult, Usage
from agentloop.testing import ScriptedProvider, reply, text, tool_call

ran: list[str] = []


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value of {key}"


@tool
def secret(key: str) -> str:
    """Read a secret."""
    ran.append(f"secret:{key}")
    return f"the secret {key} is 1234-5678"


def valid(result: Any) -> None:
    lint_history(parse_history(result.messages))


class Recorder(Capability):
    """Records each hook it sees, under its label."""

    def __init__(self, label: str, seen: list[str]) -> None:
        self.label = label
        self.seen = seen

    async def before_run(self, ctx: RunContext[Any]) -> None:
        self.seen.append(f"{self.label}:before_run:{ctx.prompt}")

    async def prepare_tools(
        self, ctx: RunContext[Any], tools: list[AnnouncedTool]
    ) -> list[AnnouncedTool]:
        self.seen.append(f"{self.label}:prepare_tools:{ctx.round}")
        return tools

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        self.seen.append(f"{self.label}:request:{ctx.round}")
        response = await call_next(request)
        self.seen.append(f"{self.label}:response:{ctx.round}")
        return response

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        self.seen.append(f"{self.label}:call:{ctx.tool_name}")
        result = await call_next(call)
        self.seen.append(f"{self.label}:result:{ctx.tool_name}")
        return result

    async def after_run(self, ctx: RunContext[Any], result: RunResult[Any]) -> None:
        self.seen.append(f"{self.label}:after_run:{result.stop_reason}")


async def test_every_hook_is_called_in_order_the_first_capability_outermost(
    http_agent: Any,
) -> None:
    ran.clear()
    seen: list[str] = []
    outer, inner, own = (Recorder(n, seen) for n in ("outer", "inner", "own"))
    agent, _ = http_agent(
        [reply(tool_call("lookup", {"key": "a"})), reply("done")],
        tools=[lookup],
        capabilities=[outer, inner],
    )
    result = await agent.run("go", capabilities=[own])
    assert result.text == "done" and ran == ["a"]
    assert seen == [
        "outer:before_run:go",
        "inner:before_run:go",
        "own:before_run:go",
        "outer:prepare_tools:1",
        "inner:prepare_tools:1",
        "own:prepare_tools:1",
        "outer:request:1",
        "inner:request:1",
        "own:request:1",
        "own:response:1",
        "inner:response:1",
        "outer:response:1",
        "outer:call:lookup",
        "inner:call:lookup",
        "own:call:lookup",
        "own:result:lookup",
        "inner:result:lookup",
        "outer:result:lookup",
        "outer:prepare_tools:2",
        "inner:prepare_tools:2",
        "own:prepare_tools:2",
        "outer:request:2",
        "inner:request:2",
        "own:request:2",
        "own:response:2",
        "inner:response:2",
        "outer:response:2",
        "own:after_run:end_turn",
        "inner:after_run:end_turn",
        "outer:after_run:end_turn",
    ]


class Suffix(Capability):
    """Changes each request's system prompt, and the model's answer."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        response = await call_next(replace(request, system="Be brief."))
        return response


async def test_wrap_request_changes_what_is_sent(http_agent: Any) -> None:
    agent, server = http_agent([reply("ok")], capabilities=[Suffix()])
    await agent.run("hi")
    assert server.requests[0]["system"][0]["text"] == "Be brief."


class Canned(Capability):
    """Answers every request itself: nothing is sent."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        answer = ModelResponse.from_wire(reply("from the cache", usage={"input_tokens": 0}))
        return answer


async def test_wrap_request_may_answer_without_sending(http_agent: Any) -> None:
    agent, server = http_agent([], capabilities=[Canned()])
    result = await agent.run("hi")
    assert result.text == "from the cache" and server.requests == []
    valid(result)


class Hide(Capability):
    """Announces only the tools it is told to."""

    def __init__(self, *names: str) -> None:
        self.names = names

    async def prepare_tools(
        self, ctx: RunContext[Any], tools: list[AnnouncedTool]
    ) -> list[AnnouncedTool]:
        kept = [t for t in tools if isinstance(t, ToolDefinition) and t.name in self.names]
        return [replace(t, description=t.description + " (checked)") for t in kept]


async def test_prepare_tools_hides_and_changes_tools_and_a_hidden_call_is_not_run(
    http_agent: Any,
) -> None:
    ran.clear()
    script = [reply(tool_call("secret", {"key": "k"}), tool_call("lookup", {"key": "a"}))]
    script.append(reply("done"))
    agent, server = http_agent(script, tools=[lookup, secret], capabilities=[Hide("lookup")])
    result = await agent.run("go")
    sent = server.requests[0]["tools"]
    assert [t["name"] for t in sent] == ["lookup"]
    assert sent[0]["description"].endswith("(checked)")
    assert ran == ["a"]
    hidden, shown = result.tool_calls
    assert hidden.is_error and "not available" in hidden.output
    assert shown.output == "value of a"
    valid(result)


class Guard(Capability):
    """Denies `secret`, changes `lookup`'s input, redacts what comes back."""

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        if call.name == "secret":
            raise ToolError("Secrets are not for you.")
        result = await call_next(replace(call, input={"key": call.input["key"].upper()}))
        return replace(result, content=result.text.replace("value", "[redacted]"))


async def test_wrap_tool_call_denies_changes_the_input_and_redacts(http_agent: Any) -> None:
    ran.clear()
    script = [reply(tool_call("secret", {"key": "k"}), tool_call("lookup", {"key": "a"}))]
    script.append(reply("done"))
    agent, _ = http_agent(script, tools=[lookup, secret], capabilities=[Guard()])
    result = await agent.run("go")
    assert ran == ["A"]
    denied, changed = result.tool_calls
    assert denied.is_error and denied.output == "Secrets are not for you."
    assert changed.output == "[redacted] of A"
    valid(result)


class Stop(AgentloopError):
    pass


class Stopper(Capability):
    """Ends the run at the first call of `secret`, which never runs."""

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        if call.name == "secret":
            raise Stop("no secrets in this run")
        return await call_next(call)


async def test_wrap_tool_call_may_end_the_run_and_no_tool_runs_after(http_agent: Any) -> None:
    ran.clear()
    script = [reply(tool_call("secret", {"key": "k"})), reply(tool_call("lookup", {"key": "a"}))]
    agent, server = http_agent(script, tools=[lookup, secret], capabilities=[Stopper()])
    with pytest.raises(Stop) as caught:
        await agent.run("go")
    assert ran == [] and len(server.requests) == 1
    result = caught.value.result
    assert result is not None and result.stop_reason == "error"
    assert result.tool_calls[0].is_error
    valid(result)


class Veto(Capability):
    async def after_run(self, ctx: RunContext[Any], result: RunResult[Any]) -> None:
        if "forbidden" in result.text:
            raise Stop("the answer says what it must not")


async def test_after_run_may_refuse_the_result(http_agent: Any) -> None:
    agent, _ = http_agent([reply("the forbidden word")], capabilities=[Veto()])
    with pytest.raises(Stop) as caught:
        await agent.run("go")
    assert caught.value.result is not None and caught.value.result.text == "the forbidden word"


class Counting(Capability):
    """Keeps a count per run: a fresh copy for each one."""

    def __init__(self) -> None:
        self.requests = 0
        self.copies: list[Counting] = []

    def for_run(self, ctx: RunContext[Any]) -> Capability:
        copy = Counting()
        self.copies.append(copy)
        return copy

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        self.requests += 1
        await anyio.lowlevel.checkpoint()
        return await call_next(request)


async def test_a_stateful_capability_has_a_copy_per_run() -> None:
    counting = Counting()

    def answer(body: dict[str, Any]) -> dict[str, Any]:  # a call first, then text
        called = len(body["messages"]) > 1
        return reply("ok") if called else reply(tool_call("lookup", {"key": "a"}))

    agent = Agent(provider=ScriptedProvider(answer), tools=[lookup], capabilities=[counting])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run, "one")
        group.start_soon(agent.run, "two")
    assert [c.requests for c in counting.copies] == [2, 2] and counting.requests == 0


class Summarise(Capability):
    """Makes an extra request of its own before each, and counts it in the run."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        ctx.add_usage(Usage(input_tokens=100, output_tokens=10, requests=1), 0.001)
        return await call_next(request)


async def test_an_extra_request_a_capability_makes_counts_in_the_run(http_agent: Any) -> None:
    agent, _ = http_agent([reply("ok", usage={"input_tokens": 5, "output_tokens": 1})])
    result = await agent.run("hi", capabilities=[Summarise()])
    assert result.usage.requests == 2 and result.usage.input_tokens == 105


async def test_capabilities_apply_inside_a_sub_agent() -> None:
    ran.clear()
    seen: list[str] = []
    worker = Agent(
        provider=ScriptedProvider([reply(tool_call("lookup", {"key": "w"})), reply("found")]),
        tools=[lookup],
        name="worker",
        capabilities=[Recorder("worker", seen)],
    )
    boss = Agent(
        provider=ScriptedProvider(
            [reply(tool_call("worker", {"prompt": "find w"})), reply("the worker found it")]
        ),
        tools=[worker.as_tool()],
    )
    result = await boss.run("go")
    assert result.text == "the worker found it" and ran == ["w"]
    assert "worker:call:lookup" in seen and "worker:before_run:find w" in seen


async def test_a_streamed_run_goes_through_the_same_hooks() -> None:
    from agentloop.testing import SteppedProvider

    ran.clear()
    seen: list[str] = []
    script = [reply(text("looking"), tool_call("lookup", {"key": "s"})), reply("done")]
    agent = Agent(
        provider=SteppedProvider(script), tools=[lookup], capabilities=[Recorder("r", seen)]
    )
    async with agent.run_stream("go") as run:
        async for _ in run:
            pass
    assert run.result.text == "done" and ran == ["s"]
    assert seen.count("r:request:1") == 1 and "r:call:lookup" in seen


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Capability, id="a-class"),
        pytest.param("guard", id="a-name"),
        pytest.param(Capability(), id="not-a-list"),
        pytest.param([object()], id="not-a-capability"),
    ],
)
def test_capabilities_must_be_a_list_of_capabilities(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="capabilit"):
        Agent(provider=ScriptedProvider([]), capabilities=value)
