"""Sub-agents: an agent as a tool of another, its usage and limits those of the parent run."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from agentloop import (
    Agent,
    ConfigurationError,
    RunContext,
    UsageLimitExceeded,
    UsageLimits,
    lint_history,
    tool,
)
from agentloop.messages import parse_history
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SUB_USAGE = {"input_tokens": 1000, "output_tokens": 40}
PARENT_USAGE = {"input_tokens": 200, "output_tokens": 10}


@tool
def lookup(ctx: RunContext[str], term: str) -> str:
    """Look a term up."""
    return f"{term} for {ctx.deps}"


def ask_researcher(prompt: str = "find the capital of France") -> dict[str, Any]:
    return reply(tool_call("researcher", {"prompt": prompt}), usage=PARENT_USAGE)


async def test_a_sub_agents_usage_is_added_to_the_parents(serve: Any) -> None:
    sub_server = serve(
        [
            reply(tool_call("lookup", {"term": "capital"}), usage=SUB_USAGE),
            reply("Paris", usage=SUB_USAGE),
        ]
    )
    researcher = Agent(client=sub_server.client(), tools=[lookup], name="researcher", cache="off")
    parent_server = serve([ask_researcher(), reply("It is Paris.", usage=PARENT_USAGE)])
    parent = Agent(client=parent_server.client(), tools=[researcher.as_tool()])
    result = await parent.run("Capital of France?", deps="the user")
    assert result.text == "It is Paris."
    assert result.usage.requests == 4 and result.rounds == 2
    assert result.usage.input_tokens == 2 * 1000 + 2 * 200
    assert result.usage.output_tokens == 2 * 40 + 2 * 10
    (call,) = result.tool_calls
    assert call.name == "researcher" and call.output == "Paris" and not call.is_error
    # The sub-run got the prompt the model wrote, and the parent's deps.
    assert sub_server.requests[0]["messages"][0]["content"] == "find the capital of France"
    assert sub_server.requests[1]["messages"][-1]["content"][0]["content"] == "capital for the user"
    tools = parent_server.requests[0]["tools"]
    assert tools[0]["name"] == "researcher"
    assert tools[0]["input_schema"]["required"] == ["prompt"]


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
async def test_a_parent_limit_stops_the_sub_run_and_then_the_parent(serve: Any) -> None:
    sub_server = serve(lambda body: reply(tool_call("lookup", {"term": "more"}), usage=SUB_USAGE))
    researcher = Agent(client=sub_server.client(), tools=[lookup])
    parent_server = serve([ask_researcher(), reply("never sent")])
    parent = Agent(
        client=parent_server.client(),
        tools=[researcher.as_tool("researcher")],
        usage_limits=UsageLimits(requests=3),
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await parent.run("dig", deps="d")
    # One parent request; the sub-run had the two requests left of the parent's three.
    assert len(parent_server.requests) == 1 and len(sub_server.requests) == 2
    exc = caught.value
    assert exc.limit == "requests" and not exc.sent
    result = exc.result
    assert result is not None and result.usage.requests == 3
    (call,) = result.tool_calls
    assert call.is_error and "usage limit requests=2" in call.output
    lint_history(parse_history(result.messages))


async def test_a_parent_token_limit_bounds_the_sub_run(serve: Any) -> None:
    sub_server = serve(lambda body: reply(tool_call("lookup", {"term": "x"}), usage=SUB_USAGE))
    researcher = Agent(client=sub_server.client(), tools=[lookup])
    parent_server = serve([ask_researcher()])
    parent = Agent(
        client=parent_server.client(),
        tools=[researcher.as_tool("researcher")],
        usage_limits=UsageLimits(input_tokens=2_500),
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await parent.run("dig", deps="d")
    # 200 (parent) + 1000 + 1000 (sub) = 2200; the sub's third request crosses 2300 left.
    assert len(sub_server.requests) == 3
    result = caught.value.result
    assert result is not None and result.usage.input_tokens == 200 + 3 * 1000
    assert caught.value.limit == "input_tokens"


async def test_a_sub_agent_is_not_started_when_the_budget_is_spent() -> None:
    sub = ScriptedProvider([reply("never")])
    researcher = Agent(provider=sub)
    parent = Agent(
        provider=ScriptedProvider(
            [
                reply(
                    tool_call("researcher", {"prompt": "a"}),
                    usage={"input_tokens": 50, "output_tokens": 5},
                )
            ]
        ),
        tools=[researcher.as_tool("researcher")],
        usage_limits=UsageLimits(input_tokens=50),
    )
    with pytest.raises(UsageLimitExceeded):
        await parent.run("go")
    assert sub.requests == []


def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    pytest.importorskip(
        "opentelemetry.sdk", reason="opentelemetry-sdk is not installed (the dev extra)"
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_the_sub_runs_spans_nest_under_the_tool_calls_span() -> None:
    provider, exporter = spans()
    researcher = Agent(
        provider=ScriptedProvider([reply("Paris")]), name="researcher", tracer_provider=provider
    )
    parent = Agent(
        provider=ScriptedProvider([ask_researcher(), reply("done")]),
        tools=[researcher.as_tool()],
        name="boss",
        tracer_provider=provider,
    )
    await parent.run("go")
    finished = {s.name: s for s in exporter.get_finished_spans()}
    tool_span = finished["execute_tool researcher"]
    sub_run = finished["invoke_agent researcher"]
    assert sub_run.parent is not None and sub_run.parent.span_id == tool_span.context.span_id
    assert tool_span.context.trace_id == finished["invoke_agent boss"].context.trace_id
    provider.shutdown()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cancelling_the_parent_cancels_the_sub_run(backend: str) -> None:
    seen: list[str] = []

    async def main() -> None:
        waiting = anyio.Event()

        @tool
        async def wait_forever() -> str:
            """Wait."""
            waiting.set()
            try:
                await anyio.sleep_forever()
            finally:
                seen.append("the sub-agent's tool was cancelled")
            return "never"

        async with MessagesServer([reply(tool_call("wait_forever"))]) as sub_server:
            researcher = Agent(
                client=sub_server.client(), tools=[wait_forever], tool_timeout=math.inf
            )
            parent = Agent(
                provider=ScriptedProvider([ask_researcher()]),
                tools=[researcher.as_tool("researcher", timeout=math.inf)],
            )
            async with anyio.create_task_group() as group:
                group.start_soon(parent.run, "go")
                await waiting.wait()
                group.cancel_scope.cancel()

    anyio.run(main, backend=backend)
    assert seen == ["the sub-agent's tool was cancelled"]


def test_as_tool_needs_a_name() -> None:
    with pytest.raises(ConfigurationError, match="needs a name"):
        Agent(provider=ScriptedProvider([]), name="").as_tool()


async def test_a_sub_agent_without_a_price_under_a_cost_limit_answers_with_an_error() -> None:
    sub = ScriptedProvider([reply("never")])
    researcher = Agent("claude-scripted", provider=sub)
    parent = Agent(
        "claude-sonnet-4-5",
        provider=ScriptedProvider([ask_researcher(), reply("done")]),
        tools=[researcher.as_tool("researcher")],
        usage_limits=UsageLimits(cost_usd=1.0),
    )
    result = await parent.run("go")
    (call,) = result.tool_calls
    assert call.is_error and "could not start" in call.output and "claude-scripted" in call.output
    assert sub.requests == [] and result.text == "done"


async def test_a_sub_agents_cost_is_added_to_the_parents(serve: Any) -> None:
    from agentloop.pricing import cost_of
    from agentloop.result import Usage

    model = "claude-sonnet-4-5"
    sub_server = serve([reply("Paris", usage=SUB_USAGE)])
    researcher = Agent(model, client=sub_server.client(), name="researcher")
    parent_server = serve([ask_researcher(), reply("It is Paris.", usage=PARENT_USAGE)])
    parent = Agent(model, client=parent_server.client(), tools=[researcher.as_tool()])
    result = await parent.run("Capital of France?")
    sub, top = cost_of(model, Usage(**SUB_USAGE)), cost_of(model, Usage(**PARENT_USAGE))
    assert sub is not None and top is not None
    assert result.cost == pytest.approx(sub + 2 * top)
