"""`Fallback`, `Retries` and a capability's own requests in a DBOS run: part of the step.

The fallback's requests are made inside the step, so the step records the response that
was kept (with where it was sent), and a replay from the record asks no model again and
ends with the same models, usage and cost. What any capability spends of its own inside a
request or a call rides on the step's outcome, so a replay counts it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")

from dbos import DBOS

from agentloop import Agent, AnthropicProvider, Capability, Fallback, Retries, RunContext, tool
from agentloop.calls import ToolCall, ToolResult
from agentloop.capabilities import NextCall, NextRequest
from agentloop.durable.dbos import DurableAgent
from agentloop.events import ResponseReplaced, TextDelta
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.result import Usage
from agentloop.testing import Fault, MessagesServer, reply, text, tool_call

pytestmark = pytest.mark.durable

SONNET = "claude-sonnet-4-5"
HAIKU = "claude-haiku-4-5"


def by_model(body: dict[str, Any]) -> Any:
    if body["model"] == SONNET:
        return Fault.overloaded()
    return reply("from haiku", model=HAIKU, usage={"input_tokens": 100, "output_tokens": 10})


async def test_a_fallback_is_inside_the_step_and_a_replay_asks_no_model_again(
    serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    server = serve(by_model)
    agent = Agent(
        provider=AnthropicProvider(server.client()),
        model=SONNET,
        name="fallback",
        capabilities=[Fallback([HAIKU]), Retries(2, backoff=0.0)],  # each model retried
    )
    durable = DurableAgent(agent)
    launch()
    result = await durable.run("hi", run_id="fallback-1")
    assert result.text == "from haiku" and result.models == [HAIKU]
    assert [r["model"] for r in server.model.requests] == [SONNET, SONNET, HAIKU]
    steps = await DBOS.list_workflow_steps_async("fallback-1")
    assert [s["function_name"] for s in steps] == ["agentloop.fallback.model"]
    assert steps[0]["output"]["sent_to"] == [HAIKU, "anthropic"]
    replayed = await durable.cancelled_result("fallback-1")
    assert replayed.models == [HAIKU] and replayed.messages == result.messages
    assert replayed.usage == result.usage and replayed.cost == result.cost
    assert len(server.model.requests) == 3


async def test_a_refused_response_s_usage_is_counted_on_a_replay_too(
    serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    def refusing(body: dict[str, Any]) -> Any:
        if body["model"] == SONNET:
            return reply("no", stop_reason="refusal", usage={"input_tokens": 50})
        return reply("from haiku", model=HAIKU, usage={"input_tokens": 100})

    server = serve(refusing)
    agent = Agent(
        provider=AnthropicProvider(server.client()),
        model=SONNET,
        name="refusal",
        capabilities=[Fallback([HAIKU], on=("refusal",))],
    )
    durable = DurableAgent(agent)
    launch()
    result = await durable.run("hi", run_id="refusal-1")
    assert result.usage.input_tokens == 150 and result.usage.requests == 2
    replayed = await durable.cancelled_result("refusal-1")
    assert replayed.usage == result.usage and replayed.cost == result.cost


async def test_a_streamed_durable_run_says_which_response_was_replaced(
    serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    server = serve([Fault.stream_error(reply(text("first try"), text("lost"))), reply("second")])
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=True),
        name="replaced",
        capabilities=[Retries(2, backoff=0.0)],
    )
    durable = DurableAgent(agent)
    launch()
    async with durable.run_stream("hi", run_id="replaced-1") as stream:
        events = [event async for event in stream]
    at = events.index(ResponseReplaced(1, 2))
    assert "".join(e.text for e in events[:at] if isinstance(e, TextDelta)) == "first try"
    assert "".join(e.text for e in events[at:] if isinstance(e, TextDelta)) == "second"
    assert stream.result is not None and stream.result.text == "second"
    assert len(server.model.requests) == 2


# -- a capability's own requests


CHECK = Usage(input_tokens=100, output_tokens=10, requests=1)


class Moderating(Capability):
    """Checks each request and each result with a request of its own (counted, not sent)."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        ctx.add_usage(CHECK, 0.001)
        return await call_next(request)

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        result = await call_next(call)
        ctx.add_usage(CHECK, 0.002)
        return result


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def test_a_capability_s_own_requests_are_counted_once_live_and_on_a_replay(
    serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    script = [reply(tool_call("lookup", {"key": "a"}), tool_call("lookup", {"key": "b"}))]
    script.append(reply("Done."))
    bare = Agent(provider=AnthropicProvider(serve(list(script)).client()), tools=[lookup])
    unchecked = await bare.run("hi")
    plain = await Agent(
        provider=AnthropicProvider(serve(list(script)).client()),
        tools=[lookup],
        capabilities=[Moderating()],
    ).run("hi")
    # four checks: one per request, one per call
    assert plain.usage == unchecked.usage + CHECK + CHECK + CHECK + CHECK
    agent = Agent(
        provider=AnthropicProvider(serve(list(script)).client()),
        name="moderated",
        tools=[lookup],
        capabilities=[Moderating()],
    )
    durable = DurableAgent(agent)
    launch()
    result = await durable.run("hi", run_id="moderated-1")
    assert result.usage == plain.usage and result.cost == plain.cost
    replayed = await durable.cancelled_result("moderated-1")
    assert replayed.usage == plain.usage and replayed.cost == plain.cost
