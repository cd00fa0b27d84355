"""Mending a history that came from elsewhere, so the API accepts it.

`repair` answers unanswered tool calls, drops orphan and duplicate results, and removes
what the API refuses (empty text, a leading assistant message), and its `RepairReport`
says what changed. A run never needs it: its own `History` is valid by construction.
Messages of other roles than `ROLES` are kept as they are, where they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .messages import ROLES, Message, TextBlock, ToolResultBlock, parse_history

__all__ = ("CONTINUED_MESSAGE", "UNANSWERED_MESSAGE", "RepairReport", "repair")


@dataclass
class RepairReport:
    """What `repair` returned: the mended history and a line per change."""

    messages: list[Message]
    """The repaired history (new message objects where something changed)."""
    changes: list[str] = field(default_factory=list)
    """One human-readable line per change, in order; empty if nothing changed."""

    @property
    def changed(self) -> bool:
        """Whether anything had to change."""
        return bool(self.changes)


UNANSWERED_MESSAGE = "This tool call was never answered (result missing from the history)."


def repair(history: Iterable[Message | Mapping[str, Any]]) -> RepairReport:
    """Make a user-supplied history valid for the API and report what changed.

    Synthesises an `is_error` tool_result for every unanswered tool_use, drops orphan and
    duplicate tool_results, moves tool_results to the front of their user message, drops
    empty text blocks (and whitespace-only ones in user messages) and messages left empty,
    and puts a short user message first when the history starts with the assistant.
    Thinking blocks, signatures and tool_use inputs are never touched. A message of
    another role (a mid-conversation `system` message) is kept untouched in place, and
    the rules are applied to the others as if it were not there, as `lint_history` does.
    """
    messages = parse_history(history)
    changes: list[str] = []
    out: list[Message] = []
    first = next((m for m in messages if m.role in ROLES), None)
    if first is not None and first.role == "assistant":
        changes.append("added a user message before the first (assistant) message")
        out.append(Message.user(CONTINUED_MESSAGE))
    for i, message in enumerate(messages):
        if message.role not in ROLES:
            out.append(message)
            continue
        blocks = list(message.blocks)
        kept = [b for b in blocks if not _blank(b, message.role)]
        if len(kept) != len(blocks) or (isinstance(message.content, str) and not message.content):
            changes.append(
                f"messages[{i}]: dropped {len(blocks) - len(kept) or 1} empty text block(s)"
            )
        if message.role == "user":
            kept = _repair_results(out, kept, i, changes)
        if not kept and i != len(messages) - 1:
            changes.append(f"messages[{i}]: dropped the message, it had no content left")
            continue
        if kept == blocks and not (isinstance(message.content, str) and not message.content):
            out.append(message)
        else:
            out.append(message.model_copy(update={"content": kept}))
    # An assistant turn with tool_use at the end (or followed by another assistant turn).
    fixed: list[Message] = []
    for i, message in enumerate(out):
        fixed.append(message)
        uses = message.tool_uses if message.role == "assistant" else []
        following = next((m for m in out[i + 1 :] if m.role in ROLES), None)
        if uses and (following is None or following.role != "user"):
            results = [_synthetic(u.id) for u in uses]
            changes.append(
                f"added a user message answering unanswered tool_use ids: "
                f"{', '.join(u.id for u in uses)}"
            )
            fixed.append(Message.user(results))
    return RepairReport(fixed, changes)


CONTINUED_MESSAGE = "(The conversation so far continues below.)"
"""The text of the user message `repair` puts before a history that starts with the
assistant (the API requires a user message first)."""


def _blank(block: Any, role: str) -> bool:
    """An empty text block, or (in a user message) a whitespace-only one: the API refuses both."""
    if not isinstance(block, TextBlock):
        return False
    return block.text == "" or (role == "user" and not block.text.strip())


def _synthetic(tool_use_id: str) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=tool_use_id, content=UNANSWERED_MESSAGE, is_error=True)


def _repair_results(out: list[Message], blocks: list[Any], i: int, changes: list[str]) -> list[Any]:
    before = next((m for m in reversed(out) if m.role in ROLES), None)
    previous = before if before is not None and before.role == "assistant" else None
    expected = [u.id for u in previous.tool_uses] if previous else []
    results: dict[str, ToolResultBlock] = {}
    others: list[Any] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in expected:
                changes.append(f"messages[{i}]: dropped orphan tool_result {block.tool_use_id}")
            elif block.tool_use_id in results:
                changes.append(f"messages[{i}]: dropped duplicate tool_result {block.tool_use_id}")
            else:
                results[block.tool_use_id] = block
        else:
            others.append(block)
    for use_id in expected:
        if use_id not in results:
            changes.append(f"messages[{i}]: added an is_error tool_result for {use_id}")
            results[use_id] = _synthetic(use_id)
    ordered = [results[u] for u in expected]
    new = [*ordered, *others]
    if [id(b) for b in new if isinstance(b, ToolResultBlock)] != [
        id(b) for b in blocks if isinstance(b, ToolResultBlock)
    ] or new[len(ordered) :] != others:
        if not any("tool_result" in c and f"messages[{i}]" in c for c in changes):
            changes.append(f"messages[{i}]: moved tool_result blocks to the front")
    return new
