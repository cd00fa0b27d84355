"""The offline demo: a scripted model that drives a cortex memory update end to end.

`agentloop run` uses it when no API key is set (or with `--offline`) and the cortex tools
are exposed. The script reads each request the agent sends, so the run behaves like a
small, predictable model: it reads memory.md, writes an extended copy while reading
soul.md in the same turn, and sums up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentloop import ConfigurationError, Message, Tool
from agentloop.messages import TextBlock, ToolResultBlock, parse_history
from agentloop.testing import ScriptedProvider, reply, tool_call

__all__ = ("NEEDED_TOOLS", "count_notes", "demo_provider", "demo_script", "extend_memory")

NEEDED_TOOLS = ("read_file", "write_file")
"""The cortex tools the demo model calls."""

_MEMORY_HEADER = "# Memory\n\nWhat I want to remember, newest last.\n"
_NOTE = "- Note "


def demo_provider(tools: Sequence[Tool] = ()) -> ScriptedProvider:
    """A provider whose model is the demo script, for a run exposing `tools`.

    Raises:
        ConfigurationError: `read_file` or `write_file` is not among `tools`.
    """
    names = {t.name for t in tools}
    missing = [name for name in NEEDED_TOOLS if name not in names]
    if missing:
        raise ConfigurationError(
            f"the cortex offline demo calls {' and '.join(NEEDED_TOOLS)}, but "
            f"{', '.join(missing)} is not exposed: drop --tool or name both tools "
            "(or set ANTHROPIC_API_KEY to talk to the real model)"
        )
    return ScriptedProvider(demo_script)


def demo_script(body: dict[str, Any]) -> dict[str, Any]:
    """The demo model's answer to one request body (wire JSON).

    Round 1 reads memory.md; round 2 writes it back extended and, in the same turn, reads
    soul.md; round 3 sums up. Which round it is follows from the tool results received.
    """
    messages = parse_history(body.get("messages") or [])
    prompt = _user_text(messages)
    results = _latest_results(messages)
    if "write_file" in results:
        return _summary(results, _written_memory(messages))
    if "read_file" in results:
        memory, failed = results["read_file"]
        if failed:
            return reply(f"I could not read memory.md ({memory}), so I left it unchanged.")
        updated = extend_memory(memory, prompt)
        return reply(
            "I'll add this to my memory and look at my soul file while I'm at it.",
            tool_call("write_file", {"filename": "memory.md", "content": updated}),
            tool_call("read_file", {"filename": "soul.md"}),
        )
    return reply(
        "Let me check what I already remember.",
        tool_call("read_file", {"filename": "memory.md"}),
    )


def extend_memory(memory: str, prompt: str) -> str:
    """memory.md with one more numbered note about `prompt` (earlier notes kept)."""
    notes = count_notes(memory)
    said = " ".join(prompt.split())[:200] or "(nothing)"
    base = memory.rstrip() if memory.strip() else _MEMORY_HEADER.rstrip()
    previous = f" (note {notes} came before)" if notes else " (my first note)"
    return f"{base}\n{_NOTE}{notes + 1}: the user said {said!r}{previous}.\n"


def count_notes(memory: str) -> int:
    """How many numbered notes a memory.md text holds."""
    return sum(1 for line in memory.splitlines() if line.startswith(_NOTE))


def _summary(results: Mapping[str, tuple[str, bool]], memory: str) -> dict[str, Any]:
    written, write_failed = results["write_file"]
    if write_failed:
        return reply(f"I tried to update memory.md but it failed: {written}")
    notes = count_notes(memory)
    soul, soul_failed = results.get("read_file", ("", True))
    if soul_failed or not soul.strip():
        soul_note = "soul.md is still empty, so I have no settled voice yet."
    else:
        soul_note = f"soul.md begins: {soul.strip().splitlines()[0][:80]!r}."
    return reply(f"Done: memory.md now holds {notes} note(s). {written} {soul_note}")


def _written_memory(messages: Sequence[Message]) -> str:
    """The memory.md content the last assistant turn asked write_file to write."""
    for use in messages[-2].tool_uses:
        if use.name == "write_file" and isinstance(use.input, dict):
            return str(use.input.get("content", ""))
    return ""


def _user_text(messages: Sequence[Message]) -> str:
    """The text of the latest user message that has text (the run's prompt)."""
    for message in reversed(messages):
        texts = [b.text for b in message.blocks if isinstance(b, TextBlock)]
        if message.role == "user" and texts:
            return "\n".join(texts)
    return ""


def _latest_results(messages: Sequence[Message]) -> dict[str, tuple[str, bool]]:
    """The tool results of the last user message, by tool name: (text, is_error)."""
    if len(messages) < 2 or messages[-1].role != "user":
        return {}
    names = {use.id: use.name for use in messages[-2].tool_uses}
    return {
        names.get(block.tool_use_id, ""): (block.text, block.is_error)
        for block in messages[-1].blocks
        if isinstance(block, ToolResultBlock)
    }
