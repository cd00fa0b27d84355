"""The AG-UI endpoint over HTTP, read here: bad input, a client that goes away, typed output.

The protocol's client is driven in test_agui_client.py; these cases need no node.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
from _ui import served
from pydantic import BaseModel

from agentloop import Agent, RunResult, tool
from agentloop.events import PartialOutput, RunFinished
from agentloop.lint import lint_history
from agentloop.messages import parse_history
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call
from agentloop.ui import AGUIEndpoint, AGUIEvents, agui_history


def _events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


async def test_input_that_is_not_a_run_agent_input_is_a_run_error() -> None:
    agent = Agent(provider=ScriptedProvider([reply("never")]))
    async with served("/agui", AGUIEndpoint(agent)) as url, httpx2.AsyncClient() as client:
        bodies = [b"not json", b"[]", json.dumps({"threadId": "t", "messages": []}).encode()]
        answers = [await client.post(url + "/agui", content=body) for body in bodies]
        bad_call = {
            "threadId": "t",
            "runId": "r",
            "messages": [
                {"id": "1", "role": "user", "content": "hi"},
                {
                    "id": "2",
                    "role": "assistant",
                    "toolCalls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "x", "arguments": "{oops"},
                        }
                    ],
                },
            ],
        }
        broken = await client.post(url + "/agui", json=bad_call)
    for answer in answers:
        assert answer.status_code == 200
        [event] = _events(answer.text)
        assert event["type"] == "RUN_ERROR" and event["code"] == "invalid_input"
    assert [e["type"] for e in _events(broken.text)] == ["RUN_STARTED", "RUN_ERROR"]
    assert "not valid JSON" in _events(broken.text)[-1]["message"]


async def test_a_client_that_goes_away_cancels_the_run_and_its_partial_result_is_kept() -> None:
    entered = anyio.Event()
    kept: list[tuple[str, RunResult[Any]]] = []
    done = anyio.Event()

    @tool
    async def make_report() -> str:
        """Takes a long time."""
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def on_result(thread: str, result: RunResult[Any]) -> None:
        kept.append((thread, result))
        done.set()

    call = tool_call("make_report")
    async with MessagesServer([reply("Working on it.", call)]) as server:
        agent = Agent(client=server.client(), tools=[make_report])
        endpoint = AGUIEndpoint(agent, on_result=on_result)
        run_input = {
            "threadId": "t9",
            "runId": "r1",
            "messages": [{"id": "u", "role": "user", "content": "Report please"}],
        }
        async with served("/agui", endpoint) as url, httpx2.AsyncClient() as client:
            async with client.stream("POST", url + "/agui", json=run_input) as answer:
                assert answer.status_code == 200
                with anyio.fail_after(10):
                    await entered.wait()
            with anyio.fail_after(10):
                await done.wait()
    [(thread, result)] = kept
    assert thread == "t9"
    assert result.stop_reason == "cancelled"
    assert result.usage.requests == 1
    lint_history(parse_history(result.messages))
    assert result.messages[-1]["content"][0]["tool_use_id"] == call["id"]


async def test_typed_output_grows_in_state_snapshots() -> None:
    class Forecast(BaseModel):
        city: str
        days: list[str]

    events = AGUIEvents("t", "r")
    out = events.start()
    forecast = Forecast(city="Paris", days=["sun", "rain"])
    script = [reply(output=forecast.model_dump())]
    agent = Agent(provider=ScriptedProvider(script), output_type=Forecast)
    async with agent.start("Forecast") as run:
        async for event in run:
            out += events(event)
            if isinstance(event, PartialOutput | RunFinished):
                assert out[-1]["type"] in ("STATE_SNAPSHOT", "RUN_FINISHED")
    snapshots = [e["snapshot"]["output"] for e in out if e["type"] == "STATE_SNAPSHOT"]
    assert snapshots[-1] == {"city": "Paris", "days": ["sun", "rain"]}
    assert out[-1]["type"] == "RUN_FINISHED"
    assert out[-1]["result"] == {"city": "Paris", "days": ["sun", "rain"]}


def test_an_ag_ui_conversation_becomes_a_valid_history() -> None:
    messages = [
        {"id": "s", "role": "system", "content": "ignored: the service sets the system prompt"},
        {"id": "1", "role": "user", "content": "Weather?"},
        {
            "id": "2",
            "role": "assistant",
            "content": "Checking.",
            "toolCalls": [
                {"id": "a", "type": "function", "function": {"name": "w", "arguments": '{"c": 1}'}},
                {"id": "b", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            ],
        },
        {"id": "3", "role": "tool", "toolCallId": "a", "content": "sunny"},
        {"id": "4", "role": "user", "content": [{"type": "text", "text": "And b?"}]},
    ]
    history = agui_history(messages)
    lint_history(parse_history(history))
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    results = history[2]["content"]
    assert [b.get("tool_use_id") for b in results] == ["a", "b", None]
    assert results[1]["is_error"] is True  # never answered: answered as such
    assert results[2] == {"type": "text", "text": "And b?"}
