"""The loop: stop reasons, limits, history exactness, concurrency, logging."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

from agentloop import Agent, HistoryError, RunContext, ToolCallFailed, lint_history, raw_tools, tool
from agentloop.errors import OverloadedError
from agentloop.history import TRUNCATED_MESSAGE
from agentloop.messages import ImageBlock, TextBlock, parse_history
from agentloop.testing import RawResponse, ScriptedModel, ScriptedProvider, reply, text, tool_call


@tool
def echo(value: str) -> str:
    """Echo the value back."""
    return value


def lint_all(requests: list[dict[str, Any]]) -> None:
    for body in requests:
        lint_history(parse_history(body["messages"]), thinking=bool(body.get("thinking")))


@pytest.mark.both_formats
async def test_max_rounds_stops_with_every_tool_use_answered(http_agent: Any) -> None:
    def always_calls(body: dict[str, Any]) -> dict[str, Any]:
        return reply("again", tool_call("echo", {"value": "x"}))

    agent, server = http_agent(always_calls, tools=[echo], max_rounds=3)
    result = await agent.run("loop forever")
    assert result.stop_reason == "max_rounds"
    assert result.rounds == 3 and len(server.requests) == 3
    assert len(result.tool_calls) == 3
    assert result.messages[-1]["role"] == "user"
    lint_history(parse_history(result.messages))
    assert result.text == "again"


@pytest.mark.both_formats
async def test_messages_round_trip_through_json_and_continue(http_agent: Any) -> None:
    script = [reply(tool_call("echo", {"value": "a"})), reply("first"), reply("second")]
    # cache="off": what is sent is then the history byte for byte, without cache markers
    agent, server = http_agent(script, tools=[echo], cache="off")
    first = await agent.run("one")
    history = json.loads(json.dumps(first.messages))
    second = await agent.run("two", history=history)
    assert second.text == "second"
    sent = server.model.requests[-1]["messages"]
    assert sent[: len(history)] == history
    assert sent[-1] == {"role": "user", "content": "two"}
    assert second.messages[: len(history)] == history


async def test_prompt_after_tool_results_is_merged_into_one_user_turn() -> None:
    provider = ScriptedProvider([reply(tool_call("echo", {"value": "a"})), reply("done")])
    agent = Agent(provider=provider, tools=[echo], max_rounds=1)
    first = await agent.run("one")
    assert first.stop_reason == "max_rounds"
    provider2 = ScriptedProvider([reply("ok")])
    second = await Agent(provider=provider2, tools=[echo]).run("and now?", history=first.messages)
    last_user = provider2.requests[0]["messages"][-1]
    assert [b["type"] for b in last_user["content"]] == ["tool_result", "text"]
    assert second.text == "ok"


THINKING = {
    "type": "thinking",
    "thinking": "Let me think \u201cexactly\u201d \u2014 with unicode \U0001f600 and  spaces.",
    "signature": "EqQBCkYIBxgCKkA0c2lnbmF0dXJl+/==",
}
REDACTED = {
    "type": "redacted_thinking",
    "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP",
}


async def test_thinking_text_and_tool_use_go_back_byte_exact(http_agent: Any) -> None:
    first = reply(
        THINKING,
        REDACTED,
        text("Calling."),
        {**tool_call("echo", {"value": 'é \n"q"'}), "caller": {"type": "direct"}},
        {"type": "future_block", "payload": {"k": [1, None]}, "extra": None},
    )
    agent, server = http_agent(
        [first, reply("done")], tools=[echo], thinking={"type": "enabled", "budget_tokens": 1024}
    )
    result = await agent.run("think")
    assert server.requests[1]["messages"][1] == {"role": "assistant", "content": first["content"]}
    assert result.messages[1]["content"] == first["content"]
    assert json.dumps(server.requests[1]["messages"][1]["content"][0]) == json.dumps(THINKING)


async def test_thinking_loop_without_its_thinking_block_is_refused() -> None:
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [tool_call("echo", {"value": "a"}, id="toolu_1")]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}],
        },
    ]
    provider = ScriptedProvider([reply("never")])
    agent = Agent(
        provider=provider, tools=[echo], thinking={"type": "enabled", "budget_tokens": 1024}
    )
    with pytest.raises(HistoryError, match=r"messages\.1\.content\.0\.type: Expected `thinking`"):
        await agent.run(history=history)
    assert provider.requests == []


@pytest.mark.parametrize(
    "stop_reason",
    ["end_turn", "stop_sequence", "refusal", "model_context_window_exceeded", "a_future_reason"],
)
async def test_terminal_stop_reasons_end_the_run(stop_reason: str) -> None:
    calls = 0

    @tool
    def counted() -> str:
        nonlocal calls
        calls += 1
        return "ran"

    content = [text("partial")] + ([tool_call("counted")] if stop_reason != "end_turn" else [])
    provider = ScriptedProvider([reply(*content, stop_reason=stop_reason)])
    result = await Agent(provider=provider, tools=[counted]).run("go")
    assert result.stop_reason == stop_reason
    assert result.rounds == 1 and calls == 0
    lint_history(parse_history(result.messages))
    if stop_reason != "end_turn":
        (record,) = result.tool_calls
        assert record.is_error and stop_reason in record.output


@pytest.mark.both_formats
async def test_max_tokens_cut_off_tool_use_is_never_executed(http_agent: Any) -> None:
    ran: list[str] = []

    @tool
    def record(value: str) -> str:
        ran.append(value)
        return "ok"

    script = [
        reply(
            tool_call("record", {"value": "complete"}),
            tool_call("record", {"value": "trunc"}),
            stop_reason="max_tokens",
        ),
        reply("recovered"),
    ]
    agent, server = http_agent(script, tools=[record])
    result = await agent.run("go")
    assert ran == ["complete"]
    assert [(c.is_error, c.output) for c in result.tool_calls] == [
        (False, "ok"),
        (True, TRUNCATED_MESSAGE),
    ]
    assert result.text == "recovered" and result.stop_reason == "end_turn"
    lint_all(server.model.requests)


async def test_max_tokens_on_text_ends_the_run() -> None:
    provider = ScriptedProvider([reply("cut off mid", stop_reason="max_tokens")])
    result = await Agent(provider=provider).run("go")
    assert result.stop_reason == "max_tokens" and result.text == "cut off mid"


async def test_pause_turn_is_continued_and_merged(http_agent: Any) -> None:
    search = {
        "type": "server_tool_use",
        "id": "srvtoolu_01",
        "name": "web_search",
        "input": {"query": "x"},
    }
    found = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [
            {"type": "web_search_result", "url": "u", "title": "t", "encrypted_content": "e"}
        ],
    }
    script = [
        reply(text("Searching."), search, stop_reason="pause_turn"),
        reply(found, text("Found it."), stop_reason="end_turn"),
    ]
    agent, server = http_agent(script, cache="off")  # the turn goes back without markers
    result = await agent.run("search")
    assert result.stop_reason == "end_turn" and result.rounds == 2
    assert server.requests[1]["messages"][-1] == {
        "role": "assistant",
        "content": script[0]["content"],
    }
    assert len(result.messages) == 2
    assert result.messages[1]["content"] == script[0]["content"] + script[1]["content"]
    assert result.text == "Searching.Found it."


async def test_container_is_carried_to_the_next_request(http_agent: Any) -> None:
    first = {
        **reply(tool_call("echo", {"value": "a"})),
        "container": {"id": "container_1", "expires_at": "2026-01-01T00:00:00Z"},
    }
    agent, server = http_agent([first, reply("done")], tools=[echo])
    await agent.run("go")
    assert "container" not in server.requests[0]
    assert server.requests[1]["container"] == "container_1"


async def test_the_result_names_the_stop_sequence_the_model_stopped_at(http_agent: Any) -> None:
    stopped = {**reply("Counting: 1, 2, 3", stop_reason="stop_sequence"), "stop_sequence": "4"}
    agent, server = http_agent([stopped], stop_sequences=["4", "END"])
    result = await agent.run("count")
    assert server.requests[0]["stop_sequences"] == ["4", "END"]
    assert result.stop_reason == "stop_sequence" and result.stop_sequence == "4"
    assert result.text == "Counting: 1, 2, 3"


async def test_no_stop_sequence_unless_the_model_stopped_at_one(http_agent: Any) -> None:
    # Only a `stop_sequence` stop names one: a value beside another stop reason is ignored.
    ended = {**reply("done"), "stop_sequence": "stale"}
    agent, _ = http_agent([reply(tool_call("echo", {"value": "a"})), ended], tools=[echo])
    result = await agent.run("go")
    assert result.stop_reason == "end_turn" and result.stop_sequence is None


async def test_the_result_names_the_container_to_send_back(http_agent: Any) -> None:
    first = {
        **reply(tool_call("echo", {"value": "a"})),
        "container": {"id": "container_1", "expires_at": "2026-01-01T00:00:00Z"},
    }
    second = {
        **reply(tool_call("echo", {"value": "b"})),
        "container": {"id": "container_2", "expires_at": "2026-01-01T00:00:00Z"},
    }
    agent, server = http_agent([first, second, reply("done")], tools=[echo])
    result = await agent.run("go")
    # The last response did not name one: the container in use is still container_2.
    assert server.requests[2]["container"] == "container_2"
    assert result.container == "container_2"
    assert (await http_agent([reply("plain")])[0].run("hi")).container is None


async def test_hundred_concurrent_runs_share_one_agent(serve: Any) -> None:
    @tool
    async def whoami(ctx: RunContext[str]) -> str:
        await anyio.sleep(0.01)
        return f"{ctx.deps}:{ctx.round}"

    def script(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]["content"]
        if last[0]["type"] != "tool_result":  # the prompt (a text block, to carry a marker)
            return reply(tool_call("whoami"), tool_call("whoami"))
        return reply("answer " + last[0]["content"])

    server = serve(script)
    agent = Agent(client=server.client(max_retries=0), tools=[whoami])
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        results[i] = await agent.run(f"run {i}", deps=f"user{i}")

    async with anyio.create_task_group() as group:
        for i in range(100):
            group.start_soon(one, i)
    assert len({r.run_id for r in results.values()}) == 100
    for i, result in results.items():
        assert result.text == f"answer user{i}:1"
        assert result.messages[0] == {"role": "user", "content": f"run {i}"}
        assert [c.output for c in result.tool_calls] == [f"user{i}:1"] * 2
        lint_history(parse_history(result.messages))
    assert len(server.requests) == 200
    lint_all(server.requests)


async def test_on_tool_error_stop_raises_with_a_complete_history() -> None:
    @tool
    def fails() -> str:
        raise RuntimeError("disk on fire")

    provider = ScriptedProvider(
        [reply(tool_call("fails"), tool_call("echo", {"value": "ok"})), reply("never")]
    )
    agent = Agent(provider=provider, tools=[fails, echo], on_tool_error="stop")
    with pytest.raises(ToolCallFailed, match="disk on fire") as info:
        await agent.run("go")
    partial = info.value.result
    assert partial is not None and partial.stop_reason == "tool_error"
    lint_history(parse_history(partial.messages))
    assert [c.is_error for c in partial.tool_calls] == [True, False]
    assert len(provider.requests) == 1


@pytest.mark.both_formats
async def test_provider_error_carries_the_partial_result(http_agent: Any) -> None:
    overloaded = RawResponse(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    agent, _ = http_agent([reply(tool_call("echo", {"value": "a"})), overloaded], tools=[echo])
    with pytest.raises(OverloadedError) as info:
        await agent.run("go")
    partial = info.value.result
    assert partial is not None and partial.rounds == 2 and partial.usage.requests == 1
    assert partial.tool_calls[0].output == "a"
    lint_history(parse_history(partial.messages))


async def test_invalid_history_is_refused_before_any_request(serve: Any) -> None:
    server = serve([reply("never")])
    agent = Agent(client=server.client())
    bad = [
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}],
        }
    ]
    with pytest.raises(HistoryError, match="unexpected `tool_use_id`"):
        await agent.run(history=bad)
    assert server.requests == []


async def test_usage_is_summed_over_rounds() -> None:
    usage = {
        "input_tokens": 100,
        "output_tokens": 7,
        "cache_read_input_tokens": 40,
        "cache_creation_input_tokens": 3,
    }
    provider = ScriptedProvider(
        [reply(tool_call("echo", {"value": "a"}), usage=usage), reply("done", usage=usage)]
    )
    result = await Agent(provider=provider, tools=[echo]).run("go")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (200, 14)
    assert (result.usage.cache_read_input_tokens, result.usage.cache_creation_input_tokens) == (
        80,
        6,
    )
    assert result.usage.requests == 2


class Forecast(BaseModel):
    city: str
    high: int


@tool
def outputs(kind: str) -> Any:
    """Return values of many shapes."""
    return {
        "dict": {"a": 1, "b": [1, 2]},
        "list": [1, "two"],
        "model": Forecast(city="Paris", high=21),
        "none": None,
        "blocks": [
            TextBlock(text="see"),
            ImageBlock(
                source={"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
            ),
        ],
    }[kind]


@pytest.mark.parametrize(
    ("kind", "content"),
    [
        pytest.param("dict", '{"a":1,"b":[1,2]}', id="dict"),
        pytest.param("list", '[1,"two"]', id="list"),
        pytest.param("model", '{"city":"Paris","high":21}', id="model"),
        pytest.param("none", None, id="none"),
        pytest.param(
            "blocks",
            [
                {"type": "text", "text": "see"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
            ],
            id="blocks",
        ),
    ],
)
async def test_tool_outputs_reach_the_model_in_wire_form(
    http_agent: Any, kind: str, content: Any
) -> None:
    agent, server = http_agent(
        [reply(tool_call("outputs", {"kind": kind})), reply("ok")], tools=[outputs]
    )
    await agent.run("go")
    block = server.requests[1]["messages"][-1]["content"][0]
    assert block.get("content") == content
    assert "is_error" not in block


async def test_raw_definitions_with_an_executor() -> None:
    definitions = [
        {
            "name": "lookup",
            "description": "Look a key up.",
            "input_schema": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
        {
            "name": "alookup",
            "description": "Async lookup.",
            "input_schema": {"type": "object", "properties": {}},
            "cache_control": {"type": "ephemeral"},
        },
    ]

    def executor(name: str, args: dict[str, Any]) -> tuple[bool, str]:
        if args.get("key") == "missing":
            return False, "no such key"
        return True, f"{name}={args.get('key')}"

    async def aexecutor(name: str, args: dict[str, Any]) -> tuple[bool, str]:
        return True, "async " + name

    tools = [raw_tools(definitions[:1], executor)[0], raw_tools(definitions[1:], aexecutor)[0]]
    provider = ScriptedProvider(
        [
            reply(
                tool_call("lookup", {"key": "k"}),
                tool_call("lookup", {"key": "missing"}),
                tool_call("alookup"),
            ),
            reply("ok"),
        ]
    )
    result = await Agent(provider=provider, tools=tools).run("go")
    assert [(c.output, c.is_error) for c in result.tool_calls] == [
        ("lookup=k", False),
        ("no such key", True),
        ("async alookup", False),
    ]
    assert provider.requests[0]["tools"] == definitions


async def test_logs_bind_run_round_and_tool_use_id() -> None:
    call = tool_call("echo", {"value": "a"})
    provider = ScriptedProvider([reply(call), reply("done")])
    with capture_logs() as logs:
        result = await Agent(provider=provider, tools=[echo]).run("go")
    events = [e["event"] for e in logs]
    assert events == ["run.start", "model.request", "tool.call", "model.request", "run.end"]
    assert all(e["run_id"] == result.run_id for e in logs)
    (tool_event,) = [e for e in logs if e["event"] == "tool.call"]
    assert tool_event["tool_use_id"] == call["id"] and tool_event["round"] == 1
    assert tool_event["is_error"] is False and tool_event["name"] == "echo"
    requests = [e for e in logs if e["event"] == "model.request"]
    assert [e["round"] for e in requests] == [1, 2]
    assert requests[0]["stop_reason"] == "tool_use" and "latency" in requests[0]


def test_run_sync_for_scripts() -> None:
    result = Agent(provider=ScriptedProvider([reply("hello")])).run_sync("hi")
    assert result.text == "hello" and result.stop_reason == "end_turn"


def test_run_sync_takes_every_argument_of_run() -> None:
    import inspect

    assert inspect.signature(Agent.run_sync) == inspect.signature(Agent.run).replace(
        return_annotation=inspect.signature(Agent.run_sync).return_annotation
    )
    lookup = {"name": "lookup", "input_schema": {"type": "object", "properties": {}}}
    provider = ScriptedProvider([reply(tool_call("lookup"))])
    result = Agent(provider=provider).run_sync("hi", external_tools=[lookup])
    assert result.stop_reason == "tool_use" and result.pending[0]["name"] == "lookup"


async def test_history_check_off_sends_what_the_linter_refuses() -> None:
    # An assistant message first: the linter refuses it, a lenient model may not.
    history = [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(HistoryError, match="first message"):
        await Agent(provider=ScriptedProvider([reply("never")])).run(history=history)
    provider = ScriptedProvider(ScriptedModel([reply("fine")], lint=False))
    result = await Agent(provider=provider, history_check="off").run(history=history)
    assert result.text == "fine"
    assert provider.requests[0]["messages"][0]["role"] == "assistant"


async def test_tools_see_run_context_in_their_own_logs() -> None:
    import structlog

    @tool
    async def logs() -> str:
        structlog.get_logger("my.tool").info("inside")
        return "ok"

    call = tool_call("logs")
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as events:
        result = await Agent(
            provider=ScriptedProvider([reply(call), reply("done")]), tools=[logs]
        ).run("go")
    (inside,) = [e for e in events if e["event"] == "inside"]
    assert (inside["run_id"], inside["round"], inside["tool_use_id"]) == (
        result.run_id,
        1,
        call["id"],
    )


async def test_a_refused_history_is_logged_and_carries_the_partial_result() -> None:
    bad = [
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}],
        }
    ]
    with capture_logs() as events, pytest.raises(HistoryError) as info:
        await Agent(provider=ScriptedProvider([reply("never")])).run(history=bad)
    assert [e["event"] for e in events] == ["run.start", "run.error"]
    assert info.value.result is not None and info.value.result.stop_reason == "error"
