"""`Fallback`: the next model answers a failed or refused request; the run stays whole.

Every run talks to `MessagesServer` (and `ChatCompletionsServer` for a fallback in the
Chat Completions format) through the SDKs; each server answers by the model a request
names, so the requests show which model was asked when.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentloop import (
    Agent,
    AnthropicProvider,
    Approve,
    ConfigurationError,
    Fallback,
    OpenAIChatProvider,
    lint_history,
    tool,
)
from agentloop.durable.records import result_from_json, result_to_json
from agentloop.errors import APIConnectionError, OverloadedError, ServerError
from agentloop.events import ResponseReplaced, TextDelta
from agentloop.messages import parse_history
from agentloop.pricing import cost_of
from agentloop.providers.base import ModelResponse
from agentloop.result import Usage
from agentloop.testing import Fault, ScriptedProvider, reply, text, tool_call

SONNET = "claude-sonnet-4-5"
HAIKU = "claude-haiku-4-5"

ran: list[str] = []


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    return f"value of {key}"


def by_model(answers: dict[str, Any]) -> Any:
    """A script answering each request with `answers[model]` (an item, or a list used in turn)."""

    def answer(body: dict[str, Any]) -> Any:
        item = answers[body["model"]]
        return item.pop(0) if isinstance(item, list) else item

    return answer


def valid(result: Any, **options: Any) -> None:
    lint_history(parse_history(result.messages), **options)


def asked(server: Any) -> list[str]:
    return [r["model"] for r in server.requests]


@pytest.mark.parametrize(
    ("fault", "condition"),
    [
        pytest.param(Fault.overloaded(), "overloaded", id="overloaded"),
        pytest.param(Fault.server_error(), "server_error", id="server-error"),
        pytest.param(Fault.rate_limited(retry_after=None), "rate_limit", id="rate-limit"),
        pytest.param(Fault.dropped(), "connection", id="connection"),
        pytest.param(Fault.prompt_too_long(), "context_length", id="prompt-too-long"),
    ],
)
async def test_a_failed_request_is_answered_by_the_next_model(
    http_agent: Any, fault: Fault, condition: str
) -> None:
    script = by_model({SONNET: fault, HAIKU: reply("from haiku", model=HAIKU)})
    fallback = Fallback([HAIKU], on=(condition,))
    agent, server = http_agent(script, model=SONNET, capabilities=[fallback])
    result = await agent.run("hi")
    assert result.text == "from haiku" and result.stop_reason == "end_turn"
    assert asked(server) == [SONNET, HAIKU]
    assert result.models == [HAIKU] and result.usage.requests == 1
    valid(result)


async def test_a_failure_not_named_is_raised_without_a_fallback(http_agent: Any) -> None:
    script = by_model({SONNET: Fault.server_error(), HAIKU: reply("from haiku")})
    agent, server = http_agent(
        script, model=SONNET, capabilities=[Fallback([HAIKU], on=("overloaded",))]
    )
    with pytest.raises(ServerError) as caught:
        await agent.run("hi")
    assert asked(server) == [SONNET]
    assert caught.value.result is not None
    valid(caught.value.result)


async def test_the_last_models_failure_is_the_runs(http_agent: Any) -> None:
    script = by_model({SONNET: Fault.overloaded(), HAIKU: Fault.overloaded(), "c": Fault.dropped()})
    agent, server = http_agent(script, model=SONNET, capabilities=[Fallback([HAIKU, "c"])])
    with pytest.raises(APIConnectionError) as caught:
        await agent.run("hi")
    assert asked(server) == [SONNET, HAIKU, "c"]
    assert caught.value.result is not None and caught.value.result.stop_reason == "error"


async def test_a_refusal_falls_back_and_each_attempt_is_counted_and_priced(
    http_agent: Any,
) -> None:
    refused = {"input_tokens": 1000, "output_tokens": 20}
    kept = {"input_tokens": 1200, "output_tokens": 300}
    script = by_model(
        {
            SONNET: reply("I won't.", stop_reason="refusal", usage=refused, model=SONNET),
            HAIKU: reply("Here it is.", usage=kept, model=HAIKU),
        }
    )
    agent, _ = http_agent(script, model=SONNET, capabilities=[Fallback([HAIKU], on=("refusal",))])
    result = await agent.run("hi")
    assert result.text == "Here it is." and result.models == [HAIKU]
    assert result.usage.requests == 2
    assert result.usage.input_tokens == 2200 and result.usage.output_tokens == 320
    # Each response at its own model's prices: the kept one is Haiku's, not Sonnet's.
    expected = cost_of(SONNET, Usage(**refused, requests=1)) + cost_of(
        HAIKU, Usage(**kept, requests=1)
    )
    assert result.cost == pytest.approx(expected)
    # Only the kept response is in the history.
    assert [m["role"] for m in result.messages] == ["user", "assistant"]
    assert "I won't." not in str(result.messages)
    valid(result)


async def test_a_refused_response_counts_when_the_next_model_fails(http_agent: Any) -> None:
    script = by_model(
        {
            SONNET: reply("No.", stop_reason="refusal", usage={"input_tokens": 70}),
            HAIKU: Fault.overloaded(),
        }
    )
    fallback = Fallback([HAIKU], on=("refusal", "overloaded"))
    agent, server = http_agent(script, model=SONNET, capabilities=[fallback])
    with pytest.raises(OverloadedError) as caught:
        await agent.run("hi")
    assert asked(server) == [SONNET, HAIKU]
    assert caught.value.result is not None
    assert caught.value.result.usage.input_tokens == 70
    assert caught.value.result.usage.requests == 1
    assert caught.value.result.models == []
    valid(caught.value.result)


async def test_a_context_window_stop_falls_back_to_a_larger_model(http_agent: Any) -> None:
    script = by_model(
        {
            SONNET: reply("cut", stop_reason="model_context_window_exceeded"),
            HAIKU: reply("whole answer", model=HAIKU),
        }
    )
    agent, _ = http_agent(
        script, model=SONNET, capabilities=[Fallback([HAIKU], on=("context_length",))]
    )
    result = await agent.run("hi")
    assert result.text == "whole answer" and result.usage.requests == 2


async def test_the_model_a_response_does_not_name_is_the_one_asked(http_agent: Any) -> None:
    script = by_model(
        {
            SONNET: [reply(tool_call("lookup", {"key": "a"}), model=""), Fault.overloaded()],
            HAIKU: reply("done", model=""),
        }
    )
    agent, _ = http_agent(script, model=SONNET, tools=[lookup], capabilities=[Fallback([HAIKU])])
    result = await agent.run("go")
    assert result.models == [SONNET, HAIKU]


async def test_a_refused_response_with_tool_calls_is_kept_and_no_call_runs(
    http_agent: Any,
) -> None:
    ran.clear()
    refused = reply(text("no"), tool_call("lookup", {"key": "x"}), stop_reason="refusal")
    script = by_model({SONNET: refused, HAIKU: reply("from haiku")})
    agent, server = http_agent(
        script, model=SONNET, tools=[lookup], capabilities=[Fallback([HAIKU], on=("refusal",))]
    )
    result = await agent.run("go")
    assert result.stop_reason == "refusal" and asked(server) == [SONNET]
    assert ran == [] and result.tool_calls[0].is_error
    valid(result)


async def test_a_streamed_refusal_is_replaced_and_the_events_say_so(
    kind: str, streaming_provider: Any
) -> None:
    script = by_model(
        {
            SONNET: reply("I will not do that.", stop_reason="refusal"),
            HAIKU: reply("Done it.", model=HAIKU),
        }
    )
    async with streaming_provider(kind, script) as provider:
        agent = Agent(
            provider=provider, model=SONNET, capabilities=[Fallback([HAIKU], on=("refusal",))]
        )
        async with agent.run_stream("go") as run:
            events = [event async for event in run]
    replaced = [i for i, e in enumerate(events) if isinstance(e, ResponseReplaced)]
    assert len(replaced) == 1 and events[replaced[0]] == ResponseReplaced(1, 2)
    before = "".join(e.text for e in events[: replaced[0]] if isinstance(e, TextDelta))
    after = "".join(e.text for e in events[replaced[0] :] if isinstance(e, TextDelta))
    assert before == "I will not do that." and after == "Done it."
    assert run.result.text == "Done it." and run.result.usage.requests == 2
    assert "I will not" not in str(run.result.messages)
    valid(run.result)


@pytest.fixture(params=["stepped", "anthropic-sse"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_no_fallback_after_a_streamed_tool_call(serve: Any) -> None:
    """A response that streamed a whole tool call and then failed is not replaced."""
    ran.clear()
    broken = Fault.stream_error(reply(tool_call("lookup", {"key": "k"}), text("more")))
    server = serve(by_model({SONNET: broken, HAIKU: reply(tool_call("lookup", {"key": "h"}))}))
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=True),
        model=SONNET,
        tools=[lookup],
        capabilities=[Fallback([HAIKU])],
    )
    with pytest.raises(OverloadedError) as caught:
        async with agent.run_stream("go") as run:
            async for _ in run:
                pass
    assert caught.value.tool_use_streamed
    assert asked(server) == [SONNET] and "h" not in ran
    assert caught.value.result is not None
    valid(caught.value.result)


async def test_a_stream_broken_before_any_tool_call_falls_back_and_its_call_runs_once(
    serve: Any,
) -> None:
    ran.clear()
    broken = Fault.stream_error(reply(text("let me look"), tool_call("lookup", {"key": "k"})))
    script = by_model(
        {SONNET: broken, HAIKU: [reply(tool_call("lookup", {"key": "h"})), reply("found")]}
    )
    server = serve(script)
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=True),
        model=SONNET,
        tools=[lookup],
        capabilities=[Fallback([HAIKU])],
    )
    async with agent.run_stream("go") as run:
        events = [event async for event in run]
    assert run.result.text == "found" and ran == ["h"]
    assert asked(server) == [SONNET, HAIKU, SONNET, HAIKU]  # the own model first, each round
    assert ResponseReplaced(1, 2) in events
    assert "let me look" not in str(run.result.messages)
    valid(run.result)


THINKING = {"type": "enabled", "budget_tokens": 1024}


async def test_a_fallback_in_the_chat_completions_format_keeps_a_thinking_history_valid(
    serve: Any, serve_chat: Any
) -> None:
    ran.clear()
    thought = {"type": "thinking", "thinking": "I should look it up.", "signature": "c2lnbmVk"}
    claude = serve(
        [reply(thought, tool_call("lookup", {"key": "a"}), model=SONNET), Fault.overloaded()]
    )
    chat = serve_chat([reply("It is the value of a.", model="qwen3")])
    agent = Agent(
        provider=AnthropicProvider(claude.client()),
        model=SONNET,
        thinking=THINKING,
        tools=[lookup],
        capabilities=[Fallback([(chat.client(), "qwen3")])],
    )
    result = await agent.run("What is a?")
    assert result.text == "It is the value of a." and ran == ["a"]
    assert result.models == [SONNET, "qwen3"]
    assert result.messages[1]["content"][0] == thought  # kept verbatim
    valid(result, thinking=THINKING)


async def test_a_fallback_given_as_an_sdk_client_or_a_provider(serve: Any, serve_chat: Any) -> None:
    primary = serve([Fault.overloaded(), Fault.overloaded()])
    other = serve([reply("from the other server", model=HAIKU)])
    chat = serve_chat([reply("from chat", model="qwen3")])
    agent = Agent(client=primary.client(), model=SONNET)
    via_client = await agent.run("hi", capabilities=[Fallback([(other.client(), HAIKU)])])
    via_provider = await agent.run(
        "hi", capabilities=[Fallback([(OpenAIChatProvider(chat.client()), "qwen3")])]
    )
    assert via_client.text == "from the other server" and via_client.models == [HAIKU]
    assert via_provider.text == "from chat" and via_provider.models == ["qwen3"]
    assert [r["model"] for r in chat.requests] == ["qwen3"]


async def test_a_paused_run_keeps_which_model_answered_each_round(http_agent: Any) -> None:
    script = by_model(
        {
            SONNET: [Fault.overloaded(), reply("done", model=SONNET)],
            HAIKU: reply(tool_call("lookup", {"key": "a"}), model=HAIKU),
        }
    )
    agent, _ = http_agent(
        script,
        model=SONNET,
        tools=[lookup],
        approval_required={"lookup"},
        capabilities=[Fallback([HAIKU])],
    )
    paused = await agent.run("go")
    assert paused.stop_reason == "approval_required" and paused.models == [HAIKU]
    call = paused.approvals[0].tool_use_id
    result = await agent.resume(paused.state, decisions={call: Approve()})
    assert result.text == "done" and result.models == [HAIKU, SONNET]


async def test_models_are_recorded_and_old_records_still_load() -> None:
    script = by_model({SONNET: Fault.overloaded(), HAIKU: reply("hi", model=HAIKU)})
    agent = Agent(provider=ScriptedProvider(script), model=SONNET, capabilities=[Fallback([HAIKU])])
    data = result_to_json(await agent.run("hi"))
    assert result_from_json(data).models == [HAIKU]
    del data["models"]
    assert result_from_json(data).models == []
    response = ModelResponse.from_wire(reply("hi"))
    sent = ModelResponse(
        response.content,
        "end_turn",
        sent_to=(HAIKU, "anthropic"),
        extra_usage=Usage(input_tokens=5, requests=1),
        extra_cost=0.25,
    )
    assert ModelResponse.from_json(sent.to_json()) == sent
    old = response.to_json()
    for name in ("sent_to", "extra_usage", "extra_cost"):
        del old[name]
    assert ModelResponse.from_json(old) == response


@pytest.mark.parametrize(
    ("models", "on", "problem"),
    [
        pytest.param([], ("overloaded",), "non-empty list of models", id="no-models"),
        pytest.param(HAIKU, ("overloaded",), "non-empty list of models", id="a-bare-name"),
        pytest.param([""], ("overloaded",), "non-empty name", id="an-empty-name"),
        pytest.param(
            [(object(), HAIKU)], ("overloaded",), "Provider or an SDK client", id="not-a-provider"
        ),
        pytest.param([(HAIKU,)], ("overloaded",), "model name or a", id="a-bad-pair"),
        pytest.param(
            [HAIKU],
            ("overloaded", "timeout"),
            "unknown condition 'timeout'",
            id="unknown-condition",
        ),
        pytest.param([HAIKU], "refusal", "non-empty list of conditions", id="a-bare-condition"),
        pytest.param([HAIKU], (), "non-empty list of conditions", id="no-conditions"),
    ],
)
def test_a_fallback_is_checked_when_made(models: Any, on: Any, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        Fallback(models, on=on)


async def test_a_sub_agent_falls_back_and_the_parent_counts_every_attempt(serve: Any) -> None:
    ran.clear()
    worker_server = serve(
        by_model(
            {
                SONNET: reply("Not that.", stop_reason="refusal", usage={"input_tokens": 40}),
                HAIKU: reply("w is 1", model=HAIKU, usage={"input_tokens": 60}),
            }
        )
    )
    worker = Agent(
        provider=AnthropicProvider(worker_server.client()),
        model=SONNET,
        name="worker",
        capabilities=[Fallback([HAIKU], on=("refusal",))],
    )
    boss_server = serve(
        [
            reply(tool_call("worker", {"prompt": "find w"}), usage={"input_tokens": 10}, model=""),
            reply("w is 1, says the worker", usage={"input_tokens": 20}, model=""),
        ]
    )
    boss = Agent(
        provider=AnthropicProvider(boss_server.client()), model=SONNET, tools=[worker.as_tool()]
    )
    result = await boss.run("go")
    assert result.text == "w is 1, says the worker"
    assert asked(worker_server) == [SONNET, HAIKU]
    assert result.models == [SONNET, SONNET]  # the boss's own rounds, named by its requests
    assert result.usage.input_tokens == 10 + 20 + 40 + 60 and result.usage.requests == 4
    valid(result)
