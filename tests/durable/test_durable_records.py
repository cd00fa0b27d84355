"""What a durable run records (agentloop/durable/records.py): its result as JSON, tool results capped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentloop import tool
from agentloop.durable.records import capped, result_from_json, result_to_json
from agentloop.limits import Spent
from agentloop.messages import ImageBlock, TextBlock
from agentloop.result import Usage
from agentloop.testing import reply, tool_call
from agentloop.tools import ToolResult


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


# -- tool results capped to what a durable run records


def _content_size(result: ToolResult) -> int:
    content = result.content
    if isinstance(content, str):
        return len(content.encode())
    assert content is not None
    return sum(
        len(b.text.encode())
        if isinstance(b, TextBlock)
        else len(json.dumps(b.to_wire(), ensure_ascii=False).encode())
        for b in content
    )


def test_a_result_that_fits_is_recorded_as_it_is() -> None:
    result = ToolResult("toolu_1", "read", "x" * 1000)
    assert capped(result, 1000) is result
    assert capped(result, None) is result
    assert capped(ToolResult("toolu_1", "read", None), 1) == ToolResult("toolu_1", "read", None)


@pytest.mark.parametrize("is_error", [False, True])
def test_a_larger_text_keeps_its_beginning_and_says_it_was_cut(is_error: bool) -> None:
    text = "é" * 3_000_000  # two bytes each: a cut must not split one
    result = ToolResult("toolu_1", "read", text, is_error=is_error, duration=1.5)
    kept = capped(result, 1_000_000)
    assert isinstance(kept.content, str) and _content_size(kept) <= 1_000_000
    body, note = kept.content.split("\n\n[", 1)
    assert text.startswith(body) and len(body.encode()) > 990_000
    assert "6,000,000 bytes" in note and "1,000,000" in note
    assert (kept.tool_use_id, kept.is_error, kept.duration, kept.ran) == (
        "toolu_1",
        is_error,
        1.5,
        True,
    )


def test_blocks_are_kept_whole_in_order_then_the_next_text_is_cut() -> None:
    image = ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "A" * 400})
    blocks = [TextBlock(text="a" * 300), image, TextBlock(text="b" * 2000), image]
    kept = capped(ToolResult("toolu_1", "shot", list(blocks)), 1500)
    assert isinstance(kept.content, list) and _content_size(kept) <= 1500
    first, second, cut, note = kept.content
    assert (first, second) == (blocks[0], image)
    assert isinstance(cut, TextBlock) and set(cut.text) == {"b"} and len(cut.text) < 2000
    assert isinstance(note, TextBlock) and note.text.startswith("[Result cut:")
    # A block other than text fits whole or not at all.
    kept = capped(ToolResult("toolu_1", "shot", [image, image]), 600)
    assert isinstance(kept.content, list)
    assert [b.type for b in kept.content] == ["text"]


@pytest.mark.parametrize("cost", [0.003, None])
def test_what_a_call_spent_survives_its_result_s_json(cost: float | None) -> None:
    spent = Spent(Usage(input_tokens=100, output_tokens=10, requests=1), cost, tool_calls=2)
    result = ToolResult("toolu_1", "ask", "ok").with_spent(spent)
    recorded = json.loads(json.dumps(result.to_json()))
    assert ToolResult.from_json(recorded) == result and result.spent == spent
    assert "spent" not in ToolResult("toolu_1", "ask", "ok").with_spent(Spent()).to_json()
