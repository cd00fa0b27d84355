"""Usage limits: each limit stops a run against the local Messages API, history valid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import genai_prices
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import TURNS, build, crashes, fails, ok, slow

from agentloop import (
    Agent,
    AnthropicProvider,
    Approve,
    ConfigurationError,
    OpenAIChatProvider,
    UsageLimitExceeded,
    UsageLimits,
    lint_history,
    tool,
)
from agentloop.limits import LIMIT_REACHED, price
from agentloop.messages import parse_history
from agentloop.result import Usage
from agentloop.testing import (
    ChatCompletionsServer,
    ScriptedProvider,
    SteppedProvider,
    reply,
    tool_call,
)


class Counter:
    """A tool that counts the calls it ran."""

    def __init__(self) -> None:
        self.runs = 0

        @tool
        def ping(n: int) -> str:
            """Answer pong."""
            self.runs += 1
            return f"pong {n}"

        self.tool = ping


def calls_forever(usage: dict[str, int], per_turn: int = 1) -> Callable[[dict[str, Any]], Any]:
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        return reply(*(tool_call("ping", {"n": i}) for i in range(per_turn)), usage=usage)

    return answer


def assert_valid(result: Any) -> None:
    assert result.stop_reason == "usage_limit"
    lint_history(parse_history(result.messages))
    assert result.messages[-1]["role"] == "user"


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_requests_limit_stops_before_the_request_over_it(serve: Any, streamed: bool) -> None:
    counter = Counter()
    server = serve(calls_forever({"input_tokens": 10, "output_tokens": 5}))
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=streamed),
        tools=[counter.tool],
        usage_limits=UsageLimits(requests=2),
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go")
    exc = caught.value
    assert (exc.limit, exc.bound, exc.value, exc.sent) == ("requests", 2, 3, False)
    assert len(server.requests) == 2 and counter.runs == 2
    assert exc.result is not None and exc.result.usage.requests == 2
    assert_valid(exc.result)
    assert "would be exceeded by the next request" in str(exc)


@pytest.mark.parametrize(
    ("limit", "usage", "bound", "crossed_at"),
    [
        pytest.param("input_tokens", {"input_tokens": 100, "output_tokens": 1}, 250, 3, id="input"),
        pytest.param(
            "input_tokens",
            {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1},
            250,
            3,
            id="input-with-cache-reads",
        ),
        pytest.param(
            "output_tokens", {"input_tokens": 1, "output_tokens": 40}, 100, 3, id="output"
        ),
        pytest.param("total_tokens", {"input_tokens": 30, "output_tokens": 20}, 120, 3, id="total"),
    ],
)
async def test_token_limit_crossed_by_a_response_leaves_its_calls_unrun(
    serve: Any, limit: str, usage: dict[str, int], bound: int, crossed_at: int
) -> None:
    counter = Counter()
    server = serve(calls_forever(usage))
    agent = Agent(
        client=server.client(),
        tools=[counter.tool],
        usage_limits=UsageLimits(**{limit: bound}),
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go")
    exc = caught.value
    assert exc.limit == limit and exc.sent
    assert exc.value > bound
    assert len(server.requests) == crossed_at
    # The calls of the response that crossed the limit are answered, not run.
    assert counter.runs == crossed_at - 1
    result = exc.result
    assert result is not None
    assert_valid(result)
    last = result.messages[-1]["content"]
    assert [b["is_error"] for b in last] == [True]
    assert last[0]["content"] == LIMIT_REACHED.format(limit=limit, bound=bound)
    assert result.usage.requests == crossed_at
    assert [c.is_error for c in result.tool_calls] == [False] * (crossed_at - 1) + [True]


async def test_tool_calls_limit_runs_none_of_a_turn_that_would_go_over(serve: Any) -> None:
    counter = Counter()
    script = [
        reply(tool_call("ping", {"n": 1})),
        reply(tool_call("ping", {"n": 2}), tool_call("ping", {"n": 3})),
        reply("never asked"),
    ]
    server = serve(script)
    agent = Agent(client=server.client(), tools=[counter.tool])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go", usage_limits=UsageLimits(tool_calls=2))
    exc = caught.value
    assert (exc.limit, exc.bound, exc.value) == ("tool_calls", 2, 3)
    assert counter.runs == 1 and len(server.requests) == 2
    assert exc.result is not None
    assert_valid(exc.result)
    assert [b["is_error"] for b in exc.result.messages[-1]["content"]] == [True, True]


async def test_tool_calls_limit_under_streaming_starts_no_eager_call_over_it(
    serve: Any,
) -> None:
    counter = Counter()
    server = serve([reply(*(tool_call("ping", {"n": i}) for i in range(3)))])
    agent = Agent(provider=AnthropicProvider(server.client(), stream=True), tools=[counter.tool])
    with pytest.raises(UsageLimitExceeded) as caught:
        async with agent.run_stream("go", usage_limits=UsageLimits(tool_calls=2)) as stream:
            async for _ in stream:
                pass
    assert counter.runs == 2  # the first two started as their blocks closed; not the third
    result = caught.value.result
    assert result is not None
    assert_valid(result)
    errors = [b.get("is_error", False) for b in result.messages[-1]["content"]]
    assert errors == [False, False, True]


async def test_tool_calls_zero_allows_no_call(serve: Any) -> None:
    counter = Counter()
    server = serve([reply(tool_call("ping", {"n": 1}))])
    agent = Agent(client=server.client(), tools=[counter.tool])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go", usage_limits=UsageLimits(tool_calls=0))
    assert counter.runs == 0 and caught.value.limit == "tool_calls"
    assert caught.value.result is not None
    assert_valid(caught.value.result)


async def test_cost_limit_priced_by_genai_prices(serve: Any) -> None:
    usage = {"input_tokens": 100_000, "output_tokens": 1_000}
    counter = Counter()
    server = serve(calls_forever(usage))
    model = "claude-sonnet-4-5"
    one = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=100_000, output_tokens=1_000), model
    ).total_price
    agent = Agent(model, client=server.client(), tools=[counter.tool])
    bound = float(one) * 2.5
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go", usage_limits=UsageLimits(cost_usd=bound))
    exc = caught.value
    assert exc.limit == "cost_usd" and exc.value == pytest.approx(float(one) * 3)
    assert len(server.requests) == 3 and counter.runs == 2
    assert exc.result is not None
    assert_valid(exc.result)


async def test_a_resumed_run_counts_the_cost_its_result_reports(serve: Any) -> None:
    # Two responses of 150k input tokens cost 2 x $0.45; priced as one 300k request, the
    # long-context rate would make them $1.80 and a $1 limit would refuse the resume.
    big = {"input_tokens": 150_000, "output_tokens": 10}
    server = serve(
        [
            reply(tool_call("ping", {"n": 1}), usage=big),
            reply(tool_call("guarded", {"n": 2}), usage=big),
            reply("done", usage={"input_tokens": 1_000, "output_tokens": 10}),
        ]
    )
    counter = Counter()

    @tool(requires_approval=True)
    def guarded(n: int) -> str:
        """Needs a yes."""
        return f"guarded {n}"

    agent = Agent(
        "claude-sonnet-4-5",
        client=server.client(),
        tools=[counter.tool, guarded],
        usage_limits=UsageLimits(cost_usd=1.0),
    )
    paused = await agent.run("go")
    assert paused.stop_reason == "approval_required"
    assert paused.cost == pytest.approx(2 * price(Usage(**big), "claude-sonnet-4-5"))
    decisions = {a.tool_use_id: Approve() for a in paused.approvals}
    result = await agent.resume(paused.state, decisions=decisions)
    assert result.text == "done" and len(server.requests) == 3
    last = price(Usage(input_tokens=1_000, output_tokens=10), "claude-sonnet-4-5")
    assert result.cost == pytest.approx(paused.cost + last)


def test_price_counts_cache_reads_and_writes_at_their_rates() -> None:
    plain = price(Usage(input_tokens=1_000_000), "claude-sonnet-4-5")
    read = price(Usage(cache_read_input_tokens=1_000_000), "claude-sonnet-4-5")
    written = price(Usage(cache_creation_input_tokens=1_000_000), "claude-sonnet-4-5")
    assert plain is not None and read is not None and written is not None
    assert read == pytest.approx(plain * 0.1) and written == pytest.approx(plain * 1.25)
    assert price(Usage(input_tokens=5), "claude-scripted") is None


async def test_cost_limit_with_a_model_without_a_price_does_not_start(serve: Any) -> None:
    server = serve([reply("unused")])
    agent = Agent("claude-scripted", client=server.client())
    with pytest.raises(ConfigurationError, match="no price for 'claude-scripted'"):
        await agent.run("go", usage_limits=UsageLimits(cost_usd=1.0))
    assert server.requests == []


async def test_exact_pre_check_counts_tokens_and_sends_nothing_over_the_limit(
    serve: Any,
) -> None:
    server = serve([reply("unused")])
    limits = UsageLimits(input_tokens=5, count_tokens_before_request=True)
    agent = Agent(client=server.client(), usage_limits=limits)
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("a prompt that counts for more than five tokens on the server")
    exc = caught.value
    assert exc.limit == "input_tokens" and not exc.sent and exc.value > 5
    assert [r.path for r in server.recorded] == ["/v1/messages/count_tokens"]
    assert server.requests == []
    assert exc.result is not None and exc.result.usage.requests == 0


async def test_exact_pre_check_lets_a_request_within_the_limit_through(serve: Any) -> None:
    server = serve([reply("fine", usage={"input_tokens": 30, "output_tokens": 2})])
    limits = UsageLimits(input_tokens=1_000, count_tokens_before_request=True)
    result = await Agent(client=server.client(), usage_limits=limits, cache="off").run("hi")
    assert result.text == "fine"
    paths = [r.path for r in server.recorded]
    assert paths == ["/v1/messages/count_tokens", "/v1/messages"]
    counted = server.recorded[0].body
    assert counted["messages"] == server.requests[0]["messages"]
    assert "max_tokens" not in counted


async def test_exact_pre_check_needs_a_provider_that_counts(
    serve_chat: Callable[..., ChatCompletionsServer],
) -> None:
    chat = serve_chat([reply("unused")])
    limits = UsageLimits(input_tokens=10, count_tokens_before_request=True)
    with pytest.raises(ConfigurationError, match="count_tokens"):
        Agent(provider=OpenAIChatProvider(chat.client()), usage_limits=limits)
    agent = Agent(provider=OpenAIChatProvider(chat.client()))
    with pytest.raises(ConfigurationError, match="count_tokens"):
        await agent.run("hi", usage_limits=limits)


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
async def test_a_runs_limits_replace_the_agents(serve: Any) -> None:
    server = serve(calls_forever({"input_tokens": 10, "output_tokens": 5}))
    agent = Agent(
        client=server.client(), tools=[Counter().tool], usage_limits=UsageLimits(requests=1)
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go", usage_limits=UsageLimits(requests=3))
    assert caught.value.bound == 3 and len(server.requests) == 3


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
def test_run_sync_takes_usage_limits() -> None:
    provider = ScriptedProvider(calls_forever({"input_tokens": 10, "output_tokens": 5}))
    agent = Agent(provider=provider, tools=[Counter().tool])
    with pytest.raises(UsageLimitExceeded) as caught:
        agent.run_sync("go", usage_limits=UsageLimits(requests=1))
    assert caught.value.result is not None and caught.value.result.rounds == 1


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
async def test_within_limits_a_run_ends_as_usual(serve: Any) -> None:
    server = serve([reply(tool_call("ping", {"n": 1})), reply("done")])
    limits = UsageLimits(requests=2, tool_calls=1, input_tokens=20, output_tokens=10)
    result = await Agent(client=server.client(), tools=[Counter().tool]).run(
        "go", usage_limits=limits
    )
    assert result.stop_reason == "end_turn" and result.text == "done"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"requests": 0}, "requests must be a whole number >= 1", id="zero"),
        pytest.param({"input_tokens": 1.5}, "input_tokens must be a whole number", id="float"),
        pytest.param({"total_tokens": True}, "total_tokens must be a whole number", id="bool"),
        pytest.param({"tool_calls": -1}, "tool_calls must be a whole number >= 0", id="neg"),
        pytest.param({"cost_usd": 0}, "cost_usd must be a number of US dollars > 0", id="free"),
        pytest.param({"cost_usd": float("nan")}, "cost_usd must be", id="nan"),
        pytest.param({"count_tokens_before_request": "yes"}, "True or False", id="flag"),
    ],
)
def test_limits_are_checked_when_made(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        UsageLimits(**fields)


def test_usage_limits_must_be_usage_limits() -> None:
    with pytest.raises(ConfigurationError, match="usage_limits must be a UsageLimits"):
        Agent(usage_limits={"requests": 1}, provider=ScriptedProvider([]))  # type: ignore[arg-type]


@pytest.mark.both_formats
async def test_limits_hold_on_every_provider_and_stream(http_agent: Any) -> None:
    counter = Counter()
    agent, server = http_agent(
        calls_forever({"input_tokens": 100, "output_tokens": 5}),
        tools=[counter.tool],
        usage_limits=UsageLimits(input_tokens=250),
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("go")
    assert caught.value.limit == "input_tokens" and caught.value.value == 300
    assert len(server.model.requests) == 3 and counter.runs == 2
    assert caught.value.result is not None
    assert_valid(caught.value.result)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=TURNS,
    requests=st.none() | st.integers(min_value=1, max_value=6),
    tokens=st.none() | st.integers(min_value=1, max_value=60),
    tool_calls=st.none() | st.integers(min_value=0, max_value=6),
    streamed=st.booleans(),
)
@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
def test_any_limit_over_random_model_behaviour_leaves_a_valid_history(
    turns: list[tuple[list[str], str]],
    requests: int | None,
    tokens: int | None,
    tool_calls: int | None,
    streamed: bool,
) -> None:
    provider: Any = SteppedProvider(build(turns)) if streamed else ScriptedProvider(build(turns))
    limits = UsageLimits(requests=requests, total_tokens=tokens, tool_calls=tool_calls)
    agent = Agent(provider=provider, tools=[ok, slow, fails, crashes], tool_timeout=0.02)

    async def main() -> Any:
        if not streamed:
            return await agent.run("start", usage_limits=limits)
        async with agent.run_stream("start", usage_limits=limits) as stream:
            async for _ in stream:
                pass
        return stream.result

    try:
        result = anyio.run(main)
    except UsageLimitExceeded as exc:
        result = exc.result
        assert result is not None and result.stop_reason == "usage_limit"
    lint_history(parse_history(result.messages))
    ran = [c for c in result.tool_calls if not c.output.startswith("Not run")]
    if tool_calls is not None:
        assert len([c for c in ran if c.name in ("ok", "fails", "crashes", "slow")]) <= tool_calls
    if requests is not None:
        assert result.usage.requests <= requests


async def test_a_resumed_run_counts_what_it_spent_before_its_pause(serve: Any) -> None:
    from agentloop import Approve

    counter = Counter()
    first, second = tool_call("ping", {"n": 1}), tool_call("ping", {"n": 2})
    server = serve([reply(first, second), reply(tool_call("ping", {"n": 3})), reply("no")])

    def second_waits(ctx: Any, input: dict[str, Any]) -> bool:
        return bool(input.get("n") == 2)

    agent = Agent(
        client=server.client(),
        tools=[counter.tool],
        approval_required=second_waits,
        usage_limits=UsageLimits(tool_calls=2),
    )
    paused = await agent.run("go")
    assert paused.stop_reason == "approval_required" and counter.runs == 1
    assert paused.state is not None
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.resume(paused.state, decisions={second["id"]: Approve()})
    # The call before the pause and the approved one make two: the third is over the limit.
    assert counter.runs == 2 and caught.value.limit == "tool_calls"
    assert caught.value.result is not None
    assert_valid(caught.value.result)


async def test_requests_are_bounded_by_max_rounds_and_the_old_limit_warns(serve: Any) -> None:
    """One way to bound a run's requests: `max_rounds`, which returns, history complete."""
    with pytest.warns(DeprecationWarning, match=r"max_rounds"):
        UsageLimits(requests=2)
    server = serve(calls_forever({"input_tokens": 10, "output_tokens": 1}))
    agent = Agent(client=server.client(), tools=[Counter().tool], max_rounds=2)
    result = await agent.run("go")
    assert result.stop_reason == "max_rounds" and result.usage.requests == 2
    assert len(server.requests) == 2
    lint_history(parse_history(result.messages))
    again = await agent.run(history=result.messages)  # continues where it stopped
    sent = server.requests[2]["messages"]  # the whole history (with cache markers)
    assert [m["role"] for m in sent] == [m["role"] for m in result.messages]
    assert again.stop_reason == "max_rounds" and again.usage.requests == 2
