"""OpenAIChatProvider: conversion both ways, responses, errors, and each server quirk.

The real `openai` SDK talks HTTP to `ChatCompletionsServer`, which checks every request
against the Chat Completions rules (and the quirk it is told to act out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import anyio
import openai
import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

from agentloop import Agent, AnthropicProvider, OpenAIChatProvider, lint_history, raw_tools, tool
from agentloop.approval import Approve
from agentloop.durable.records import result_from_json, result_to_json
from agentloop.errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    HistoryError,
    InvalidResponseError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from agentloop.events import RequestStarted
from agentloop.history import TRUNCATED_MESSAGE
from agentloop.limits import UsageLimits
from agentloop.messages import Message, parse_history
from agentloop.pricing import cost_of
from agentloop.providers.base import BlockStart, BlockStop, MessageStart, ModelRequest
from agentloop.providers.openai import (
    PRESETS,
    ChatCompat,
    ChatStreamAssembler,
    parse_completion,
    preset,
    provider_from_options,
    to_chat_messages,
    wire_id,
)
from agentloop.providers.openai.response import UNCOUNTED
from agentloop.testing import (
    ChatCompletionsServer,
    Fault,
    Paced,
    RawResponse,
    reply,
    schema_reply,
    text,
    tool_call,
)
from agentloop.testing.chat_request import template_problem
from agentloop.testing.chat_server import check_chat_request

ran: list[Any] = []


@tool
def echo(value: str) -> str:
    """Echo the value back."""
    ran.append(value)
    return value


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def history(*messages: dict[str, Any]) -> list[Message]:
    return parse_history(list(messages))


def use(call_id: str, value: str = "a") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "echo", "input": {"value": value}}


def result(call_id: str, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


# --------------------------------------------------------------------------- history -> chat


def test_calls_and_results_follow_the_format() -> None:
    messages = history(
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [text("Calling."), use("c1", "x"), use("c2", "y")]},
        {
            "role": "user",
            "content": [
                result("c2", "two"),
                result("c1", "boom", is_error=True),
                text("and now?"),
            ],
        },
    )
    chat = to_chat_messages(messages, system="be brief")
    assert chat == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"value": "x"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"value": "y"}'},
                },
            ],
        },
        # In call order (not the order the results were written in), before the text.
        {"role": "tool", "tool_call_id": "c1", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "user", "content": "and now?"},
    ]
    assert check_chat_request({"model": "m", "messages": chat}) is None


def test_images_of_a_tool_result_move_to_a_user_message_after_the_tool_messages() -> None:
    image = {"type": "image", "source": PNG}
    messages = history(
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [use("c1")]},
        {"role": "user", "content": [result("c1", [text("a chart"), image])]},
    )
    chat = to_chat_messages(messages)
    tool_message, user = chat[2], chat[3]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith("a chart")
    assert "follow in the next message" in tool_message["content"]
    assert user["role"] == "user"
    assert user["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
    }
    assert check_chat_request({"model": "m", "messages": chat}) is None


def test_another_vendors_blocks_are_left_out() -> None:
    signed = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    redacted = {"type": "redacted_thinking", "data": "xyz"}
    server_use = {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}
    found = {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []}
    unsigned = {"type": "thinking", "thinking": "local reasoning"}
    messages = history(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [signed, redacted, server_use, found, text("A.")]},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": [unsigned, text("B.")]},
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": [unsigned]},  # nothing left to send
        {"role": "user", "content": "q4"},
    )
    chat = to_chat_messages(messages)
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant", "user", "user"]
    assert chat[1] == {"role": "assistant", "content": "A."}
    assert chat[3] == {"role": "assistant", "content": "B."}
    sent = to_chat_messages(messages, compat=ChatCompat(send_reasoning=True))
    assert sent[3]["reasoning_content"] == "local reasoning"


def test_consecutive_assistant_messages_become_one() -> None:
    messages = history(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [text("Part one. ")]},
        {"role": "assistant", "content": [text("Part two."), use("c1")]},
        {"role": "user", "content": [result("c1")]},
    )
    chat = to_chat_messages(messages)
    assert chat[1]["content"] == "Part one. Part two." and len(chat[1]["tool_calls"]) == 1
    assert check_chat_request({"model": "m", "messages": chat}) is None


def test_content_is_a_string_a_chat_template_can_render() -> None:
    image = {"type": "image", "source": PNG}
    messages = history(
        {"role": "user", "content": [text("first"), text("second")]},
        {"role": "assistant", "content": [use("c1")]},
        {"role": "assistant", "content": [use("c2")]},  # a paused turn and its continuation
        {"role": "user", "content": [result("c1"), result("c2"), text("and"), text("then?")]},
        {"role": "assistant", "content": [text("Look:")]},
        {"role": "user", "content": [text("this"), image]},
    )
    chat = to_chat_messages(messages)
    assert chat[0] == {"role": "user", "content": "first\n\nsecond"}
    assert chat[1]["content"] == "" and len(chat[1]["tool_calls"]) == 2
    assert chat[4] == {"role": "user", "content": "and\n\nthen?"}
    assert [p["type"] for p in chat[6]["content"]] == ["text", "image_url"]  # parts: an image
    body = {"model": "m", "messages": chat}
    assert check_chat_request(body) is None and template_problem(body) is None


def test_system_blocks_are_one_message_each_unless_the_server_takes_one() -> None:
    system = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    messages = history({"role": "user", "content": "q"})
    assert [m["content"] for m in to_chat_messages(messages, system=system)[:2]] == ["one", "two"]
    single = to_chat_messages(messages, system=system, compat="llamacpp")
    assert single[0] == {"role": "system", "content": "one\n\ntwo"} and len(single) == 2


def test_a_block_the_format_cannot_carry_is_a_history_error() -> None:
    document = {"type": "document", "source": {"type": "url", "url": "https://x/doc.pdf"}}
    messages = history({"role": "user", "content": [text("read"), document]})
    with pytest.raises(HistoryError, match=r"content\.1: a 'document' block with a 'url' source"):
        to_chat_messages(messages)


def test_short_ids_map_the_same_way_for_the_call_and_its_result() -> None:
    compat = ChatCompat(tool_call_id_length=9)
    messages = history(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [use("toolu_01abcdefghijklmnop")]},
        {"role": "user", "content": [result("toolu_01abcdefghijklmnop")]},
    )
    chat = to_chat_messages(messages, compat=compat)
    short = chat[1]["tool_calls"][0]["id"]
    assert len(short) == 9 and short.isalnum() and chat[2]["tool_call_id"] == short
    assert wire_id("abcDEF123", compat) == "abcDEF123"  # already of the right shape
    assert check_chat_request({"model": "m", "messages": chat}, id_length=9) is None


def test_each_message_is_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentloop.providers.openai.request as module

    converted: list[str] = []
    original = module._assistant

    def counting(message: Message, compat: ChatCompat) -> Any:
        converted.append(message.text)
        return original(message, compat)

    monkeypatch.setattr(module, "_assistant", counting)
    module._CONVERTERS.clear()
    messages = history(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [text("answer one")]},
        {"role": "user", "content": "q2"},
    )
    for _ in range(3):
        to_chat_messages(messages)
    assert converted == ["answer one"]
    to_chat_messages(messages, compat="llamacpp")  # another format: its own conversion
    assert converted == ["answer one", "answer one"]
    module._CONVERTERS.clear()


# --------------------------------------------------------------------------- chat -> blocks


def completion(
    message: dict[str, Any], finish: str | None = "stop", usage: Any = None
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        "usage": usage,
    }


def call(
    name: str = "echo", arguments: Any = '{"value": "a"}', call_id: Any = "call_1"
) -> dict[str, Any]:
    value: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        value["id"] = call_id
    return value


@pytest.mark.parametrize(
    ("finish", "calls", "expected"),
    [
        pytest.param("stop", 1, "tool_use", id="stop-with-calls"),
        pytest.param("tool_calls", 1, "tool_use", id="tool_calls"),
        pytest.param("tool_calls", 0, "end_turn", id="tool_calls-without-calls"),
        pytest.param("stop", 0, "end_turn", id="stop"),
        pytest.param(None, 0, "end_turn", id="none"),
        pytest.param("length", 1, "max_tokens", id="length-with-calls"),
        pytest.param("length", 0, "max_tokens", id="length"),
        pytest.param("content_filter", 0, "refusal", id="content_filter"),
        pytest.param("a_future_reason", 0, "a_future_reason", id="future"),
    ],
)
def test_finish_reason_is_not_trusted_about_tool_calls(
    finish: str | None, calls: int, expected: str
) -> None:
    message = {"content": "x", "tool_calls": [call()] * calls}
    assert parse_completion(completion(message, finish)).stop_reason == expected


def test_arguments_ids_reasoning_and_usage() -> None:
    body = completion(
        {
            "content": "Let me see.",
            "reasoning_content": "The user wants...",
            "tool_calls": [
                call(arguments='{"value": "ok"}', call_id="call_a"),
                call(arguments='{"value": ', call_id=""),  # bad JSON, empty id
                call(arguments="", call_id=None),  # no arguments, no id
                call(arguments={"value": "obj"}, call_id="call_a"),  # object, repeated id
                call(arguments='{"value": "taken"}', call_id="toolu_old"),  # id of the history
            ],
        },
        "tool_calls",
        usage={
            "prompt_tokens": 100,
            "completion_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 60},
        },
    )
    response = parse_completion(body, taken={"toolu_old"})
    thinking, said, *uses = response.content
    assert thinking.type == "thinking" and thinking.thinking == "The user wants..."  # type: ignore[union-attr]
    assert thinking.signature is None  # type: ignore[union-attr]
    assert said.type == "text"
    ids = [u.id for u in uses]  # type: ignore[union-attr]
    assert ids[0] == "call_a" and len(set(ids)) == 5 and "toolu_old" not in ids
    assert [u.input for u in uses] == [
        {"value": "ok"},
        {},
        {},
        {"value": "obj"},
        {"value": "taken"},
    ]  # type: ignore[union-attr]
    assert list(response.call_errors) == [ids[1]]
    assert "not valid JSON" in response.call_errors[ids[1]]
    usage = response.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (40, 60, 9)
    assert usage.total_tokens == 109 and usage.requests == 1


def test_reasoning_field_is_read_too() -> None:
    response = parse_completion(completion({"content": "hi", "reasoning": "thought"}))
    assert [b.type for b in response.content] == ["thinking", "text"]


def test_an_error_body_or_a_non_completion_is_an_error() -> None:
    with pytest.raises(RateLimitError):
        parse_completion({"error": {"type": "rate_limit_error", "message": "slow down"}})
    with pytest.raises(InvalidResponseError, match="not a chat completion"):
        parse_completion({"object": "list", "data": []})


# --------------------------------------------------------------------------- over HTTP


def agent_over(server: ChatCompletionsServer, stream: bool, **options: Any) -> Agent:
    compat = options.pop("compat", None)
    provider = OpenAIChatProvider(server.client(), compat=compat, stream=stream)
    return Agent(model="qwen3:8b", provider=provider, tools=[echo], **options)


STREAMED = [pytest.param(False, id="json"), pytest.param(True, id="sse")]


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    data = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data)}\n\n"


def sse(*chunks: str) -> RawResponse:
    return RawResponse(sse="".join(chunks) + "data: [DONE]\n\n")


async def test_a_streams_start_carries_the_headers_before_the_response_is_whole(
    serve_chat: Any,
) -> None:
    body = chunk({"content": "Hi"}) + chunk({}, "stop") + "data: [DONE]\n\n"
    server = serve_chat([RawResponse(sse=body, headers={"x-ratelimit-remaining-requests": "9"})])
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    provider = OpenAIChatProvider(server.client())
    request = ModelRequest(model="qwen3:8b", max_tokens=8, messages=[Message.user("hi")])
    response = await provider.stream(request, record)
    start, *blocks = events
    assert isinstance(start, MessageStart) and start.message["id"] == "c"
    assert start.headers["x-ratelimit-remaining-requests"] == "9"
    assert start.headers == response.headers and response.text == "Hi"
    assert not any(isinstance(e, MessageStart) for e in blocks)


@pytest.mark.parametrize("stream", STREAMED)
async def test_arguments_that_are_not_json_are_answered_without_running(
    serve_chat: Any, stream: bool
) -> None:
    def executor(name: str, args: dict[str, Any]) -> str:
        ran.append(("raw", args))
        return "raw ran"

    lookup = raw_tools([{"name": "lookup", "input_schema": {"type": "object"}}], executor)[0]
    bad = '{"value": "x'
    if stream:
        first = sse(
            chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "c1", "function": {"name": "echo", "arguments": bad}}
                    ]
                }
            ),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "c2",
                            "function": {"name": "lookup", "arguments": "{oops"},
                        }
                    ]
                }
            ),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 2,
                            "id": "c3",
                            "function": {"name": "echo", "arguments": '{"value": "fine"}'},
                        }
                    ]
                }
            ),
            chunk({}, "tool_calls"),
        )
    else:
        first = RawResponse(
            json=completion(
                {
                    "content": None,
                    "tool_calls": [
                        call("echo", bad, "c1"),
                        call("lookup", "{oops", "c2"),
                        call("echo", '{"value": "fine"}', "c3"),
                    ],
                },
                "tool_calls",
            )
        )
    server = serve_chat([first, reply("done")])
    provider = OpenAIChatProvider(server.client(), stream=stream)
    result = await Agent(provider=provider, tools=[echo, lookup]).run("go")
    assert ran == ["fine"]
    records = {c.tool_use_id: c for c in result.tool_calls}
    assert records["c1"].is_error and "not valid JSON" in records["c1"].output
    assert records["c2"].is_error and "not valid JSON" in records["c2"].output
    assert not records["c3"].is_error
    sent = server.requests[1]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == "{}"  # stored as an empty object
    assert sent[2]["content"].startswith("Error: Not run: the arguments of this call were not")
    lint_history(parse_history(result.messages))


async def test_a_call_cut_off_by_length_is_never_run(serve_chat: Any) -> None:
    cut = sse(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c1",
                        "function": {"name": "echo", "arguments": '{"value": "whole"}'},
                    }
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "c2",
                        "function": {"name": "echo", "arguments": '{"value": "cu'},
                    }
                ]
            }
        ),
        chunk({}, "length"),
    )
    server = serve_chat([cut, reply("recovered")])
    agent = agent_over(server, True)
    async with agent.run_stream("go") as stream:
        async for _ in stream:
            pass
    result = stream.result
    assert result is not None and ran == ["whole"]
    assert [(c.is_error, c.output) for c in result.tool_calls] == [
        (False, "whole"),
        (True, TRUNCATED_MESSAGE),
    ]


@pytest.mark.parametrize("stream", STREAMED)
async def test_stop_with_tool_calls_is_a_tool_turn(serve_chat: Any, stream: bool) -> None:
    server = serve_chat(
        [reply(tool_call("echo", {"value": "a"})), reply("done")], finish_reason_with_tools="stop"
    )
    result = await agent_over(server, stream).run("go")
    assert ran == ["a"] and result.text == "done" and result.rounds == 2


@pytest.mark.parametrize("stream", STREAMED)
async def test_request_fields_map_to_the_format(serve_chat: Any, stream: bool) -> None:
    server = serve_chat([reply("ok")])
    agent = agent_over(
        server,
        stream,
        max_tokens=77,
        stop_sequences=["END"],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "u"},
        params={
            "temperature": 0.2,
            "extra_headers": {"x-trace": "t1"},
            "extra_body": {"top_k": 20},
            "extra_query": {"api-version": "1"},
        },
    )
    await agent.run("go")
    (seen,) = server.recorded
    body = seen.body
    assert body["model"] == "qwen3:8b" and body["max_tokens"] == 77
    assert body["stop"] == ["END"] and body["tool_choice"] == "auto"
    assert body["parallel_tool_calls"] is False and body["temperature"] == 0.2
    assert body["top_k"] == 20 and "thinking" not in body and "metadata" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "parameters": echo.definition.input_schema,
                "description": "Echo the value back.",
            },
        }
    ]
    assert seen.headers["x-trace"] == "t1" and seen.query == {"api-version": "1"}
    assert seen.headers["authorization"] == "Bearer sk-local-test"
    assert ("stream_options" in body) is stream and body.get("stream", False) is stream


@pytest.mark.parametrize("stream", STREAMED)
async def test_params_win_and_their_tools_are_added(serve_chat: Any, stream: bool) -> None:
    server = serve_chat([reply("ok")])
    extra = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    agent = agent_over(
        server, stream, max_tokens=100, params={"max_tokens": 50, "tools": [extra], "seed": 7}
    )
    response = await agent.provider.complete(  # type: ignore[attr-defined]
        ModelRequest(
            model="qwen3:8b",
            max_tokens=100,
            messages=[Message.user("go")],
            tools=[echo.definition],
            params=agent.config.request_params,
        )
    )
    assert response.text == "ok" and response.headers["content-type"].startswith(
        "text/event-stream" if stream else "application/json"
    )
    body = server.recorded[0].body
    assert body["max_tokens"] == 50 and body["seed"] == 7
    assert [t["function"]["name"] for t in body["tools"]] == ["echo", "lookup"]


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ({"type": "tool", "name": "echo"}, {"type": "function", "function": {"name": "echo"}}),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
    ],
)
async def test_tool_choice(serve_chat: Any, choice: dict[str, Any], sent: Any) -> None:
    server = serve_chat([reply("ok")])
    await agent_over(server, False, tool_choice=choice).run("go")
    assert server.requests[0]["tool_choice"] == sent


async def test_usage_is_summed_and_streamed_usage_counts(serve_chat: Any) -> None:
    usage = {"input_tokens": 30, "output_tokens": 4, "cache_read_input_tokens": 10}
    script = [reply(tool_call("echo", {"value": "a"}), usage=usage), reply("done", usage=usage)]
    for stream in (False, True):
        result = await agent_over(serve_chat(list(script)), stream).run("go")
        assert (result.usage.input_tokens, result.usage.cache_read_input_tokens) == (60, 20)
        assert result.usage.output_tokens == 8 and result.usage.requests == 2


@pytest.mark.parametrize("stream", STREAMED)
async def test_a_tool_loop_gets_past_its_first_round_on_a_strict_server(
    serve_chat: Any, stream: bool
) -> None:
    server = serve_chat([reply(tool_call("echo", {"value": "a"})), reply("done")], strict=True)
    result = await agent_over(server, stream).run("go")
    assert result.text == "done" and ran == ["a"]
    sent = server.requests[1]["messages"][1]
    assert sent["role"] == "assistant" and sent["content"] == "" and sent["tool_calls"]


async def test_after_a_cancelled_stream_the_next_prompt_is_sent_as_text(serve_chat: Any) -> None:
    def answer(body: dict[str, Any]) -> Any:  # the first request is held until cancelled
        second = "second" in json.dumps(body["messages"])
        return reply("ok") if second else Paced(reply("never"), first_delay=30)

    server = serve_chat(answer, strict=True)
    agent = agent_over(server, True)
    async with agent.run_stream("first") as stream:
        async for event in stream:
            if isinstance(event, RequestStarted):
                stream.cancel()
    cancelled = stream.result
    assert cancelled is not None and cancelled.stop_reason == "cancelled"
    result = await agent.run("second", history=cancelled.messages)
    assert result.text == "ok"
    assert result.messages[0]["content"] == [text("first"), text("second")]
    assert server.requests[-1]["messages"] == [{"role": "user", "content": "first\n\nsecond"}]


EMPTY_ANSWERS = [
    pytest.param(reply(), id="nothing"),  # content null in JSON, "" in the stream
    pytest.param(reply("\n "), id="whitespace"),
]


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize(
    "answer",
    [
        *EMPTY_ANSWERS,
        pytest.param(
            reply({"type": "thinking", "thinking": "hm", "signature": "s"}), id="reasoning"
        ),
    ],
)
async def test_an_empty_answer_has_no_text_block_and_goes_back_as_nothing(
    serve_chat: Any, stream: bool, answer: dict[str, Any]
) -> None:
    server = serve_chat([answer, reply("ok")], strict=True)
    agent = agent_over(server, stream)
    result = await agent.run("hi")
    assert result.stop_reason == "end_turn" and result.text == ""
    # Nothing of an empty answer is kept (the API refuses an empty assistant message);
    # reasoning is, as a thinking block.
    last = result.messages[-1]
    assert last["role"] == "user" or [b["type"] for b in last["content"]] == ["thinking"]
    # The Chat Completions side of sending it again: what a strict server takes.
    messages = parse_history([*result.messages, {"role": "user", "content": "again"}])
    request = ModelRequest(model="qwen3:8b", max_tokens=10, messages=messages)
    assert (await agent.provider.complete(request)).text == "ok"  # type: ignore[attr-defined]
    assert server.requests[-1]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "again"},
    ]


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("answer", EMPTY_ANSWERS)
async def test_a_history_with_an_empty_answer_runs_again(
    serve_chat: Any, stream: bool, answer: dict[str, Any]
) -> None:
    server = serve_chat([answer, reply("ok")], strict=True)
    agent = agent_over(server, stream)
    first = await agent.run("hi")
    result = await agent.run("again", history=first.messages)
    assert result.text == "ok"


async def test_agent_with_an_openai_client_uses_the_chat_provider(serve_chat: Any) -> None:
    server = serve_chat([reply("hi")])
    agent = Agent(model="m", client=server.client())
    assert isinstance(agent.provider, OpenAIChatProvider)
    assert (await agent.run("hello")).text == "hi"


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize(
    ("fault", "expected", "words"),
    [
        pytest.param(
            Fault.http_error(401, "invalid_request_error", "Incorrect API key provided"),
            AuthenticationError,
            "Incorrect API key",
            id="401",
        ),
        pytest.param(
            Fault.http_error(
                404, "not_found_error", 'model "qwen3:8b" not found, try pulling it first'
            ),
            BadRequestError,
            "is the model 'qwen3:8b' served at http://127.0.0.1",
            id="404-model",
        ),
        pytest.param(Fault.rate_limited(retry_after=0.1), RateLimitError, "429", id="429"),
        pytest.param(Fault.server_error(502), ServerError, "502", id="502"),
        pytest.param(Fault.malformed_json(), InvalidResponseError, "JSON", id="malformed"),
        pytest.param(Fault.dropped(), APIConnectionError, "could not reach", id="dropped"),
    ],
)
async def test_api_failures_are_typed(
    serve_chat: Any, fault: Fault, expected: type[Exception], words: str, stream: bool
) -> None:
    server = serve_chat([fault])
    with pytest.raises(expected, match=words.replace("(", r"\(")) as info:
        await agent_over(server, stream).run("go")
    assert info.value.result is not None and info.value.result.stop_reason == "error"  # type: ignore[attr-defined]


@pytest.mark.parametrize("stream", STREAMED)
async def test_a_lone_surrogate_the_sdk_cannot_encode_is_sent_escaped(
    serve_chat: Any, stream: bool
) -> None:
    prompt = "name: \udce9"  # what os.fsdecode gives for a name that is not UTF-8
    plain, escaped = serve_chat([reply("ok")]), serve_chat([reply("ok")])
    with pytest.raises(UnicodeEncodeError):
        await plain.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}]
        )
    params = {"temperature": 0.5, "extra_headers": {"x-trace": "t"}, "extra_query": {"v": "1"}}
    for server, said in ((plain, "name: x"), (escaped, prompt)):
        agent = agent_over(server, stream, params=params)
        assert (await agent.run(said)).text == "ok"
    (sent,), (expected,) = escaped.recorded, plain.recorded
    assert sent.body["messages"][0]["content"] == prompt
    assert sent.body == {**expected.body, "messages": sent.body["messages"]}
    assert sent.query == expected.query == {"v": "1"}
    for name in ("x-trace", "authorization", "x-stainless-timeout"):
        assert sent.headers.get(name) == expected.headers.get(name)


@pytest.mark.parametrize("stream", STREAMED)
async def test_an_error_answer_carries_its_headers(serve_chat: Any, stream: bool) -> None:
    server = serve_chat([Fault.rate_limited(retry_after=7)])
    with pytest.raises(RateLimitError) as info:
        await agent_over(server, stream).run("go")
    assert info.value.headers["retry-after"] == "7"


async def test_retry_after_is_honoured(serve_chat: Any) -> None:
    server = serve_chat([Fault.rate_limited(retry_after=0.3), reply("ok")])
    provider = OpenAIChatProvider(server.client(max_retries=1))
    result = await Agent(provider=provider).run("go")
    assert result.text == "ok"
    first, second = server.request_times
    assert second - first >= 0.25


async def test_an_error_inside_the_stream_and_a_cut_stream(serve_chat: Any) -> None:
    server = serve_chat(
        [Fault.stream_error(reply("partial", "more")), Fault.stream_ends_early(reply("a", "b"))]
    )
    agent = agent_over(server, True)
    with pytest.raises(OverloadedError):
        await agent.run("go")
    with pytest.raises(APIConnectionError, match="broke mid-response"):
        await agent.run("go")
    clean = serve_chat([Fault.stream_ends_early(reply("a", "b"), clean_end=True)])
    with pytest.raises(APIConnectionError, match="before its finish_reason"):
        await agent_over(clean, True).run("go")


async def test_connection_refused_names_the_url_and_the_server() -> None:
    with anyio.fail_after(10):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        await listener.aclose()  # nothing listens there now
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    agent = Agent(model="qwen3:8b", provider=OpenAIChatProvider(client, compat="ollama"))
    with pytest.raises(APIConnectionError) as info:
        await agent.run("hi")
    message = str(info.value)
    assert f"http://127.0.0.1:{port}/v1" in message and "is Ollama running?" in message
    await client.close()


def test_without_the_openai_package_importing_works_and_asking_is_one_clear_error() -> None:
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "import agentloop\n"
        "from agentloop import OpenAIChatProvider, ConfigurationError\n"
        "try:\n"
        "    OpenAIChatProvider()\n"
        "except ConfigurationError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    assert "refused: OpenAIChatProvider needs the `openai` package" in done.stdout
    assert "agentloop-runner[openai]" in done.stdout


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"must be an openai\.AsyncOpenAI"):
        OpenAIChatProvider(object())  # type: ignore[arg-type]
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")
    with pytest.raises(ConfigurationError, match="unknown compat preset 'olama'"):
        OpenAIChatProvider(client, compat="olama")


def test_provider_from_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    local = provider_from_options("http://localhost:11434/v1", None, "ollama")
    assert local.base_url == "http://localhost:11434/v1" and local.compat == PRESETS["ollama"]
    from agentloop.errors import MissingAPIKeyError

    with pytest.raises(MissingAPIKeyError):
        provider_from_options(None, None, None)
    remote = provider_from_options(None, "sk-x", None)
    assert (
        remote.compat == PRESETS["openai"]
        and remote.compat.max_tokens_field == "max_completion_tokens"
    )
    assert preset("vllm", tool_call_id_length=9) == replace(PRESETS["vllm"], tool_call_id_length=9)


# --------------------------------------------------------------------------- quirks, flag by flag


@pytest.mark.parametrize("ids", ["first", "every", "none"])
@pytest.mark.parametrize("whole", [False, True])
async def test_streamed_calls_arrive_however_the_server_numbers_them(
    serve_chat: Any, ids: str, whole: bool
) -> None:
    script = [reply(*[tool_call("echo", {"value": v}) for v in "abc"]), reply("done")]
    server = serve_chat(script, whole_tool_calls=whole, ids=ids)
    compat = "ollama" if whole else None
    result = await agent_over(server, True, compat=compat).run("go")
    assert sorted(ran) == ["a", "b", "c"] and result.text == "done"
    ids_used = [c.tool_use_id for c in result.tool_calls]
    assert len(set(ids_used)) == 3
    if ids != "none":
        assert ids_used == [b["id"] for b in script[0]["content"]]


async def test_whole_tool_calls_close_each_call_as_it_arrives() -> None:
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    part = {"index": 0, "id": "c1", "function": {"name": "echo", "arguments": '{"value": "a"}'}}
    for compat, closed in ((ChatCompat(whole_tool_calls=True), True), (ChatCompat(), False)):
        events.clear()
        assembler = ChatStreamAssembler(record, compat=compat)
        await assembler.feed({"choices": [{"index": 0, "delta": {"tool_calls": [part]}}]})
        assert any(isinstance(e, BlockStop) for e in events) is closed


async def test_missing_ids_are_replaced_in_the_servers_short_shape(serve_chat: Any) -> None:
    server = serve_chat(
        [reply(tool_call("echo", {"value": "a"})), reply("done")], ids="none", id_length=9
    )
    result = await agent_over(server, False, compat=ChatCompat(tool_call_id_length=9)).run("go")
    (record,) = result.tool_calls
    assert len(record.tool_use_id) == 9 and record.tool_use_id.isalnum()


async def test_short_ids_let_a_history_from_elsewhere_continue(serve_chat: Any) -> None:
    earlier = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [use("toolu_01XyZlongAnthropicId")]},
        {"role": "user", "content": [result("toolu_01XyZlongAnthropicId")]},
    ]
    refusing = serve_chat([reply("never")], id_length=9)
    with pytest.raises(BadRequestError, match="with a length of 9"):
        await agent_over(refusing, False).run(history=earlier)
    server = serve_chat([reply("fine")], id_length=9)
    agent = agent_over(server, False, compat=preset("vllm", tool_call_id_length=9))
    done = await agent.run(history=earlier)
    assert done.text == "fine"
    # The history keeps its own ids; only the wire carries the short ones.
    assert done.messages[1]["content"][0]["id"] == "toolu_01XyZlongAnthropicId"


async def test_a_tool_choice_the_server_refuses_is_left_out(serve_chat: Any) -> None:
    named = {"type": "tool", "name": "echo"}
    choices = {"auto", "none", "required"}
    refusing = serve_chat([reply("never")], tool_choices=choices)
    with pytest.raises(BadRequestError, match="Invalid tool_choice"):
        await agent_over(refusing, False, tool_choice=named).run("go")
    server = serve_chat([reply("ok")], tool_choices=choices)
    await agent_over(server, False, tool_choice=named, compat="llamacpp").run("go")
    assert "tool_choice" not in server.requests[0]


async def test_a_system_message_inside_the_conversation_stays_one(serve_chat: Any) -> None:
    earlier = [
        {"role": "user", "content": "Draft a reply."},
        {"role": "assistant", "content": [text("Here is a draft.")]},
        {"role": "system", "content": [text("Answer in French from now on.")]},
    ]
    server = serve_chat([reply("ok")])
    await agent_over(server, False).run("Shorter, please.", history=earlier)
    sent = server.requests[0]["messages"]
    assert sent[2:] == [
        {"role": "system", "content": "Answer in French from now on."},
        {"role": "user", "content": "Shorter, please."},
    ]
    # A server that takes one system message hears it as user text, and does not refuse.
    single = serve_chat([reply("ok")], single_system=True)
    await agent_over(single, False, compat="llamacpp").run("Shorter, please.", history=earlier)
    assert single.requests[0]["messages"][2] == {
        "role": "user",
        "content": "Answer in French from now on.",
    }


async def test_one_system_message_for_a_server_that_takes_one(serve_chat: Any) -> None:
    system = [{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}]
    refusing = serve_chat([reply("never")], single_system=True)
    with pytest.raises(BadRequestError, match="System message must be at the beginning"):
        await agent_over(refusing, False, system=system).run("go")
    server = serve_chat([reply("ok")], single_system=True)
    await agent_over(server, False, system=system, compat="vllm").run("go")
    assert server.requests[0]["messages"][0] == {
        "role": "system",
        "content": "Rule one.\n\nRule two.",
    }


@pytest.mark.parametrize(
    ("refused", "compat", "works"),
    [
        pytest.param("max_tokens", "openai", True, id="openai-sends-max_completion_tokens"),
        pytest.param("max_tokens", "ollama", False, id="ollama-sends-max_tokens"),
        pytest.param("max_completion_tokens", "ollama", True, id="local-server"),
    ],
)
async def test_max_tokens_field(serve_chat: Any, refused: str, compat: str, works: bool) -> None:
    server = serve_chat([reply("ok")], refuse_fields=[refused])
    agent = agent_over(server, False, compat=compat, max_tokens=50)
    if works:
        await agent.run("go")
        assert server.requests[0][PRESETS[compat].max_tokens_field] == 50
    else:
        with pytest.raises(BadRequestError, match="Unsupported parameter"):
            await agent.run("go")


async def test_stream_usage_can_be_turned_off_for_a_server_that_refuses_it(serve_chat: Any) -> None:
    refusing = serve_chat([reply("never")], refuse_fields=["stream_options"])
    with pytest.raises(BadRequestError, match="stream_options"):
        await agent_over(refusing, True).run("go")
    server = serve_chat([reply("ok")], refuse_fields=["stream_options"])
    result = await agent_over(server, True, compat=ChatCompat(stream_usage=False)).run("go")
    assert result.text == "ok" and result.usage.requests == 1


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_is_kept_unsigned_and_sent_back_only_when_asked(
    serve_chat: Any, stream: bool, field: str
) -> None:
    thought = {"type": "thinking", "thinking": "I should echo.", "signature": "s"}
    script = [reply(thought, tool_call("echo", {"value": "a"})), reply("done")]
    for compat, sent in ((ChatCompat(), False), (ChatCompat(send_reasoning=True), True)):
        server = serve_chat(list(script), reasoning_field=field)
        result = await agent_over(server, stream, compat=compat).run("go")
        assert result.messages[1]["content"][0] == {
            "type": "thinking",
            "thinking": "I should echo.",
        }
        assert ("reasoning_content" in server.requests[1]["messages"][1]) is sent


# --------------------------------------------------------------------------- llama-cpp-python


class City(BaseModel):
    name: str
    country: str


async def test_llama_cpp_python_is_shown_the_tools(serve_chat: Any) -> None:
    script = [reply(tool_call("echo", {"value": "a"})), reply("done")]
    plain = serve_chat(list(script), like="llama-cpp-python")
    await agent_over(plain, False).run("go")  # the script answers with a call regardless
    assert "tools" not in plain.model.requests[0]  # ... but a model would never see the tool
    server = serve_chat(list(script), like="llama-cpp-python")
    result = await agent_over(server, False, compat="llama-cpp-python").run("go")
    assert result.text == "done" and ran[-1] == "a"
    assert [r["tool_choice"] for r in server.requests] == ["auto", "auto"]
    assert [t["name"] for t in server.model.requests[0]["tools"]] == ["echo"]


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        pytest.param({"type": "any"}, {"type": "function", "function": {"name": "echo"}}, id="any"),
        pytest.param({"type": "tool", "name": "echo"}, None, id="named"),
        pytest.param({"type": "none"}, "none", id="none"),
    ],
)
async def test_llama_cpp_python_never_gets_required(
    serve_chat: Any, choice: dict[str, Any], sent: Any
) -> None:
    refusing = serve_chat([reply("never")], like="llama-cpp-python")
    if choice["type"] == "any":
        with pytest.raises(ServerError):  # it crashes on "required"
            await agent_over(refusing, False, tool_choice=choice).run("go")
    server = serve_chat([reply("ok")], like="llama-cpp-python")
    await agent_over(server, False, compat="llama-cpp-python", tool_choice=choice).run("go")
    expected = sent or {"type": "function", "function": {"name": "echo"}}
    assert server.requests[0]["tool_choice"] == expected


@pytest.mark.parametrize("stream", STREAMED)
async def test_typed_output_asks_llama_cpp_python_for_a_json_object_of_its_schema(
    serve_chat: Any, stream: bool
) -> None:
    refusing = serve_chat(schema_reply, like="llama-cpp-python")
    with pytest.raises(ServerError, match="response_format"):
        await agent_over(
            refusing, stream, compat=preset("llama-cpp-python", json_schema=True), output_type=City
        ).run("a city?")
    server = serve_chat(schema_reply, like="llama-cpp-python")
    agent = agent_over(server, stream, compat="llama-cpp-python", output_type=City)
    result = await agent.run("a city?")
    assert isinstance(result.output, City)
    form = server.requests[0]["response_format"]
    assert form["type"] == "json_object" and form["schema"]["properties"].keys() == {
        "name",
        "country",
    }
    assert form["schema"]["additionalProperties"] is False


async def test_streamed_usage_llama_cpp_python_does_not_send_is_unknown_not_zero(
    serve_chat: Any,
) -> None:
    script = [reply(tool_call("echo", {"value": "a"})), reply("done")]
    server = serve_chat(list(script), like="llama-cpp-python")
    agent = agent_over(server, True, compat="llama-cpp-python")
    limits = UsageLimits(total_tokens=10_000, tool_calls=5)
    with capture_logs() as logs:
        result = await agent.run("go", usage_limits=limits)
    assert result.text == "done"
    usage = result.usage
    assert (usage.requests, usage.uncounted_requests, usage.total_tokens) == (2, 2, 0)
    assert not usage.tokens_known and result.cost is None
    assert result.unenforced_limits == ("total_tokens",)  # the tool call limit still held
    (warning,) = [e for e in logs if e["event"] == "run.limits_unenforced"]
    assert warning["log_level"] == "warning" and warning["limits"] == ["total_tokens"]
    counted = await agent_over(serve_chat(list(script)), False).run("go", usage_limits=limits)
    assert counted.usage.tokens_known and counted.unenforced_limits == ()
    assert cost_of("claude-sonnet-4-5", UNCOUNTED) is None  # unknown tokens have no price


async def test_unknown_usage_survives_a_paused_state_and_a_durable_record(
    serve_chat: Any,
) -> None:
    script = [reply(tool_call("echo", {"value": "a"})), reply("done")]
    server = serve_chat(list(script), like="llama-cpp-python")
    agent = agent_over(server, True, compat="llama-cpp-python", approval_required={"echo"})
    limits = UsageLimits(output_tokens=500)
    paused = await agent.run("go", usage_limits=limits)
    assert paused.stop_reason == "approval_required" and paused.usage.uncounted_requests == 1
    call = paused.approvals[0].tool_use_id
    state = json.loads(json.dumps(paused.state))
    result = await agent.resume(state, decisions={call: Approve()})
    assert result.text == "done" and result.usage.uncounted_requests == 2
    recorded = json.loads(json.dumps(result_to_json(result)))
    assert result_from_json(recorded) == result


def test_an_empty_or_blank_answer_has_no_text_block() -> None:
    for content in ("", None, " \n", [{"type": "text", "text": ""}]):
        assert parse_completion(completion({"content": content})).content == []
    kept = parse_completion(completion({"content": "\n\nHi "}))
    assert kept.text == "\n\nHi "  # text is kept as it came, whitespace included

    async def stream(*pieces: str) -> Any:
        assembler = ChatStreamAssembler(_ignore_event)
        for piece in pieces:
            await assembler.feed({"choices": [{"index": 0, "delta": {"content": piece}}]})
        await assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        return await assembler.finish()

    assert anyio.run(stream, "", "\n", " ").content == []
    assert anyio.run(stream, "\n", "\nHi", " ").text == "\n\nHi "


def test_a_response_without_usage_is_uncounted() -> None:
    assert parse_completion(completion({"content": "hi"})).usage == UNCOUNTED
    counted = parse_completion(completion({"content": "hi"}, usage={"prompt_tokens": 0}))
    assert counted.usage.tokens_known and counted.usage.requests == 1

    async def main() -> Any:
        assembler = ChatStreamAssembler(_ignore_event)
        await assembler.feed({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
        await assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        return await assembler.finish()

    assert anyio.run(main).usage == UNCOUNTED
    assert (UNCOUNTED + counted.usage).uncounted_requests == 1


async def _ignore_event(event: Any) -> None:
    return None


# --------------------------------------------------------------------------- unsigned thinking elsewhere


async def test_a_history_with_unsigned_reasoning_continues_on_the_messages_api(serve: Any) -> None:
    earlier = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "local"}, text("A.")]},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "only this"}]},
        {"role": "user", "content": "q3"},
    ]
    lint_history(parse_history(earlier))  # accepted: it is never sent
    server = serve([reply("ok")])
    # cache="off": the messages sent are compared as they are, without cache markers
    agent = Agent(provider=AnthropicProvider(server.client()), cache="off")
    result = await agent.run(history=earlier)
    assert result.text == "ok"
    sent = server.requests[0]["messages"]
    assert sent == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [text("A.")]},
        {"role": "user", "content": "q2"},
        {"role": "user", "content": "q3"},
    ]
    assert result.messages[: len(earlier)] == earlier  # the history itself keeps it
    request = ModelRequest(model="m", messages=parse_history(earlier), max_tokens=10)
    assert request.to_wire()["messages"] == sent


def test_an_empty_signature_is_still_refused() -> None:
    bad = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""}]},
    ]
    with pytest.raises(HistoryError, match="signature"):
        lint_history(parse_history(bad))


# --------------------------------------------------------------------------- neutral values


def test_the_provider_protocol_imports_no_sdk() -> None:
    """providers/base.py and every agentloop module it imports, transitively, import no SDK."""
    import ast
    from pathlib import Path

    import agentloop

    root = Path(agentloop.__file__).parent
    todo, seen, external = ["agentloop.providers.base"], set(), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")[1:]
        path = root.joinpath(*parts).with_suffix(".py")
        if not path.exists():
            path = root.joinpath(*parts, "__init__.py")
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base]
            for target in targets:
                if target.split(".")[0] == "agentloop":
                    while target not in seen and not (
                        root.joinpath(*target.split(".")[1:]).with_suffix(".py").exists()
                        or root.joinpath(*target.split(".")[1:], "__init__.py").exists()
                    ):
                        target = target.rpartition(".")[0]
                    todo.append(target)
                else:
                    external.add(target.split(".")[0])
    assert "agentloop.providers.base" in seen and len(seen) > 3
    assert not external & {"anthropic", "openai", "httpx", "httpx2"}, external


def test_the_providers_package_imports_no_sdk_until_a_provider_is_used() -> None:
    """`agentloop.providers` (on its own, without the top package) loads SDKs lazily."""
    import agentloop

    root = os.path.dirname(agentloop.__file__)
    code = (
        "import sys, types\n"
        f"package = types.ModuleType('agentloop'); package.__path__ = [{root!r}]\n"
        "sys.modules['agentloop'] = package\n"
        "import agentloop.providers, agentloop.providers.base\n"
        "sdks = ('anthropic', 'openai', 'httpx', 'httpx2', 'tenacity')\n"
        "print(sorted(m for m in sdks if m in sys.modules))\n"
        "from agentloop.providers import AnthropicProvider, OpenAIChatProvider\n"
        "print(AnthropicProvider.__module__, OpenAIChatProvider.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "[]",
        "agentloop.providers.anthropic agentloop.providers.openai.provider",
    ]


def test_presets_are_named() -> None:
    assert set(PRESETS) == {"openai", "ollama", "vllm", "llamacpp", "llama-cpp-python"}
    assert PRESETS["ollama"].server == "Ollama"


async def test_events_of_a_streamed_response_are_neutral() -> None:
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    assembler = ChatStreamAssembler(record)
    await assembler.feed({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    await assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    response = await assembler.finish()
    assert isinstance(events[0], BlockStart) and isinstance(events[-1], BlockStop)
    assert response.text == "Hi" and response.stop_reason == "end_turn"


@pytest.mark.filterwarnings("always::ResourceWarning")  # the SDK's, shown by this test
def test_the_sdks_stream_leaves_readers_behind_under_trio() -> None:
    """Why the provider reads a stream's events itself (see its module docstring)."""
    import gc
    import warnings

    import trio
    import trio.testing

    from agentloop.testing import ChatCompletionsServer

    async def main(server: ChatCompletionsServer) -> list[str]:
        client = server.client()
        messages: Any = [{"role": "user", "content": "hi"}]
        with pytest.warns(ResourceWarning) as caught:
            chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)
            async for _ in chunks:
                pass
            del chunks
            gc.collect()
            await trio.testing.wait_all_tasks_blocked()  # trio's closing of the leftovers
        # The provider, on the same loop: the body is read to its end, nothing is left.
        provider = OpenAIChatProvider(client, stream=True)
        request = ModelRequest(model="m", max_tokens=8, messages=[Message.user("hi")])
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            assert (await provider.complete(request)).text == "hi"
            gc.collect()
            await trio.testing.wait_all_tasks_blocked()
        assert [w for w in ours if issubclass(w.category, ResourceWarning)] == []
        await server.aclose()
        return [str(w.message) for w in caught]

    server = ChatCompletionsServer([reply("hi"), reply("hi")], strict=True)
    server.start()
    warned = trio.run(main, server)
    assert any("garbage collected before it had been exhausted" in w for w in warned)
