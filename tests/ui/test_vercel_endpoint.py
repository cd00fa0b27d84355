"""The AI SDK endpoint over HTTP, read here: bad input, and typed output as a data part.

The `ai` package's chat is driven in test_vercel_client.py; these cases need no node.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
from _ui import served
from pydantic import BaseModel

from agentloop import Agent, RunContext, tool
from agentloop.events import ToolLog, ToolUserContent
from agentloop.messages import TextBlock
from agentloop.testing import Fault, MessagesServer, ScriptedProvider, reply, tool_call
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


async def test_thinking_is_reasoning_in_both_protocols() -> None:
    from agentloop.ui import AGUIEvents

    thought = {"type": "thinking", "thinking": "The user wants a greeting.", "signature": "sig"}
    script = [reply(thought, "Hello!")]
    chunks, events = UIMessageChunks(), AGUIEvents("t", "r")
    vercel, agui = chunks.start(), events.start()
    async with MessagesServer(script) as server:
        async with Agent(client=server.client()).start("Hi") as run:
            async for event in run:
                vercel += chunks(event)
                agui += events(event)
    kinds = [c["type"] for c in vercel if c["type"].startswith(("reasoning", "text"))]
    assert kinds[0] == "reasoning-start" and kinds[-1] == "text-end"
    assert kinds.index("reasoning-end") < kinds.index("text-start")
    said = "".join(c["delta"] for c in vercel if c["type"] == "reasoning-delta")
    assert said == "The user wants a greeting."
    types = [e["type"] for e in agui]
    assert types.index("REASONING_END") < types.index("TEXT_MESSAGE_START")
    thought_text = "".join(e["delta"] for e in agui if e["type"] == "REASONING_MESSAGE_CONTENT")
    assert thought_text == "The user wants a greeting."


async def test_a_tools_user_content_its_log_and_a_retry_reach_both_protocols() -> None:
    from agentloop.ui import AGUIEvents

    @tool
    async def chart(ctx: RunContext[None]) -> str:
        """Draw the chart."""
        assert ctx.tool_use_id is not None and ctx.tool_name is not None
        call = (ctx.round, ctx.tool_use_id, ctx.tool_name)
        await ctx.emit(ToolUserContent(*call, (TextBlock(type="text", text="Chart: ▁▃▇"),)))
        await ctx.emit(ToolLog(*call, level="warning", data="slow disk"))
        return "drawn"

    script = [
        Fault.overloaded(retry_after=0.01),
        reply(tool_call("chart", {}, id="toolu_chart")),
        reply("Here it is."),
    ]
    chunks, events = UIMessageChunks(), AGUIEvents("t", "r")
    vercel, agui = chunks.start(), events.start()
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(max_retries=1), tools=[chart])
        async with agent.start("Chart it") as run:
            async for event in run:
                vercel += chunks(event)
                agui += events(event)
    assert run.result.text == "Here it is."
    parts = {c["type"]: c for c in vercel if c["type"].startswith("data-")}
    shown = parts["data-tool-user-content"]
    assert shown["id"] == "toolu_chart"
    assert shown["data"]["content"] == [{"type": "text", "text": "Chart: ▁▃▇"}]
    assert parts["data-tool-log"]["data"]["data"] == "slow disk"
    assert parts["data-tool-log"]["transient"] is True
    assert parts["data-request-retry"]["data"]["reason"] == "529 overloaded"
    custom = {e["name"]: e["value"] for e in agui if e["type"] == "CUSTOM"}
    assert custom["agentloop.tool_user_content"]["content"][0]["text"] == "Chart: ▁▃▇"
    assert custom["agentloop.tool_log"]["level"] == "warning"
    assert custom["agentloop.request_retry"]["attempt"] == 1
