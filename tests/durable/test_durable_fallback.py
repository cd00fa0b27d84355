"""`Fallback` and `Retries` in a DBOS run: what they do is part of the model request's step.

The fallback's requests are made inside the step, so the step records the response that
was kept (with where it was sent), and a replay from the record asks no model again and
ends with the same models, usage and cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")

from dbos import DBOS

from agentloop import Agent, AnthropicProvider, Fallback, Retries
from agentloop.durable.dbos import DurableAgent
from agentloop.events import ResponseReplaced, TextDelta
from agentloop.testing import Fault, MessagesServer, reply, text

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
