"""The tool-call log a Temporal run carries into the workflow run it continues as, or returns.

A run that continues as new (`max_history_bytes`) hands its state to the next workflow
run as that run's input, and a run that ends returns its result as the workflow's; each
must fit Temporal's payload limit (2 MB by default). The log's `input` and `output` of a
call repeat its `tool_use` input and its `tool_result` content, already in the messages
beside it: a call's entry leaves out what the messages give back exactly, so the carried
state and the result are about the size of the conversation, not twice it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from agentloop.result import ToolCallRecord

__all__ = ("carried_calls", "carried_result", "restored_calls", "restored_result")

_FROM_MESSAGES = {"from_messages": True}
"""Stands for a value the carried messages hold (a call's input or output)."""


def _blocks(messages: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tool_use inputs and the tool_result texts of `messages`, by tool_use id."""
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                inputs[block.get("id", "")] = block.get("input")
            elif block.get("type") == "tool_result":
                outputs[block.get("tool_use_id", "")] = _text(block.get("content"))
    return inputs, outputs


def _text(content: Any) -> str | None:
    """A tool_result's content as the log renders a result (`ToolResult.text`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        return None
    return "".join(
        str(b.get("text", "")) if b.get("type") == "text" else f"[{b.get('type')}]" for b in content
    )


def carried_calls(messages: Sequence[Any], calls: Sequence[ToolCallRecord]) -> list[dict[str, Any]]:
    """The log's entries as JSON, each value the messages give back exactly left out."""
    inputs, outputs = _blocks(messages)
    carried = []
    for call in calls:
        entry = asdict(call)
        if call.tool_use_id in inputs and inputs[call.tool_use_id] == call.input:
            entry["input"] = _FROM_MESSAGES
        if call.tool_use_id in outputs and outputs[call.tool_use_id] == call.output:
            entry["output"] = _FROM_MESSAGES
        carried.append(entry)
    return carried


def restored_calls(
    messages: Sequence[Any], carried: Sequence[dict[str, Any]]
) -> list[ToolCallRecord]:
    """The log `carried_calls` carried, whole again (an entry carried whole stays as it is)."""
    inputs, outputs = _blocks(messages)
    restored = []
    for entry in carried:
        values = dict(entry)
        if values["input"] == _FROM_MESSAGES:
            values["input"] = inputs[values["tool_use_id"]]
        if values["output"] == _FROM_MESSAGES:
            values["output"] = outputs[values["tool_use_id"]]
        restored.append(ToolCallRecord(**values))
    return restored


def carried_result(result: dict[str, Any]) -> dict[str, Any]:
    """A run's result (`result_to_json`) with its log's entries as `carried_calls` writes them."""
    calls = [ToolCallRecord(**record) for record in result["tool_calls"]]
    return result | {"tool_calls": carried_calls(result["messages"], calls)}


def restored_result(result: dict[str, Any]) -> dict[str, Any]:
    """The result `carried_result` carried, whole again (one carried whole stays as it is)."""
    calls = restored_calls(result["messages"], result["tool_calls"])
    return result | {"tool_calls": [asdict(call) for call in calls]}
