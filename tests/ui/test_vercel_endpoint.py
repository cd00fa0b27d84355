"""The AI SDK endpoint over HTTP, read here: bad input, and typed output as a data part.

The `ai` package's chat is driven in test_vercel_client.py; these cases need no node.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
from _ui import served
from pydantic import BaseModel

from agentloop import Agent
from agentloop.testing import ScriptedProvider, reply
from agentloop.ui import UIMessageChunks, VercelAIEndpoint


def _chunks(body: str) -> list[Any]:
    lines = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


async def test_a_body_that_is_not_a_chat_is_an_error_chunk() -> None:
    agent = Agent(provider=ScriptedProvider([reply("never")]))
    async with served("/api/chat", VercelAIEndpoint(agent)) as url, httpx2.AsyncClient() as client:
        answers = [
            await client.post(url + "/api/chat", content=body)
            for body in (b"not json", b'{"messages": 3}', b'{"messages": [{"parts": 1}]}')
        ]
    for answer in answers:
        assert answer.headers["x-vercel-ai-ui-message-stream"] == "v1"
        chunks = _chunks(answer.text)
        assert [c if c == "[DONE]" else c["type"] for c in chunks] == [
            "start",
            "error",
            "finish",
            "[DONE]",
        ]


async def test_typed_output_is_a_data_part_replaced_as_it_grows() -> None:
    class Forecast(BaseModel):
        city: str
        days: list[str]

    chunks = UIMessageChunks(message_id="m1")
    out = chunks.start()
    script = [reply(output={"city": "Paris", "days": ["sun", "rain"]})]
    agent = Agent(provider=ScriptedProvider(script), output_type=Forecast)
    async with agent.start("Forecast") as run:
        async for event in run:
            out += chunks(event)
    data = [c for c in out if c["type"] == "data-output"]
    assert {c["id"] for c in data} == {"output"}
    assert data[-1]["data"] == {"city": "Paris", "days": ["sun", "rain"]}
    assert out[0] == {"type": "start", "messageId": "m1"}
    assert out[-1]["type"] == "finish" and out[-1]["finishReason"] == "stop"
    steps = [c["type"] for c in out if c["type"].endswith("-step")]
    assert steps == ["start-step", "finish-step"]
