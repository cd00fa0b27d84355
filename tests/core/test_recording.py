"""What a run records outside the process: responses and tool results as JSON, and the key
that makes a retried call's effect happen once.

The corpus test (`test_corpus.py`) round-trips every recorded Anthropic response; here a
Chat Completions response (through the real `openai` SDK and `ChatCompletionsServer`),
tool results of every content shape, bad records, and `RunContext.idempotency_key`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentloop import Agent, RunContext
from agentloop.errors import InvalidResponseError
from agentloop.messages import ImageBlock, Message, TextBlock
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.providers.openai import OpenAIChatProvider
from agentloop.testing import ChatCompletionsServer, ScriptedProvider, reply, tool_call
from agentloop.tools import ToolResult


def through_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


async def test_a_chat_completions_response_round_trips() -> None:
    script = [reply("Looking.", tool_call("lookup", {"q": "tea"}), usage={"input_tokens": 7})]
    async with ChatCompletionsServer(script, strict=True) as server:
        provider = OpenAIChatProvider(server.client())
        request = ModelRequest(model="m", messages=[Message.user("hi")], max_tokens=50)
        response = await provider.complete(request)
    assert response.tool_uses and response.raw and response.headers
    assert ModelResponse.from_json(through_json(response.to_json())) == response


@pytest.mark.parametrize(
    "content",
    [
        None,
        "",
        "plain text",
        [
            TextBlock(text="a"),
            ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBO"}),
        ],
    ],
)
def test_a_tool_result_round_trips(content: Any) -> None:
    result = ToolResult("toolu_1", "look", content, is_error=True, duration=0.25, ran=False)
    assert ToolResult.from_json(through_json(result.to_json())) == result


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"content": []},
        "text",
        {
            "tool_use_id": "t",
            "name": "n",
            "content": 3,
            "is_error": False,
            "duration": 0,
            "ran": True,
        },
    ],
)
def test_a_bad_tool_result_record_is_refused(record: Any) -> None:
    with pytest.raises(ValueError, match="not a recorded tool result"):
        ToolResult.from_json(record)


@pytest.mark.parametrize("record", [{}, {"content": "x"}, [], {"content": [{"type": 3}]}])
def test_a_bad_response_record_is_refused(record: Any) -> None:
    with pytest.raises(InvalidResponseError, match="not a recorded response"):
        ModelResponse.from_json(record)


async def test_the_idempotency_key_is_the_run_id_and_the_tool_use_id() -> None:
    seen: list[str] = []

    def note(ctx: RunContext) -> str:
        """Note the call's key."""
        seen.append(ctx.idempotency_key)
        return "noted"

    calls = [tool_call("note"), tool_call("note")]
    agent = Agent(provider=ScriptedProvider([reply(*calls), "done"]), tools=[note])
    result = await agent.run("go")
    assert seen and sorted(seen) == sorted(f"{result.run_id}:{c['id']}" for c in calls)
