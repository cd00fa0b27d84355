"""The local Chat Completions server: the format's rules, and faults as the SDK sees them."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from agentloop.testing import Fault, reply, tool_call
from agentloop.testing.chat_server import check_chat_request

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
ASSISTANT = {"role": "assistant", "content": None, "tool_calls": [CALL]}
USER = {"role": "user", "content": "q"}


def answer(call_id: str = "c1", content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        pytest.param([USER, answer()], "must be a response to a preceding", id="tool-without-call"),
        pytest.param(
            [USER, ASSISTANT], "did not have response messages: c1", id="unanswered-at-end"
        ),
        pytest.param(
            [USER, ASSISTANT, USER], "did not have response messages: c1", id="unanswered"
        ),
        pytest.param([USER, ASSISTANT, answer("c9")], "answers no call", id="wrong-id"),
        pytest.param([USER, ASSISTANT, answer(), answer()], "answered twice", id="twice"),
        pytest.param(
            [USER, ASSISTANT, answer(), USER, answer()],
            "must be a response to a preceding",
            id="answer-after-user",
        ),
        pytest.param(
            [
                USER,
                {**ASSISTANT, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]},
                answer(),
            ],
            "arguments: must be a string",
            id="arguments-object",
        ),
        pytest.param(
            [
                USER,
                {
                    **ASSISTANT,
                    "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}],
                },
                answer(),
            ],
            "not valid JSON",
            id="arguments-bad-json",
        ),
        pytest.param(
            [USER, {"role": "assistant", "content": None}],
            "needs content or tool_calls",
            id="empty-assistant",
        ),
        pytest.param([], "non-empty", id="no-messages"),
    ],
)
def test_the_format_rules(messages: list[Any], problem: str) -> None:
    found = check_chat_request({"model": "m", "messages": messages})
    assert found is not None and problem in found


def test_a_valid_request_passes() -> None:
    assert check_chat_request({"model": "m", "messages": [USER, ASSISTANT, answer(), USER]}) is None


async def test_a_broken_history_is_a_400_the_sdk_raises(serve_chat: Any) -> None:
    server = serve_chat([reply("never")])
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="did not have response messages"):
        await client.chat.completions.create(model="m", messages=[USER, ASSISTANT])
    assert server.model.requests == []  # never reached the script


async def test_the_sdk_reads_what_the_server_sends(serve_chat: Any) -> None:
    call = tool_call("f", {"x": 1})
    server = serve_chat([reply("hi", call, usage={"input_tokens": 5, "output_tokens": 2})] * 2)
    client = server.client()
    done = await client.chat.completions.create(model="m", messages=[USER])
    message = done.choices[0].message
    assert message.content == "hi" and message.tool_calls[0].id == call["id"]
    assert done.choices[0].finish_reason == "tool_calls" and done.usage.prompt_tokens == 5
    stream = await client.chat.completions.create(
        model="m", messages=[USER], stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        pytest.param(Fault.rate_limited(retry_after=0.1), openai.RateLimitError, id="429"),
        pytest.param(Fault.server_error(), openai.InternalServerError, id="500"),
        pytest.param(Fault.http_error(401), openai.AuthenticationError, id="401"),
        pytest.param(Fault.dropped(), openai.APIConnectionError, id="dropped"),
    ],
)
async def test_each_fault_is_the_sdk_exception(
    serve_chat: Any, fault: Fault, expected: type[Exception]
) -> None:
    server = serve_chat([fault])
    with pytest.raises(expected):
        await server.client().chat.completions.create(model="m", messages=[USER])


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(ASSISTANT, id="null-content-of-calls"),
        pytest.param({"role": "user", "content": [{"type": "text", "text": "q"}]}, id="text-parts"),
        pytest.param({"role": "system", "content": [{"type": "text", "text": "s"}]}, id="system"),
    ],
)
async def test_strict_refuses_what_a_chat_template_cannot_render(
    serve_chat: Any, message: dict[str, Any]
) -> None:
    messages = [USER, message, answer()] if message is ASSISTANT else [message, USER]
    server = serve_chat([reply("never")], strict=True)
    with pytest.raises(openai.InternalServerError, match=r"valid string|concatenate str"):
        await server.client().chat.completions.create(model="m", messages=messages)
    assert server.model.requests == []
    lenient = serve_chat([reply("ok")], strict=False)  # the format itself allows it
    done = await lenient.client().chat.completions.create(model="m", messages=messages)
    assert done.choices[0].message.content == "ok"


async def test_strict_keeps_the_parts_of_a_message_with_an_image(serve_chat: Any) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    server = serve_chat([reply("ok")], strict=True)
    await server.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "q"}, image]}]
    )
    assert [b["type"] for b in server.model.requests[0]["messages"][0]["content"]] == [
        "text",
        "image",
    ]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


async def test_like_llama_cpp_python(serve_chat: Any) -> None:
    real = serve_chat([reply("a")] * 5, like="llama-cpp-python", strict=None)
    assert real.quirks.strict  # from `like`
    client = real.client()
    for choice in (None, "none", "auto", {"type": "function", "function": {"name": "f"}}):
        given = {} if choice is None else {"tool_choice": choice}
        await client.chat.completions.create(model="m", messages=[USER], tools=[TOOL], **given)
        shown = "tools" in real.model.requests[-1]
        assert shown is (choice not in (None, "none")), choice  # tools only with a choice
    # It answers 500 to what it refuses, a request it cannot validate included.
    with pytest.raises(openai.InternalServerError, match="tool_choice"):
        await client.chat.completions.create(
            model="m", messages=[USER], tools=[TOOL], tool_choice="required"
        )
    with pytest.raises(openai.InternalServerError, match="response_format"):
        await client.chat.completions.create(
            model="m",
            messages=[USER],
            response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": {}}},
        )
    stream = await client.chat.completions.create(
        model="m", messages=[USER], stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks and all(c.usage is None for c in chunks)  # the option is ignored
