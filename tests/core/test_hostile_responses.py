"""Hostile model responses, through the real SDK (JSON and SSE): each gets a typed error or
an `is_error` result, and the history left behind is always valid to send again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentloop import Agent, lint_history, tool
from agentloop.errors import InvalidResponseError
from agentloop.messages import parse_history
from agentloop.testing import MessagesServer, RawResponse, reply, tool_call

ran: list[Any] = []


@tool
def echo(value: str) -> str:
    """Echo a value."""
    ran.append(value)
    return value


MakeAgent = Callable[..., tuple[Agent, MessagesServer]]


def assert_sendable(messages: list[dict[str, Any]]) -> None:
    lint_history(parse_history(messages))


@pytest.mark.parametrize(
    "bad_input",
    ["just a string", ["a", "list"], None, 42, 1.5, True],
    ids=["string", "list", "null", "int", "float", "bool"],
)
async def test_a_call_whose_input_is_not_an_object_is_answered_not_run(
    http_agent: MakeAgent, bad_input: Any
) -> None:
    ran.clear()
    call = tool_call("echo", {"value": "x"})
    call["input"] = bad_input
    agent, server = http_agent([reply(call), reply("ok")], tools=[echo])
    result = await agent.run("go")
    assert result.text == "ok" and ran == []
    (record,) = result.tool_calls
    assert record.is_error and "not a JSON object" in record.output
    assert record.input == bad_input  # the log keeps what the model sent
    assert_sendable(result.messages)
    # The stored input is an object (the API refuses anything else); what the model sent
    # is quoted in the error it gets.
    sent = server.requests[1]["messages"]
    assert sent[1]["content"][0]["input"] == {}
    assert sent[2]["content"][0]["is_error"] is True


async def test_content_given_as_a_string_is_read_as_text(http_agent: MakeAgent) -> None:
    answer = {**reply("x"), "content": "plain text"}
    agent, _ = http_agent([answer])
    result = await agent.run("go")
    assert result.text == "plain text"
    assert_sendable(result.messages)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        {"type": "message", "role": "user", "content": []},
        {"type": "message", "role": "assistant", "content": {"not": "a list"}},
        {"type": "message", "role": "assistant", "content": [{"no": "type"}]},
        ["a", "list"],
    ],
    ids=["empty-object", "error-object", "user-role", "content-object", "block-no-type", "list"],
)
async def test_a_200_that_is_not_a_message_is_an_invalid_response(
    serve: Callable[..., MessagesServer], body: Any
) -> None:
    server = serve([RawResponse(200, body)])
    with pytest.raises(InvalidResponseError) as info:
        await Agent(client=server.client()).run("go")
    assert info.value.result is not None
    assert info.value.result.stop_reason == "error"
    assert info.value.result.messages == [{"role": "user", "content": "go"}]


async def test_duplicate_tool_use_ids_are_refused_and_the_history_stays_sendable(
    http_agent: MakeAgent,
) -> None:
    ran.clear()
    first = tool_call("echo", {"value": "a"})
    second = {**tool_call("echo", {"value": "b"}), "id": first["id"]}
    agent, _ = http_agent([reply(first, second)], tools=[echo])
    with pytest.raises(InvalidResponseError, match="repeats the tool_use id") as info:
        await agent.run("go")
    result = info.value.result
    assert result is not None
    assert_sendable(result.messages)
    # Never answered with another block's result.
    for message in result.messages:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result" and not block.get("is_error"):
                assert block["content"] == "a"


async def test_an_id_repeated_from_an_earlier_turn_is_refused(http_agent: MakeAgent) -> None:
    first = tool_call("echo", {"value": "a"})
    again = {**tool_call("echo", {"value": "b"}), "id": first["id"]}
    agent, _ = http_agent([reply(first), reply(again)], tools=[echo])
    with pytest.raises(InvalidResponseError) as info:
        await agent.run("go")
    assert info.value.result is not None
    assert_sendable(info.value.result.messages)
