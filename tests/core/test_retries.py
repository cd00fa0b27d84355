"""`Retries`: one retry policy for a run's model requests, in place of the client's own.

Every run talks to `MessagesServer` through the SDK, JSON and streamed (`http_agent`),
its faults acted out on the wire.
"""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from agentloop import (
    Agent,
    AnthropicProvider,
    Capability,
    ConfigurationError,
    Fallback,
    Retries,
    RunContext,
    lint_history,
    tool,
)
from agentloop.capabilities import NextRequest
from agentloop.errors import BadRequestError, OverloadedError, RateLimitError, ServerError
from agentloop.events import ResponseReplaced, TextDelta
from agentloop.messages import parse_history
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.testing import Fault, reply, text, tool_call

ran: list[str] = []


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value of {key}"


def valid(result: Any) -> None:
    lint_history(parse_history(result.messages))


QUICK = {"backoff": 0.0}


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Fault.overloaded(), id="overloaded"),
        pytest.param(Fault.server_error(503), id="server-error"),
        pytest.param(Fault.rate_limited(retry_after=None), id="rate-limit"),
        pytest.param(Fault.dropped(), id="connection"),
    ],
)
async def test_a_failed_request_is_retried_until_it_succeeds(http_agent: Any, fault: Fault) -> None:
    agent, server = http_agent([fault, fault, reply("ok")], capabilities=[Retries(3, **QUICK)])
    result = await agent.run("hi")
    assert result.text == "ok" and len(server.requests) == 3
    assert result.usage.requests == 1
    valid(result)


async def test_the_last_failure_is_raised_after_every_attempt(http_agent: Any) -> None:
    agent, server = http_agent([Fault.overloaded()] * 3, capabilities=[Retries(3, **QUICK)])
    with pytest.raises(OverloadedError) as caught:
        await agent.run("hi")
    assert len(server.requests) == 3
    assert caught.value.result is not None
    valid(caught.value.result)


@pytest.mark.parametrize(
    ("fault", "on", "error"),
    [
        pytest.param(Fault.http_error(400), ("overloaded",), BadRequestError, id="a-bad-request"),
        pytest.param(Fault.server_error(), ("overloaded",), ServerError, id="not-named"),
    ],
)
async def test_a_failure_it_does_not_retry_is_raised_at_once(
    http_agent: Any, fault: Fault, on: Any, error: type[Exception]
) -> None:
    agent, server = http_agent([fault, reply("ok")], capabilities=[Retries(3, on=on, **QUICK)])
    with pytest.raises(error):
        await agent.run("hi")
    assert len(server.requests) == 1


async def test_retry_after_is_waited_for_and_a_longer_one_is_raised(http_agent: Any) -> None:
    agent, _ = http_agent(
        [Fault.rate_limited(retry_after=0.1), reply("ok")],
        capabilities=[Retries(2, **QUICK)],
    )
    with capture_logs() as logs:
        assert (await agent.run("hi")).text == "ok"
    waits = [e["wait"] for e in logs if e["event"] == "model.retry"]
    assert len(waits) == 1 and waits[0] >= 0.1
    too_long, _ = http_agent(
        [Fault.rate_limited(retry_after=30), reply("ok")],
        capabilities=[Retries(2, max_wait=5.0, **QUICK)],
    )
    with pytest.raises(RateLimitError) as caught:
        await too_long.run("hi")
    assert caught.value.headers["retry-after"] == "30"


async def test_the_clients_own_retries_give_way_to_the_policy(http_agent: Any) -> None:
    """A client that retries twice meets three faults: alone it gets through, under
    `Retries(attempts=2)` the policy's two requests are all that are sent."""
    script = [Fault.overloaded(retry_after=0), Fault.overloaded(retry_after=0), reply("ok")]
    agent, server = http_agent(script)
    agent = Agent(provider=_retrying(server, agent), capabilities=[Retries(2, **QUICK)])
    with pytest.raises(OverloadedError):
        await agent.run("hi")
    assert len(server.requests) == 2
    alone, again = http_agent(script)
    alone = Agent(provider=_retrying(again, alone))
    assert (await alone.run("hi")).text == "ok" and len(again.requests) == 3


def _retrying(server: Any, agent: Agent) -> AnthropicProvider:
    """The agent's provider, over a client of `server` that retries twice."""
    provider = agent.provider
    assert isinstance(provider, AnthropicProvider)
    return AnthropicProvider(server.client(max_retries=2), stream=provider.streaming)


async def test_an_empty_stream_that_fails_is_retried_by_the_policy(serve: Any) -> None:
    """The provider's own retry of a stream that failed before any block is off too."""
    server = serve([Fault.stream_error(after_blocks=0), Fault.stream_error(after_blocks=0), "ok"])
    provider = AnthropicProvider(server.client(max_retries=2), stream=True)
    agent = Agent(provider=provider, capabilities=[Retries(2, **QUICK)])
    with pytest.raises(OverloadedError):
        await agent.run("hi")
    assert len(server.requests) == 2


async def test_a_stream_cut_in_its_text_is_retried_and_the_events_say_so(serve: Any) -> None:
    server = serve([Fault.stream_error(reply(text("first try"), text("lost"))), reply("second")])
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=True),
        capabilities=[Retries(2, **QUICK)],
    )
    async with agent.run_stream("hi") as run:
        events = [event async for event in run]
    at = events.index(ResponseReplaced(1, 2))
    assert "".join(e.text for e in events[:at] if isinstance(e, TextDelta)) == "first try"
    assert "".join(e.text for e in events[at:] if isinstance(e, TextDelta)) == "second"
    assert run.result.text == "second" and "first try" not in str(run.result.messages)
    valid(run.result)


async def test_a_stream_that_failed_after_a_tool_call_is_not_retried(serve: Any) -> None:
    ran.clear()
    broken = Fault.stream_error(reply(tool_call("lookup", {"key": "a"}), text("then")))
    server = serve([broken, reply(tool_call("lookup", {"key": "b"})), reply("done")])
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=True),
        tools=[lookup],
        capabilities=[Retries(3, **QUICK)],
    )
    with pytest.raises(OverloadedError) as caught:
        async with agent.run_stream("go") as run:
            async for _ in run:
                pass
    assert caught.value.tool_use_streamed and len(server.requests) == 1 and "b" not in ran
    assert caught.value.result is not None
    valid(caught.value.result)


class SendsTwice(Capability):
    """Drops the first response and asks again: what no capability may do after a
    streamed tool call."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        await call_next(request)
        return await call_next(request)


async def test_a_request_is_never_sent_again_after_a_streamed_tool_call(serve: Any) -> None:
    ran.clear()
    server = serve(
        [reply(tool_call("lookup", {"key": "a"})), reply(tool_call("lookup", {"key": "b"}))]
    )
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=True),
        tools=[lookup],
        capabilities=[SendsTwice()],
    )
    with pytest.raises(ConfigurationError, match="streamed a tool call") as caught:
        async with agent.run_stream("go") as run:
            async for _ in run:
                pass
    assert len(server.requests) == 1 and "b" not in ran
    assert caught.value.result is not None
    valid(caught.value.result)


async def test_retries_inside_a_fallback_retry_each_model_first(http_agent: Any) -> None:
    def answer(body: dict[str, Any]) -> Any:
        return Fault.overloaded() if body["model"] == "big" else reply("from small")

    agent, server = http_agent(
        answer, model="big", capabilities=[Fallback(["small"]), Retries(2, **QUICK)]
    )
    result = await agent.run("hi")
    assert result.text == "from small"
    assert [r["model"] for r in server.requests] == ["big", "big", "small"]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        pytest.param({"attempts": 0}, "attempts", id="no-attempt"),
        pytest.param({"attempts": 2.5}, "attempts", id="a-float"),
        pytest.param({"backoff": -1}, "backoff", id="a-negative-backoff"),
        pytest.param({"max_wait": 0}, "max_wait", id="no-wait"),
        pytest.param(
            {"on": ("refusal",)}, "unknown condition 'refusal'", id="a-response-condition"
        ),
    ],
)
def test_retries_are_checked_when_made(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        Retries(**options)
