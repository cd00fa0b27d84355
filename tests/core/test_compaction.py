"""History processors: what is sent is compacted, the run's history stays whole."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import TURNS, build, crashes, fails, ok, slow

from agentloop import Agent, ConfigurationError, HistoryError, RunContext, lint_history, tool
from agentloop.compaction import (
    CLEARED,
    SUMMARY_HEADER,
    SUMMARY_PROMPT,
    clear_old_tool_results,
    estimate_tokens,
    summarize,
)
from agentloop.errors import BadRequestError
from agentloop.messages import Message, TextBlock, parse_history
from agentloop.testing import Fault, ScriptedProvider, reply, tool_call


@tool
def fetch(n: int) -> str:
    """Fetch page n."""
    return f"page {n} " + "lorem ipsum " * 20


def results_sent(body: dict[str, Any]) -> list[str]:
    return [
        b["content"] if isinstance(b.get("content"), str) else "blocks"
        for m in body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


def fetching(rounds: int) -> list[dict[str, Any]]:
    return [reply(tool_call("fetch", {"n": i})) for i in range(rounds)] + [reply("done")]


async def test_clear_old_tool_results_shapes_what_is_sent_not_the_history(serve: Any) -> None:
    server = serve(fetching(4))
    agent = Agent(
        client=server.client(), tools=[fetch], history_processors=[clear_old_tool_results(1)]
    )
    result = await agent.run("read four pages")
    sent = [results_sent(body) for body in server.requests]
    assert sent[1] == [fetch.function(0)]  # type: ignore[attr-defined]
    assert sent[4][:3] == [CLEARED] * 3 and sent[4][3].startswith("page 3")
    # The run's own history is whole.
    kept = [b["content"] for m in result.messages[1:] if m["role"] == "user" for b in m["content"]]
    assert all(text.startswith("page") for text in kept) and len(kept) == 4
    for body in server.requests:
        lint_history(parse_history(body["messages"]))


async def test_processors_sync_async_and_with_context_run_in_order() -> None:
    seen: list[Any] = []

    def first(messages: list[Message]) -> list[Message]:
        seen.append(("first", len(messages)))
        return messages

    async def second(ctx: RunContext[str], messages: list[Message]) -> list[Message]:
        await anyio.lowlevel.checkpoint()
        seen.append(("second", ctx.round, ctx.deps))
        return [*messages[:-1], Message.user("rewritten")] if ctx.round == 1 else messages

    provider = ScriptedProvider([reply(tool_call("fetch", {"n": 1})), reply("done")])
    agent = Agent(provider=provider, tools=[fetch], history_processors=[first, second])
    result = await agent.run("original", deps="the deps")
    assert seen == [
        ("first", 1),
        ("second", 1, "the deps"),
        ("first", 3),
        ("second", 2, "the deps"),
    ]
    assert provider.requests[0]["messages"] == [{"role": "user", "content": "rewritten"}]
    assert result.messages[0] == {"role": "user", "content": "original"}


async def test_a_processor_that_breaks_the_rules_is_caught_before_sending() -> None:
    def drop_results(messages: list[Message]) -> list[Message]:
        return [m for m in messages if not any(b.type == "tool_result" for b in m.blocks)]

    provider = ScriptedProvider([reply(tool_call("fetch", {"n": 1})), reply("never")])
    agent = Agent(provider=provider, tools=[fetch], history_processors=[drop_results])
    with pytest.raises(HistoryError, match="tool_use") as caught:
        await agent.run("go")
    assert len(provider.requests) == 1
    assert caught.value.result is not None
    lint_history(parse_history(caught.value.result.messages))


@pytest.mark.parametrize("value", [pytest.param("text", id="str"), pytest.param(None, id="none")])
async def test_a_processor_must_return_a_list_of_messages(value: Any) -> None:
    agent = Agent(provider=ScriptedProvider([reply("x")]), history_processors=[lambda m: value])
    with pytest.raises(ConfigurationError, match="history processor"):
        await agent.run("go")


def test_history_processors_must_be_functions() -> None:
    with pytest.raises(ConfigurationError, match="history_processors"):
        Agent(provider=ScriptedProvider([]), history_processors=["clear"])  # type: ignore[list-item]


def test_strategies_check_their_options() -> None:
    with pytest.raises(ConfigurationError, match="keep_last"):
        clear_old_tool_results(-1)
    with pytest.raises(ConfigurationError, match="when_input_tokens_exceed"):
        summarize(0)


def is_summary_request(body: dict[str, Any]) -> bool:
    first = body["messages"][0]["content"]
    return isinstance(first, str) and first.startswith(SUMMARY_PROMPT)


def scripted_with_summaries(main: list[dict[str, Any]]) -> Any:
    answers = iter(main)

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        if is_summary_request(body):
            return reply("pages 0-1 were read", usage={"input_tokens": 300, "output_tokens": 7})
        return next(answers)

    return respond


async def test_summarize_folds_older_turns_in_a_request_counted_in_usage(serve: Any) -> None:
    server = serve(scripted_with_summaries(fetching(4)))
    threshold = 200
    agent = Agent(
        client=server.client(),
        tools=[fetch],
        history_processors=[summarize(when_input_tokens_exceed=threshold, keep_last=1)],
        cache="off",  # the requests are read as sent, without cache breakpoints
    )
    result = await agent.run("read four pages")
    summaries = [b for b in server.requests if is_summary_request(b)]
    main = [b for b in server.requests if b not in summaries]
    assert len(main) == 5
    assert 1 <= len(summaries) < len(main) - 1, "a summary is reused while it is enough"
    assert result.usage.requests == len(server.requests)
    assert result.usage.input_tokens == 5 * 10 + 300 * len(summaries)
    folded = [b for b in main if isinstance(b["messages"][0]["content"], list)]
    assert folded, "a request was sent with the older turns folded"
    for body in folded:
        first = body["messages"][0]["content"][0]["text"]
        assert first == SUMMARY_HEADER + "pages 0-1 were read"
        assert body["messages"][1]["role"] == "assistant"
    for body in server.requests:
        lint_history(parse_history(body["messages"]))
    # Kept: the whole history, the summary nowhere in it.
    assert len(result.messages) == 10 and result.messages[0]["content"] == "read four pages"


async def test_a_summary_is_reused_while_the_history_stays_under_the_limit() -> None:
    history = parse_history(
        [
            {"role": "user", "content": "x" * 400},
            {"role": "assistant", "content": "a" * 400},
            {"role": "user", "content": "next"},
            {"role": "assistant", "content": "short"},
            {"role": "user", "content": "more"},
        ]
    )
    summarizer = ScriptedProvider(["the gist"] * 3)
    processor = summarize(150, model="m", provider=summarizer, keep_last=1)
    ctx = RunContext("run", 1)  # no run behind it: nothing to count the summary in
    once = await processor(ctx, history)
    assert len(summarizer.requests) == 1 and once[0].text == SUMMARY_HEADER + "the gist"
    grown = [
        *history,
        Message.of_blocks("assistant", [TextBlock(text="fine")]),
        Message.user("again"),
    ]
    again = await processor(ctx, grown)
    assert len(summarizer.requests) == 1
    assert again == [*once, *grown[5:]]
    assert estimate_tokens(once) < estimate_tokens(history)


async def test_a_prompt_too_long_refusal_compacts_and_retries_once(serve: Any) -> None:
    script = [*fetching(3)[:3], Fault.prompt_too_long(), reply("done")]
    server = serve(script)
    agent = Agent(
        client=server.client(), tools=[fetch], history_processors=[clear_old_tool_results(5)]
    )
    result = await agent.run("read")
    assert result.stop_reason == "end_turn" and result.text == "done"
    refused, retried = server.requests[3], server.requests[4]
    assert results_sent(refused) == [fetch.function(i) for i in range(3)]  # type: ignore[attr-defined]
    assert results_sent(retried)[:2] == [CLEARED, CLEARED]
    assert results_sent(retried)[2].startswith("page 2")


async def test_a_second_refusal_in_a_row_ends_the_run(serve: Any) -> None:
    script = [reply(tool_call("fetch", {"n": 1})), Fault.prompt_too_long(), Fault.prompt_too_long()]
    server = serve(script)
    agent = Agent(
        client=server.client(), tools=[fetch], history_processors=[clear_old_tool_results(5)]
    )
    with pytest.raises(BadRequestError, match="prompt is too long"):
        await agent.run("read")
    assert len(server.requests) == 3


async def test_without_processors_a_refusal_for_length_ends_the_run(serve: Any) -> None:
    server = serve([Fault.prompt_too_long()])
    with pytest.raises(BadRequestError, match="prompt is too long: 208656 tokens > 200000"):
        await Agent(client=server.client()).run("read")


async def test_a_context_window_stop_compacts_and_goes_on(serve: Any) -> None:
    script = [
        *fetching(2)[:2],
        reply("partial answ", stop_reason="model_context_window_exceeded"),
        reply("done"),
    ]
    server = serve(script)
    agent = Agent(
        client=server.client(), tools=[fetch], history_processors=[clear_old_tool_results(5)]
    )
    result = await agent.run("read")
    assert result.stop_reason == "end_turn" and result.rounds == 4
    assert results_sent(server.requests[3])[0] == CLEARED


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=TURNS,
    keep=st.integers(min_value=0, max_value=4),
    threshold=st.integers(min_value=1, max_value=400),
    keep_turns=st.integers(min_value=1, max_value=3),
)
def test_runs_with_processors_send_only_valid_histories(
    turns: list[tuple[list[str], str]], keep: int, threshold: int, keep_turns: int
) -> None:
    provider = ScriptedProvider(build(turns))  # lints every request it receives
    summarizer = ScriptedProvider(lambda body: reply("summary"))
    agent = Agent(
        provider=provider,
        tools=[ok, slow, fails, crashes],
        tool_timeout=0.02,
        history_processors=[
            clear_old_tool_results(keep),
            summarize(threshold, model="m", provider=summarizer, keep_last=keep_turns),
        ],
    )
    result = anyio.run(agent.run, "start")
    lint_history(parse_history(result.messages))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=TURNS,
    keep=st.integers(min_value=0, max_value=4),
    keep_turns=st.integers(min_value=1, max_value=3),
)
def test_every_strategy_keeps_a_random_valid_history_valid(
    turns: list[tuple[list[str], str]], keep: int, keep_turns: int
) -> None:
    agent = Agent(provider=ScriptedProvider(build(turns)), tools=[ok, fails], max_rounds=8)
    history = parse_history(anyio.run(agent.run, "start").messages)
    clear = clear_old_tool_results(keep)
    folded = summarize(
        1, model="m", provider=ScriptedProvider(lambda body: reply("s")), keep_last=keep_turns
    )
    for processed in (
        clear(list(history)),
        clear.forced(list(history)),
        anyio.run(folded, RunContext("run", 1), list(history)),
        anyio.run(folded.forced, RunContext("run", 1), list(history)),
    ):
        lint_history(processed)


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
async def test_summary_requests_count_against_the_runs_limits(serve: Any) -> None:
    from agentloop import UsageLimitExceeded, UsageLimits

    server = serve(scripted_with_summaries(fetching(3)))
    agent = Agent(
        client=server.client(),
        tools=[fetch],
        history_processors=[summarize(when_input_tokens_exceed=1, keep_last=1)],
        usage_limits=UsageLimits(requests=2),
    )
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("read")
    # Round 1, then a summary for round 2: the budget of two requests is spent.
    assert [is_summary_request(b) for b in server.requests] == [False, True]
    result = caught.value.result
    assert result is not None and result.usage.requests == 2
    assert result.usage.input_tokens == 10 + 300
