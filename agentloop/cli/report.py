"""What `agentloop run` prints of a run: the human report, the result as JSON, user content.

Pure formatting of a `RunResult` (transcript, tool log, the plugins' sections, the
result), and of the content a tool call shows the user while the run goes on
(`ToolUserContent`); the command decides where it goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from agentloop.events import ToolUserContent
    from agentloop.result import RunResult, ToolCallRecord

__all__ = (
    "format_tool_log",
    "format_transcript",
    "print_result",
    "result_text",
    "result_to_json",
    "user_content_lines",
)


def print_result(result: RunResult, sections: Sequence[tuple[str, str]], out: TextIO) -> None:
    """The human report: transcript, tool log, the plugins' sections, then the result."""
    for title, body in (
        ("Transcript", format_transcript(result.messages)),
        ("Tool log", format_tool_log(result.tool_calls)),
        *sections,
    ):
        print(f"\n== {title} ==\n{body}", file=out)
    usage = result.usage
    print(
        f"\n== Result ==\nstop_reason={result.stop_reason}, rounds={result.rounds}, "
        f"tokens: {usage.input_tokens} in / {usage.output_tokens} out\n\n{result.text}",
        file=out,
    )


def result_to_json(result: RunResult) -> dict[str, Any]:
    """The RunResult as JSON-ready data."""
    return {
        "text": result.text,
        "stop_reason": result.stop_reason,
        "rounds": result.rounds,
        "usage": dataclasses.asdict(result.usage),
        "tool_calls": [dataclasses.asdict(call) for call in result.tool_calls],
        "messages": result.messages,
        "run_id": result.run_id,
    }


def _short(value: Any, limit: int = 70) -> str:
    shown = " ".join(str(value).split())
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def format_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """The run's history as readable lines: text, tool calls and their results."""
    lines: list[str] = []
    names: dict[str, str] = {}
    for message in messages:
        role = str(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            lines.append(f"{role}: {content}")
            continue
        for block in content if isinstance(content, list) else []:
            kind = block.get("type")
            if kind == "text":
                lines.append(f"{role}: {block.get('text', '')}")
            elif kind == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
                given = block.get("input") or {}
                shown = ", ".join(f"{k}={_short(v, 50)!r}" for k, v in given.items())
                lines.append(f"{role} -> {block.get('name')}({shown})")
            elif kind == "tool_result":
                flag = " [error]" if block.get("is_error") else ""
                result = _short(result_text(block.get("content"))) or "(empty)"
                name = names.get(str(block.get("tool_use_id")), "?")
                lines.append(f"tool {name}{flag} <- {result}")
            else:
                lines.append(f"{role}: [{kind}]")
    return "\n".join(lines)


def result_text(content: Any) -> str:
    """A `tool_result` block's content as text: a string as is, text blocks joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))


def format_tool_log(calls: Sequence[ToolCallRecord]) -> str:
    """A table of the run's tool calls: round, tool, is_error, duration."""
    if not calls:
        return "(no tool calls)"
    width = max(len("tool"), *(len(c.name) for c in calls))
    rows = [f"{'round':>5}  {'tool':<{width}}  {'is_error':<8}  duration"]
    rows += [
        f"{c.round:>5}  {c.name:<{width}}  {c.is_error!s:<8}  {c.duration * 1000:.1f} ms"
        for c in calls
    ]
    return "\n".join(rows)


def user_content_lines(event: ToolUserContent) -> list[str]:
    """The lines that show a tool call's content for the user: text as it is, the rest noted.

    Each line starts with `[round N] <tool> for you:`; an image or a document is one line
    naming its type (and title), since a terminal cannot show it.
    """
    head = f"[round {event.round}] {event.name} for you:"
    lines: list[str] = []
    for block in event.content:
        kind = getattr(block, "type", "content")
        if kind == "text":
            lines.append(f"{head} {getattr(block, 'text', '')}")
            continue
        source = getattr(block, "source", None)
        media = source.get("media_type") if isinstance(source, Mapping) else None
        title = getattr(block, "title", None)
        about = ", ".join(str(part) for part in (media, title) if part)
        lines.append(f"{head} ({kind}{f': {about}' if about else ''}, not shown here)")
    return lines
