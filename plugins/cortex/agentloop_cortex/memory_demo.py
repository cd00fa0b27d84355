"""The offline demo with `--memory-tool`: a scripted model that keeps notes through `memory`.

Like `agentloop_cortex.demo`, but speaking the memory tool's commands: it views
`/memories`, then creates `/memories/memory.md` with a first note, or views it and
inserts the next note at its end, and sums up. Each round follows from the tool results
the agent sent back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentloop import ConfigurationError, Tool
from agentloop.messages import parse_history
from agentloop.testing import ScriptedProvider, reply, tool_call

from .demo import _latest_results, _user_text, extend_memory

__all__ = ("memory_demo_provider", "memory_demo_script")

_FILE = "/memories/memory.md"


def memory_demo_provider(tools: Sequence[Tool] = ()) -> ScriptedProvider:
    """A provider whose model is the memory tool demo script.

    Raises:
        ConfigurationError: the `memory` tool is not among `tools`.
    """
    if "memory" not in {t.name for t in tools}:
        raise ConfigurationError(
            "the cortex offline demo with --memory-tool calls the memory tool, but it is "
            "not exposed (or set ANTHROPIC_API_KEY to talk to the real model)"
        )
    return ScriptedProvider(memory_demo_script)


def memory_demo_script(body: dict[str, Any]) -> dict[str, Any]:
    """The demo model's answer to one request body (wire JSON)."""
    messages = parse_history(body.get("messages") or [])
    result = _latest_results(messages).get("memory")
    if result is None:
        return reply("Let me look at my memory.", _memory("view", path="/memories"))
    text, failed = result
    if failed:
        return reply(f"My memory tool failed ({text}), so I stop here.")
    asked = messages[-2].tool_uses[0].input
    if asked.get("command") == "view" and asked.get("path") == "/memories":
        if _FILE in text.split():
            return reply(_memory("view", path=_FILE))
        note = extend_memory("", _user_text(messages))
        create = _memory("create", path=_FILE, file_text=note)
        return reply("I have no memory yet: I'll start one.", create)
    if asked.get("command") == "view":
        lines = [line.split("\t", 1)[-1] for line in text.splitlines()[1:]]
        note = extend_memory("\n".join(lines), _user_text(messages)).splitlines()[-1]
        return reply(_memory("insert", path=_FILE, insert_line=len(lines), insert_text=note))
    return reply(f"Done: {text}")


def _memory(command: str, **fields: Any) -> dict[str, Any]:
    return tool_call("memory", {"command": command, **fields})
