"""What a durable run records: its result as plain JSON values, and tool results capped.

A durable run's workflow returns `result_to_json(...)` (an engine records JSON, not our
objects) and the caller gets `result_from_json(...)`: an equal `RunResult`, its typed
output validated again against the run's output type. A tool result is recorded as
`capped(...)` leaves it: the engine keeps it in the call's step and again in the run's
result (and a streamed run twice more), so one huge result would weigh on every copy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from pydantic import TypeAdapter

from agentloop.messages import ContentBlock, TextBlock
from agentloop.result import ApprovalRequest, RunResult, ToolCallRecord, Usage
from agentloop.tools import ToolResult

__all__ = ("capped", "result_from_json", "result_to_json")


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
        "models": list(result.models),
    }


def result_from_json(data: Mapping[str, Any], output_type: Any = str) -> RunResult[Any]:
    """The `RunResult` `result_to_json` wrote; its output validated as `output_type`.

    JSON written before `stop_sequence` and `container` were recorded reads with both None,
    before `unenforced_limits` was with none, and before `models` was with no models.
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
        models=list(data.get("models", ())),
    )


def _dump(output: Any, output_type: Any) -> Any:
    return None if output is None else _adapter(output_type).dump_python(output, mode="json")


def _adapter(output_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(str if output_type is None else output_type)


def capped(result: ToolResult, max_bytes: int | None) -> ToolResult:
    """`result` with its content cut to `max_bytes` bytes or fewer, and a note to the model.

    The size is the content's: the UTF-8 bytes of its text, and of the wire JSON of each
    block that is not text (an image, a document). A result that fits (or `max_bytes`
    None) comes back as it is. Otherwise it keeps its beginning: the blocks that fit whole,
    in order, then as much of the next text as fits (any other block fits whole or not at
    all), followed by a note giving both sizes, so the model knows it sees part of the
    result and can ask for less. `is_error` and the rest are kept: the call ran as it did.
    """
    content = result.content
    if max_bytes is None or content is None:
        return result
    total = _size(content)
    if total <= max_bytes:
        return result
    note = (
        f"\n\n[Result cut: it was {total:,} bytes, over this run's limit of {max_bytes:,}; "
        "the part above is its beginning. Ask for less (a page, a filter) to see more.]"
    )
    room = max(0, max_bytes - len(note.encode()))
    if isinstance(content, str):
        return replace(result, content=_cut(content, room) + note)
    kept: list[ContentBlock] = []
    for block in content:
        size = _size(block)
        if size > room:
            if isinstance(block, TextBlock) and room > 0:
                kept.append(TextBlock(text=_cut(block.text, room)))
            break
        kept.append(block)
        room -= size
    return replace(result, content=[*kept, TextBlock(text=note.lstrip())])


def _size(content: str | ContentBlock | list[ContentBlock]) -> int:
    """Bytes of text, and of the wire JSON of any other block."""
    if isinstance(content, list):
        return sum(_size(block) for block in content)
    if isinstance(content, str | TextBlock):
        return len((content if isinstance(content, str) else content.text).encode())
    return len(json.dumps(content.to_wire(), ensure_ascii=False).encode())


def _cut(text: str, size: int) -> str:
    """The longest beginning of `text` of at most `size` UTF-8 bytes (whole characters)."""
    return text.encode()[:size].decode(errors="ignore")
