"""Prompt caching for the Messages API: where a request's cache breakpoints go.

The agent states its choice (`Agent(cache=...)`) in `ModelRequest.cache`; the Anthropic
provider calls `with_breakpoints` on each request it sends, so the markers are in what is
sent and never in the run's history. Other providers ignore the choice: Chat Completions
servers cache by prefix on their own.

Breakpoints, in order of what they save (at most 4 in all, the user's own counted):

1. the last block of the newest message: the whole history so far is written once and
   read by the next round;
2. the last system block (or, without a system prompt, the last tool): tools and system
   stay cached when the conversation changes (another run, an edited history);
3. the last block before the newest assistant turn, where the previous round's
   breakpoint was: the previous round's entry is read there directly, even when the
   newest turn added more blocks than the API looks back over (20).

The API's top-level automatic caching places only the first of these, and so bills the
same in a steadily growing loop and more in the other two cases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from pydantic import TypeAdapter

from agentloop.calls import ToolDefinition
from agentloop.errors import ConfigurationError
from agentloop.messages import ContentBlock, Message

from .base import ModelRequest

__all__ = ("MAX_BREAKPOINTS", "CacheSetting", "cache_marker", "with_breakpoints")

CacheSetting = Literal["auto", "5m", "1h", "off"]
"""`Agent(cache=...)`: `"auto"` (breakpoints with the API's default 5-minute TTL), `"5m"`
(the same, stated), `"1h"` (1-hour TTL: writes cost 2x instead of 1.25x, worth it when
rounds are more than 5 minutes apart), `"off"` (no breakpoints added)."""

MAX_BREAKPOINTS = 4
"""The most cache breakpoints the API takes in one request."""

# Block types the API lets carry a `cache_control` (thinking blocks cannot; nor can an
# empty text block).
_MARKABLE = frozenset({"text", "image", "document", "search_result", "tool_use", "tool_result"})

_BLOCK: TypeAdapter[Any] = TypeAdapter(ContentBlock)


def cache_marker(setting: str) -> dict[str, Any] | None:
    """The `cache_control` marker for an `Agent(cache=...)` setting (None for `"off"`).

    Raises:
        ConfigurationError: `setting` is not one of `CacheSetting`'s values.
    """
    if setting in ("auto", "5m"):
        return {"type": "ephemeral"}
    if setting == "1h":
        return {"type": "ephemeral", "ttl": "1h"}
    if setting == "off":
        return None
    raise ConfigurationError(f"cache must be 'auto', '5m', '1h' or 'off', not {setting!r}")


def _ttl(marker: Any) -> str:
    return str(marker.get("ttl", "5m")) if isinstance(marker, Mapping) else "5m"


def _markable(block: Any) -> bool:
    kind = getattr(block, "type", None)
    return kind in _MARKABLE and not (kind == "text" and not getattr(block, "text", ""))


def _marker_of(value: Any) -> Any:
    """The `cache_control` of a wire dict or a block (extra fields), or None."""
    if isinstance(value, Mapping):
        return value.get("cache_control")
    extra = getattr(value, "__pydantic_extra__", None) or {}
    return extra.get("cache_control")


def _user_markers(
    request: ModelRequest, messages: Sequence[Message]
) -> list[tuple[tuple[int, ...], str]]:
    """Where the request already has breakpoints (position, TTL), in prompt order."""
    found: list[tuple[tuple[int, ...], str]] = []
    tools: list[Any] = [t.extra if isinstance(t, ToolDefinition) else t for t in request.tools]
    extra_tools = request.params.get("tools")
    if isinstance(extra_tools, list):
        tools += extra_tools
    for i, tool in enumerate(tools):
        if isinstance(_marker_of(tool), Mapping):
            found.append(((0, i), _ttl(_marker_of(tool))))
    system = request.system if not isinstance(request.system, str) else ()
    for i, entry in enumerate(system or ()):
        if isinstance(_marker_of(entry), Mapping):
            found.append(((1, i), _ttl(_marker_of(entry))))
    for m, message in enumerate(messages):
        # Kept with each message, so a long history is read once, not every round.
        for b, ttl in message.converted(_MARKERS_KEY, _message_markers):
            found.append(((2, m, b), ttl))
    auto = request.params.get("cache_control")
    if isinstance(auto, Mapping):
        found.append(((3,), _ttl(auto)))  # the automatic one: on the last block
    return found


_MARKERS_KEY = ("agentloop.cache-markers",)


def _message_markers(message: Message) -> tuple[tuple[int, str], ...]:
    """The blocks of `message` that carry a marker (or hold one, inside a tool_result)."""
    found: list[tuple[int, str]] = []
    for b, block in enumerate(message.blocks):
        inner = getattr(block, "content", None)
        candidates = [block, *(inner if isinstance(inner, tuple) else ())]
        marker = next(
            (_marker_of(x) for x in candidates if isinstance(_marker_of(x), Mapping)), None
        )
        if marker is not None:
            found.append((b, _ttl(marker)))
    return tuple(found)


def _last_markable(messages: Sequence[Message], before: int) -> tuple[int, int] | None:
    """(message, block) of the last block that can carry a marker, in `messages[:before]`."""
    for m in range(before - 1, -1, -1):
        blocks = messages[m].blocks
        for b in range(len(blocks) - 1, -1, -1):
            if _markable(blocks[b]):
                return m, b
    return None


def _sent(messages: Sequence[Message]) -> list[Message]:
    return [s for m in messages if (s := m.signed_only) is not None]


def with_breakpoints(request: ModelRequest) -> ModelRequest:
    """`request` with cache breakpoints added where they save most (see the module).

    Nothing is added when `request.cache` is None; the user's own markers are kept, count
    against the API's four, and are never doubled; a breakpoint that would break the
    API's TTL order (1-hour ones first) is left out. The request's messages are copied
    where marked, never changed.
    """
    marker = request.cache
    if marker is None:
        return request
    ttl = _ttl(marker)
    messages = _sent(request.messages)
    taken = _user_markers(request, messages)
    budget = MAX_BREAKPOINTS - len(taken)
    at = {position for position, _ in taken}

    def fits(position: tuple[int, ...]) -> bool:
        # The API refuses a 1-hour breakpoint after a 5-minute one.
        for other, other_ttl in taken:
            if other < position and other_ttl == "5m" and ttl == "1h":
                return False
            if other > position and other_ttl == "1h" and ttl == "5m":
                return False
        return position not in at

    chosen: list[tuple[int, ...]] = []
    tail = _last_markable(messages, len(messages))
    if tail is not None and (3,) not in at:  # a top-level cache_control marks the tail itself
        chosen.append((2, *tail))
    if isinstance(request.system, str) and request.system:
        chosen.append((1, 0))
    elif request.system and _markable_wire(request.system[-1]):
        chosen.append((1, len(request.system) - 1))
    elif request.tools and "tools" not in request.params:
        chosen.append((0, len(request.tools) - 1))
    last_assistant = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None
    )
    if last_assistant is not None:
        before = _last_markable(messages, last_assistant)
        if before is not None:
            chosen.append((2, *before))
    chosen = [p for p in chosen if fits(p)][: max(budget, 0)]
    if not chosen:
        return request
    return _marked(request, messages, chosen, dict(marker))


def _markable_wire(block: Any) -> bool:
    if not isinstance(block, Mapping):
        return False
    kind = block.get("type")
    return kind in _MARKABLE and not (kind == "text" and not block.get("text"))


def _marked(
    request: ModelRequest,
    messages: list[Message],
    chosen: list[tuple[int, ...]],
    marker: dict[str, Any],
) -> ModelRequest:
    """A copy of `request` with `marker` on the blocks at `chosen`."""
    system = request.system
    tools = list(request.tools)
    messages = list(messages)
    for position in chosen:
        if position[0] == 0:
            tool = tools[position[1]]
            tools[position[1]] = (
                replace(tool, extra={**tool.extra, "cache_control": marker})
                if isinstance(tool, ToolDefinition)
                else {**tool, "cache_control": marker}
            )
        elif position[0] == 1:
            if isinstance(system, str):
                system = [{"type": "text", "text": system, "cache_control": marker}]
            elif system:
                wire = [dict(b) for b in system]
                wire[position[1]] = {**wire[position[1]], "cache_control": marker}
                system = wire
        else:
            m, b = position[1], position[2]
            blocks = list(messages[m].blocks)
            blocks[b] = _BLOCK.validate_python({**blocks[b].to_wire(), "cache_control": marker})
            messages[m] = Message.of_blocks(messages[m].role, blocks)
    return replace(request, system=system, tools=tools, messages=messages)
