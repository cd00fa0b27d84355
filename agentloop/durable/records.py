"""A run's result as plain JSON values, for a workflow engine to record and hand back.

A durable run's workflow returns `result_to_json(...)` (an engine records JSON, not our
objects) and the caller gets `result_from_json(...)`: an equal `RunResult`, its typed
output validated again against the run's output type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from pydantic import TypeAdapter

from agentloop.result import ApprovalRequest, RunResult, ToolCallRecord, Usage

__all__ = ("result_from_json", "result_to_json")


def result_to_json(result: RunResult[Any], output_type: Any = str) -> dict[str, Any]:
    """`result` as JSON values; `output_type` is the type of its `output` (`str` for text)."""
    output = result.output
    return {
        "text": result.text,
        "stop_reason": result.stop_reason,
        "messages": result.messages,
        "tool_calls": [asdict(record) for record in result.tool_calls],
        "usage": asdict(result.usage),
        "rounds": result.rounds,
        "run_id": result.run_id,
        "pending": result.pending,
        "held": result.held,
        "approvals": [asdict(approval) for approval in result.approvals],
        "state": result.state,
        "output": _dump(output, output_type),
        "cost": result.cost,
        "stop_sequence": result.stop_sequence,
        "container": result.container,
        "unenforced_limits": list(result.unenforced_limits),
    }


def result_from_json(data: Mapping[str, Any], output_type: Any = str) -> RunResult[Any]:
    """The `RunResult` `result_to_json` wrote; its output validated as `output_type`.

    JSON written before `stop_sequence` and `container` were recorded reads with both None,
    and before `unenforced_limits` was with none.
    """
    output = data["output"]
    return RunResult(
        text=data["text"],
        stop_reason=data["stop_reason"],
        messages=list(data["messages"]),
        tool_calls=[ToolCallRecord(**record) for record in data["tool_calls"]],
        usage=Usage(**data["usage"]),
        rounds=data["rounds"],
        run_id=data["run_id"],
        pending=list(data["pending"]),
        held=list(data["held"]),
        approvals=[ApprovalRequest(**approval) for approval in data["approvals"]],
        state=data["state"],
        output=None if output is None else _adapter(output_type).validate_python(output),
        cost=data["cost"],
        # Absent from what an earlier version recorded.
        stop_sequence=data.get("stop_sequence"),
        container=data.get("container"),
        unenforced_limits=tuple(data.get("unenforced_limits", ())),
    )


def _dump(output: Any, output_type: Any) -> Any:
    return None if output is None else _adapter(output_type).dump_python(output, mode="json")


def _adapter(output_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(str if output_type is None else output_type)
