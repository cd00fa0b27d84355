"""The offline demo: a scripted model drives a cortex memory update end to end.

`agentloop run` uses it when no API key is set (or with `--offline`). The script reads
each request the agent sends, so the run behaves like a small, predictable model: it
reads memory.md, writes an extended copy while reading soul.md in the same turn, and sums up.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from .errors import ConfigurationError
from .result import RunResult, ToolCallRecord
from .testing.scripted import ScriptedProvider, reply, tool_call
from .tools import Tool

__all__ = (
    "CORTEX_FILES",
    "check_demo_tools",
    "cortex_config",
    "demo_provider",
    "demo_script",
    "format_files",
    "format_tool_log",
    "format_transcript",
    "print_demo_report",
    "read_cortex_files",
)

CORTEX_FILES = ("memory.md", "soul.md", "relationship.md")
"""The files the cortex plugin keeps per persona."""

_NEEDED = ("read_file", "write_file")
_MEMORY_HEADER = "# Memory\n\nWhat I want to remember, newest last.\n"
_NOTE = "- Note "


# --------------------------------------------------------------------------- the model


def demo_provider() -> ScriptedProvider:
    """A provider whose model is the demo script (one fresh script per call)."""
    return ScriptedProvider(demo_script)


def demo_script(body: dict[str, Any]) -> dict[str, Any]:
    """The demo model's answer to one request body (wire JSON).

    Round 1 reads memory.md; round 2 writes it back extended and, in the same turn, reads
    soul.md; round 3 sums up. Which round it is follows from the tool results received.
    """
    messages: list[dict[str, Any]] = body.get("messages") or []
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


def _written_memory(messages: Sequence[Mapping[str, Any]]) -> str:
    """The memory.md content the last assistant turn asked write_file to write."""
    for block in _blocks(messages[-2]):
        if block.get("type") == "tool_use" and block.get("name") == "write_file":
            return str(block.get("input", {}).get("content", ""))
    return ""


def _user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the latest user message that has text (the run's prompt)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
        if texts:
            return "\n".join(texts)
    return ""


def _latest_results(messages: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, bool]]:
    """The tool results of the last user message, by tool name: (text, is_error)."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return {}
    names = {
        b.get("id"): b.get("name") for b in _blocks(messages[-2]) if b.get("type") == "tool_use"
    }
    results: dict[str, tuple[str, bool]] = {}
    for block in _blocks(messages[-1]):
        if block.get("type") == "tool_result":
            name = str(names.get(block.get("tool_use_id"), ""))
            results[name] = (_result_text(block.get("content")), bool(block.get("is_error")))
    return results


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return list(content) if isinstance(content, list) else []


def _result_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))


# --------------------------------------------------------------------------- cortex


def cortex_config(root: Path, persona: str) -> Any:
    """An `agentloop_cortex.CortexConfig` for the run's deps.

    Raises:
        ConfigurationError: the cortex plugin is not installed, or the values are invalid.
    """
    try:
        cortex = importlib.import_module("agentloop_cortex")
    except ImportError as exc:
        raise ConfigurationError(
            "the cortex plugin is not installed (pip install agentloop-cortex)"
        ) from exc
    try:
        return cortex.CortexConfig(root=root, persona=persona)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc


def check_demo_tools(tools: Iterable[Tool]) -> None:
    """Make sure the tools the demo script calls are there.

    Raises:
        ConfigurationError: read_file or write_file (from the cortex plugin) is missing.
    """
    missing = [name for name in _NEEDED if name not in {t.name for t in tools}]
    if missing:
        raise ConfigurationError(
            f"the offline demo calls the cortex tools {', '.join(_NEEDED)}, but "
            f"{', '.join(missing)} is not selected: install agentloop-cortex and keep "
            "--plugin cortex (or set ANTHROPIC_API_KEY to talk to the real model)"
        )


def read_cortex_files(config: Any) -> dict[str, str]:
    """The current text of each cortex file of the configured persona ("" if unwritten)."""
    cortex = importlib.import_module("agentloop_cortex")
    store = cortex.CortexStore(config)
    return {name: str(store.read(name)) for name in CORTEX_FILES}


# --------------------------------------------------------------------------- output


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
        for block in _blocks(message):
            kind = block.get("type")
            if kind == "text":
                lines.append(f"{role}: {block.get('text', '')}")
            elif kind == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
                args = ", ".join(f"{k}={_short(v, 50)!r}" for k, v in block["input"].items())
                lines.append(f"{role} -> {block.get('name')}({args})")
            elif kind == "tool_result":
                flag = " [error]" if block.get("is_error") else ""
                result = _short(_result_text(block.get("content"))) or "(empty)"
                name = names.get(str(block.get("tool_use_id")), "?")
                lines.append(f"tool {name}{flag} <- {result}")
            else:
                lines.append(f"{role}: [{kind}]")
    return "\n".join(lines)


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


def format_files(files: Mapping[str, str], persona: str) -> str:
    """Each cortex file's content under a header with its path and size."""
    parts = []
    for name, content in files.items():
        size = len(content.encode())
        parts.append(f"--- {persona}/{name} ({size} bytes)\n{content.rstrip() or '(empty)'}")
    return "\n".join(parts)


def print_demo_report(result: RunResult, config: Any, out: TextIO) -> None:
    """Print the demo's transcript, tool log and the cortex files' new contents."""
    sections = (
        ("Transcript", format_transcript(result.messages)),
        ("Tool log", format_tool_log(result.tool_calls)),
        ("Cortex files", format_files(read_cortex_files(config), config.persona)),
    )
    for title, body in sections:
        print(f"\n== {title} ==\n{body}", file=out)
