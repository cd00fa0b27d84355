"""The rules the Messages API enforces on a history, checked before a request is sent.

`lint_history` checks a whole history once; `HistoryLinter` checks a growing one, reading
only what is new, and is what a run's `History` uses before every request. Errors quote
the message path and ids in the API's own wording. Messages of a role other than `user`
and `assistant` (a mid-conversation `system` message) are stepped over: where they may
stand is the API's to judge (see docs/history.md); a role the API does not take at all is
refused. `check_result_content` applies the rules on a `tool_result`'s blocks to the
blocks a tool returns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import HistoryError
from .messages import (
    OTHER_ROLES,
    ROLES,
    SERVER_TOOL_RESULT_TYPES,
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    ServerToolResultBlock,
    ServerToolUseBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
)

__all__ = ("HistoryLinter", "check_result_content", "lint_history")


@dataclass
class _Turn:
    """Consecutive messages of one role, merged as the API merges them."""

    role: str
    start: int  # index of its first message
    blocks: list[tuple[int, Any]]  # (index of the original message, block)


def _turns(messages: Sequence[Message], offset: int = 0) -> list[_Turn]:
    """The turns of `messages` as the Messages API receives them.

    Thinking blocks without a signature are never sent (see `Message.signed_only`), so
    they are not checked; a message holding nothing else is not sent at all. A message of
    another role than `ROLES` is left out: the turns on either side of it are read as if
    it were not there (a user turn on each side merge, a `tool_use` is answered by the
    `tool_result` after it).
    """
    turns: list[_Turn] = []
    for index, message in enumerate(messages, offset):
        if message.role not in ROLES:
            if message.role not in OTHER_ROLES:
                raise HistoryError(
                    f"unknown role {message.role!r}: a message's role is 'user' or "
                    "'assistant' (or 'system', for a mid-conversation system message)",
                    path=f"messages.{index}.role",
                    index=index,
                )
            continue
        sent = message.signed_only
        if sent is None:
            continue
        if isinstance(sent.content, str):
            blocks: list[Any] = [TextBlock(text=sent.content)]
        else:
            blocks = list(sent.content)
        if turns and turns[-1].role == message.role:
            turns[-1].blocks.extend((index, b) for b in blocks)
        else:
            turns.append(_Turn(message.role, index, [(index, b) for b in blocks]))
    return turns


_SOURCE_TAGS = {
    "image": ("base64", "url"),
    "document": ("base64", "content", "text", "url"),
}
# The fields each kind of source must carry, with the type each must have.
_SOURCE_FIELDS: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "base64": (("media_type", str), ("data", str)),
    "url": (("url", str),),
    "file": (("file_id", str),),
    "text": (("media_type", str), ("data", str)),
    "content": (("content", (str, list, tuple)),),
}
# Blocks that a `tool_result` may never hold: they belong to the turns themselves.
_NOT_IN_RESULTS = frozenset(
    {
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "mcp_tool_use",
        "compaction",
        *SERVER_TOOL_RESULT_TYPES,
    }
)
_BLOCK_TYPE = re.compile(r"[a-z][a-z0-9_]*")


def _check_block(
    block: Any, path: str, index: int | None, allow_file_sources: bool, nested: bool = False
) -> None:
    """The fields the API requires of one block: its type's name, sources, nested content."""
    kind = block.type
    if not _BLOCK_TYPE.fullmatch(kind):
        raise HistoryError(
            f"{kind!r} is not a content block type", path=f"{path}.type", index=index
        )
    if kind == "tool_result" and isinstance(block.content, tuple):
        _check_results(block.content, f"{path}.tool_result.content", index, allow_file_sources)
        return
    if kind not in _SOURCE_TAGS:
        return
    allowed = _SOURCE_TAGS[kind] + (("file",) if allow_file_sources else ())
    source = getattr(block, "source", {})
    tag = source.get("type") if isinstance(source, dict) else None
    where = f"{path}.{kind}.source" if nested else f"{path}.source"
    if tag not in allowed:
        expected = ", ".join(f"'{t}'" for t in allowed)
        raise HistoryError(
            f"Input tag '{tag}' found using 'type' does not match any of the expected tags: "
            f"{expected}",
            path=where,
            index=index,
        )
    for name, kinds in _SOURCE_FIELDS[tag]:
        if name not in source:
            raise HistoryError("Field required", path=f"{where}.{tag}.{name}", index=index)
        if not isinstance(source[name], kinds):
            raise HistoryError(
                "Input should be a valid string", path=f"{where}.{tag}.{name}", index=index
            )


def _check_results(
    blocks: Sequence[Any], path: str, index: int | None, allow_file_sources: bool
) -> None:
    """The blocks of a `tool_result`'s content."""
    for k, inner in enumerate(blocks):
        where = f"{path}.{k}"
        if inner.type in _NOT_IN_RESULTS:
            raise HistoryError(
                f"`{inner.type}` blocks cannot be part of a `tool_result`'s content",
                path=where,
                index=index,
            )
        if isinstance(inner, TextBlock) and inner.text == "":
            raise HistoryError("text content blocks must be non-empty", path=where, index=index)
        _check_block(inner, where, index, allow_file_sources, True)


def check_result_content(
    blocks: Sequence[ContentBlock], *, allow_file_sources: bool = True
) -> None:
    """Check blocks meant for a `tool_result`'s content, as the linter checks such content.

    No block the turns themselves hold (`tool_use`, thinking, ...), no empty text, images
    and documents with complete sources. File sources are allowed unless told otherwise:
    whether a request may use them is the linter's to say when it is sent.

    Raises:
        HistoryError: the first problem; the path counts the blocks from 0.
    """
    _check_results(blocks, "content", None, allow_file_sources)


def lint_history(
    messages: Sequence[Message],
    *,
    thinking: bool | Mapping[str, Any] | None = False,
    tool_choice: Mapping[str, Any] | None = None,
    allow_file_sources: bool = False,
) -> None:
    """Check a history against the rules the Messages API enforces, before it is sent.

    Args:
        messages: The history, as `Message`s (see `parse_history` for dicts).
        thinking: The request's `thinking` option (`{"type": "enabled", ...}`,
            `{"type": "adaptive"}`, ...), or a bool (True for `enabled`). Only
            `enabled` makes the model think before every answer, so only then must the
            assistant turn before the latest tool results start with a thinking block,
            and may `tool_choice` not force a tool. Under `adaptive` thinking is the
            model's choice, and those rules do not apply.
        tool_choice: The request's `tool_choice`, if any.
        allow_file_sources: Whether `file` image/document sources are allowed (Files beta).

    Raises:
        HistoryError: The first broken rule, quoting the message path and ids the way the
            API does.
    """
    HistoryLinter(
        thinking=thinking, tool_choice=tool_choice, allow_file_sources=allow_file_sources
    ).check(messages)


@dataclass
class _LintState:
    """What the turns checked so far leave for the next ones to be checked against."""

    tool_use_ids: set[str] = field(default_factory=set)
    server_uses: set[str] = field(default_factory=set)
    pending_server: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Server tool uses without a result yet: id -> (turn, message index)."""
    previous_uses: dict[str, None] = field(default_factory=dict)
    """Client tool_use ids of the turn before the next one."""

    def copy(self) -> _LintState:
        return _LintState(
            set(self.tool_use_ids),
            set(self.server_uses),
            dict(self.pending_server),
            dict(self.previous_uses),
        )


class HistoryLinter:
    """`lint_history` for a history that grows: each check reads only what is new.

    The runner keeps one per run, so checking before every request costs the same at
    round 100 as at round 1. It assumes the messages it has seen are not changed, only
    appended to (the last turn may grow); if an earlier message is replaced, it checks
    the whole history again.
    """

    def __init__(
        self,
        *,
        thinking: bool | Mapping[str, Any] | None = False,
        tool_choice: Mapping[str, Any] | None = None,
        allow_file_sources: bool = False,
    ) -> None:
        """Create a linter for requests with these options (see `lint_history`)."""
        self.thinking = thinking
        self._thinking_enabled = _thinking_enabled(thinking)
        self.tool_choice = tool_choice
        self.allow_file_sources = allow_file_sources
        self._reset()

    def _reset(self) -> None:
        self._start = 0  # first message of the turns to read again
        self._turn = 0  # merged index of that turn
        self._anchor: Message | None = None  # the message just before `_start`
        self._state = _LintState()  # what the turns before `_start` left

    def check(self, messages: Sequence[Message]) -> None:
        """Check `messages`; raise `HistoryError` at the first broken rule."""
        choice = self.tool_choice
        if self._thinking_enabled and choice and choice.get("type") in ("any", "tool"):
            raise HistoryError("Thinking may not be enabled when tool_choice forces tool use.")
        if not messages:
            raise HistoryError("at least one message is required", path="messages")
        first = next((i for i, m in enumerate(messages) if m.role in ROLES), 0)
        if messages[first].role == "assistant":
            raise HistoryError(
                "first message must use the user role (see repair())",
                path=f"messages.{first}",
                index=first,
            )
        if self._start > len(messages) or (
            self._start and messages[self._start - 1] is not self._anchor
        ):
            self._reset()
        turns = _turns(messages[self._start :], self._start)
        if not turns:  # nothing but unsigned thinking (never sent) or unknown roles
            raise HistoryError("at least one message is required", path="messages")
        state = self._state.copy()
        # The last two turns are read again next time (the last may still grow):
        # remember where they start and what came before them.
        keep = max(len(turns) - 2, 0)
        kept: tuple[int, int, _LintState] | None = None
        last = self._turn + len(turns) - 1
        for i, turn in enumerate(turns):
            if i == keep:
                kept = (turn.start, self._turn + i, state.copy())
            self._check_turn(self._turn + i, turn, state, final=self._turn + i == last)
            state.previous_uses = _tool_use_ids(turn)
        self._check_end(turns, self._turn, state)
        assert kept is not None  # set in the loop: `keep` indexes `turns`
        self._start, self._turn, self._state = kept
        self._anchor = messages[self._start - 1] if self._start else None

    def _check_turn(self, t: int, turn: _Turn, state: _LintState, final: bool) -> None:
        if not turn.blocks and not (final and turn.role == "assistant"):
            raise HistoryError(
                "all messages must have non-empty content except for the optional final "
                "assistant message",
                path=f"messages.{t}",
            )
        expected = state.previous_uses
        answered: set[str] = set()
        leading = True
        for j, (index, block) in enumerate(turn.blocks):
            path = f"messages.{t}.content.{j}"
            kind = block.type
            if kind == "text" and block.text == "":
                raise HistoryError("text content blocks must be non-empty", path=path, index=index)
            if kind == "text" and turn.role == "user" and not block.text.strip():
                raise HistoryError(
                    "text content blocks must contain non-whitespace text", path=path, index=index
                )
            _check_block(block, path, index, self.allow_file_sources)
            if kind == "tool_result":
                self._check_result(block, turn, expected, answered, leading, path, index)
                answered.add(block.tool_use_id)
                continue
            leading = False
            if kind == "tool_use":
                if turn.role != "assistant":
                    raise HistoryError(
                        "`tool_use` blocks can only appear in assistant messages",
                        path=path,
                        index=index,
                    )
                if block.id in state.tool_use_ids:
                    raise HistoryError(
                        f"`tool_use` ids must be unique: {block.id}", path=path, index=index
                    )
                state.tool_use_ids.add(block.id)
                for name in ("id", "name"):
                    if not getattr(block, name):
                        raise HistoryError(
                            "String should have at least 1 character",
                            path=f"{path}.tool_use.{name}",
                            index=index,
                        )
                if not isinstance(block.input, dict):
                    raise HistoryError(
                        "Input should be a valid dictionary", path=f"{path}.input", index=index
                    )
                caller = (block.__pydantic_extra__ or {}).get("caller")
                if isinstance(caller, dict) and caller.get("tool_id"):
                    state.pending_server.pop(str(caller["tool_id"]), None)
            elif kind == "compaction":
                _check_compaction(block, turn.role, path, index)
            elif isinstance(block, ServerToolUseBlock):
                state.server_uses.add(block.id)
                state.pending_server[block.id] = (t, index)
            elif isinstance(block, ServerToolResultBlock):
                if block.tool_use_id not in state.server_uses:
                    raise HistoryError(
                        f"`{block.type}` block refers to an unknown server tool use id: "
                        f"{block.tool_use_id}",
                        path=path,
                        index=index,
                    )
                state.pending_server.pop(block.tool_use_id, None)
        if (
            turn.role == "assistant"
            and not final
            and all(b.type == "text" and not b.text.strip() for _, b in turn.blocks)
        ):
            raise HistoryError(
                "text content blocks must contain non-whitespace text",
                path=f"messages.{t}",
                index=turn.start,
            )
        missing = [i for i in expected if i not in answered]
        if missing and turn.role == "user":
            raise HistoryError(
                f"`tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding "
                f"`tool_result` block in the next message.",
                path=f"messages.{t}",
                index=turn.blocks[0][0] if turn.blocks else None,
            )

    @staticmethod
    def _check_result(
        block: ToolResultBlock,
        turn: _Turn,
        expected: Mapping[str, None],
        answered: set[str],
        leading: bool,
        path: str,
        index: int,
    ) -> None:
        if turn.role != "user":
            raise HistoryError(
                "`tool_result` blocks can only appear in user messages", path=path, index=index
            )
        if block.tool_use_id not in expected:
            raise HistoryError(
                f"unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{block.tool_use_id}. Each `tool_result` block must have a "
                f"corresponding `tool_use` block in the previous message.",
                path=path,
                index=index,
            )
        if block.tool_use_id in answered:
            raise HistoryError(
                f"each `tool_use` must have a single result. Found multiple "
                f"`tool_result` blocks with id: {block.tool_use_id}",
                path=path,
                index=index,
            )
        if not leading:
            raise HistoryError(
                "`tool_result` blocks must come first in the user message, before "
                f"any other content (id: {block.tool_use_id})",
                path=path,
                index=index,
            )

    def _check_end(self, turns: list[_Turn], offset: int, state: _LintState) -> None:
        """Rules about how the history ends (the turns given are its last ones)."""
        final = turns[-1]
        final_uses = _tool_use_ids(final)
        if final_uses:
            raise HistoryError(
                f"`tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(final_uses)}. Each `tool_use` block must have a corresponding "
                f"`tool_result` block in the next message.",
                path=f"messages.{offset + len(turns) - 1}",
                index=final.blocks[-1][0],
            )
        assistant = next(
            (i for i in range(len(turns) - 1, -1, -1) if turns[i].role == "assistant"), None
        )
        last_assistant = -1 if assistant is None else offset + assistant
        for use_id, (t, index) in state.pending_server.items():
            if t != last_assistant:
                raise HistoryError(
                    f"server tool use {use_id} has no result block; each `server_tool_use` "
                    "must be followed by its result in the assistant turn",
                    path=f"messages.{t}",
                    index=index,
                )
        if assistant is None:
            return
        _check_latest_thinking(turns[assistant], last_assistant)
        if self._thinking_enabled and final.role == "user" and assistant == len(turns) - 2:
            _check_thinking_first(turns[assistant], final, last_assistant)


def _check_compaction(block: Any, role: str, path: str, index: int) -> None:
    """A server-side `compaction` block: the model's, and a summary or null (failed)."""
    if role != "assistant":
        raise HistoryError(
            "`compaction` blocks can only appear in assistant messages", path=path, index=index
        )
    content = (block.__pydantic_extra__ or {}).get("content")
    if content is not None and (not isinstance(content, str) or not content):
        raise HistoryError(
            "compaction block content must be a non-empty string, or null for a failed compaction",
            path=f"{path}.content",
            index=index,
        )


def _thinking_enabled(thinking: bool | Mapping[str, Any] | None) -> bool:
    """Whether the model must think before every answer (`enabled`, not `adaptive`)."""
    if isinstance(thinking, Mapping):
        return thinking.get("type") == "enabled"
    return bool(thinking)


def _tool_use_ids(turn: _Turn) -> dict[str, None]:
    if turn.role != "assistant":
        return {}
    return {b.id: None for _, b in turn.blocks if b.type == "tool_use"}


def _check_latest_thinking(turn: _Turn, t: int) -> None:
    for j, (index, block) in enumerate(turn.blocks):
        if isinstance(block, ThinkingBlock) and not block.signature:
            raise HistoryError(
                "thinking blocks in the latest assistant message cannot be modified: the "
                "block has no signature",
                path=f"messages.{t}.content.{j}.signature",
                index=index,
            )
        if isinstance(block, RedactedThinkingBlock) and not block.data:
            raise HistoryError(
                "redacted_thinking blocks in the latest assistant message cannot be modified: "
                "the block has no data",
                path=f"messages.{t}.content.{j}.data",
                index=index,
            )


def _check_thinking_first(turn: _Turn, following: _Turn, t: int) -> None:
    open_loop = any(b.type == "tool_result" for _, b in following.blocks)
    if not open_loop or not turn.blocks:
        return
    index, first = turn.blocks[0]
    if first.type not in ("thinking", "redacted_thinking"):
        raise HistoryError(
            f"Expected `thinking` or `redacted_thinking`, but found `{first.type}`. When "
            "`thinking` is enabled, a final `assistant` message must start with a thinking "
            "block (preceding the lastmost set of `tool_use` and `tool_result` blocks). "
            "Include the thinking blocks exactly as received, or disable `thinking`.",
            path=f"messages.{t}.content.0.type",
            index=index,
        )
