"""A run's result as the JSON a workflow engine records, and back (agentloop/durable/records.py)."""

from __future__ import annotations

import json
from typing import Any

from agentloop import tool
from agentloop.durable.records import result_from_json, result_to_json
from agentloop.testing import reply, tool_call


@tool
def echo_city(city: str) -> str:
    """Say the city back."""
    return city


async def test_a_result_survives_its_json_with_stop_sequence_and_container(
    http_agent: Any,
) -> None:
    first = {
        **reply(tool_call("echo_city", {"city": "Oslo"})),
        "container": {"id": "container_9", "expires_at": "2026-01-01T00:00:00Z"},
    }
    last = {**reply("Oslo it is.", stop_reason="stop_sequence"), "stop_sequence": "||"}
    agent, _ = http_agent([first, last], tools=[echo_city], stop_sequences=["||"])
    result = await agent.run("Which city?")
    recorded = json.loads(json.dumps(result_to_json(result)))
    assert recorded["stop_sequence"] == "||" and recorded["container"] == "container_9"
    assert result_from_json(recorded) == result


def test_json_recorded_before_stop_sequence_and_container_still_reads() -> None:
    older: dict[str, Any] = {
        "text": "hi",
        "stop_reason": "end_turn",
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        ],
        "tool_calls": [],
        "usage": {"input_tokens": 3, "output_tokens": 1, "requests": 1},
        "rounds": 1,
        "run_id": "r-1",
        "pending": [],
        "held": [],
        "approvals": [],
        "state": None,
        "output": "hi",
        "cost": None,
    }
    result = result_from_json(older)
    assert result.stop_sequence is None and result.container is None
    assert (result.text, result.output, result.usage.input_tokens) == ("hi", "hi", 3)
