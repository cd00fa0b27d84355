"""The history of a run, and the one place that changes it.

A run's messages are owned by a `History`: it starts them from the caller's history and
prompt, adds each model response (merging a `pause_turn` continuation), answers a turn's
tool calls with one user message of `tool_result` blocks, and closes a turn that a failure
or a cancellation cut short, so that every `tool_use` always has its result. The rules the
API enforces on a history (`lint_history`, `HistoryLinter`) and the mending of a history
from elsewhere (`repair`) live here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, HistoryError, InvalidResponseError
from .messages import (
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    ServerToolResultBlock,
    ServerToolUseBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    dump_history,
    parse_history,
)
from .providers.base import ModelResponse
from .tools import ToolCall, ToolResult

__all__ = (
    "History",
    "HistoryLinter",
    "RepairReport",
    "lint_history",
    "repair",
)

TRUNCATED_MESSAGE = (
    "Not run: this tool call was cut off by max_tokens, so its input is incomplete. "
    "Call the tool again with complete input (keep it shorter if needed)."
)


def not_an_object(value: Any) -> str:
    """The `is_error` text for a call whose input is not a JSON object."""
    kind = {str: "a string", list: "a list", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )
    shown = json.dumps(value, default=repr, ensure_ascii=False)
    shown = shown if len(shown) <= 200 else shown[:197] + "..."
    return (
        f"Not run: the input of this call was {kind} ({shown}), not a JSON object of "
        "arguments. Call the tool again with an object of named arguments."
    )


def call_of(block: ToolUseBlock, error: str | None = None) -> ToolCall:
    """The call a `tool_use` block asks for; one whose input is not an object must not run."""
    if error is None and not isinstance(block.input, dict):
        error = not_an_object(block.input)
    return ToolCall.from_block(block, error=error)


class History:
    """The messages of one run. Nothing else changes them.

    `messages` is the live list, for reading: providers serialise it, the linter checks
    it, and each message's wire form is cached, so a long history costs little per
    request.
    """

    def __init__(self, messages: Iterable[Message], linter: HistoryLinter | None = None) -> None:
        """Own `messages` (already parsed), checked by `linter` before each request."""
        self._messages: list[Message] = list(messages)
        self._linter = linter or HistoryLinter()

    @classmethod
    def start(
        cls,
        history: Iterable[Message | Mapping[str, Any]] | None,
        prompt: str | Sequence[ContentBlock] | None,
        linter: HistoryLinter | None = None,
    ) -> History:
        """`history` plus the prompt, merged into the last user turn if there is one.

        Raises:
            ConfigurationError: the prompt is not text or blocks, or there is nothing to send.
            HistoryError: an item of `history` is not a valid message.
        """
        if isinstance(history, (str, bytes, Mapping)):
            raise ConfigurationError(
                "history must be a list of messages (e.g. a previous RunResult.messages), "
                f"not {type(history).__name__}"
            )
        messages = parse_history(history or [])
        new = _prompt_blocks(prompt)
        if not new:
            if not messages:
                raise ConfigurationError("a run needs a prompt or a history to continue")
            return cls(messages, linter)
        if messages and messages[-1].role == "user":
            messages[-1] = Message.of_blocks("user", [*messages[-1].blocks, *new])
        elif isinstance(prompt, str):
            messages.append(Message.user(prompt))
        else:
            messages.append(Message.of_blocks("user", new))
        return cls(messages, linter)

    @property
    def messages(self) -> Sequence[Message]:
        """The history as it stands (do not change it: use the methods)."""
        return self._messages

    def check(self) -> None:
        """Check the history against the API's rules before it is sent.

        Raises:
            HistoryError: the first broken rule, in the API's wording.
        """
        self._linter.check(self._messages)

    def dump(self) -> list[dict[str, Any]]:
        """The wire form: JSON-serialisable dicts, valid to send again."""
        return dump_history(self._messages)

    @property
    def last_text(self) -> str:
        """The text of the latest assistant message ("" if there is none)."""
        last = next((m for m in reversed(self._messages) if m.role == "assistant"), None)
        return last.text if last is not None else ""

    # -- a model response

    def add_response(
        self, response: ModelResponse, errors: Mapping[str, str] | None = None
    ) -> list[ToolCall]:
        """Add an assistant response, content as received; return its tool calls.

        A continuation of a paused turn joins the assistant message before it, as the
        API treats consecutive assistant messages as one. A call in `errors` (by id), or
        one whose input is not an object, comes back with its `error` set: it is answered
        without running. Such an input is stored as `{}`, so the history stays valid to
        send; the error text quotes what the model sent.

        Raises:
            InvalidResponseError: the response repeats a `tool_use` id (of its own or of an
                earlier turn); nothing is added.
        """
        blocks = list(response.content)
        self._check_ids(blocks)
        calls: list[ToolCall] = []
        for i, block in enumerate(blocks):
            if isinstance(block, ToolUseBlock):
                call = call_of(block, (errors or {}).get(block.id))
                if not isinstance(block.input, dict):
                    blocks[i] = block.model_copy(update={"input": {}})
                calls.append(call)
        self._append_assistant(blocks)
        return calls

    def _check_ids(self, blocks: Sequence[ContentBlock]) -> None:
        seen = self._tool_use_ids()
        for block in blocks:
            if isinstance(block, ToolUseBlock):
                if block.id in seen:
                    raise InvalidResponseError(
                        f"the model's response repeats the tool_use id {block.id!r}; a "
                        "history holding it could not be sent again, so the response was "
                        "not added"
                    )
                seen.add(block.id)

    def _tool_use_ids(self) -> set[str]:
        return {u.id for m in self._messages if m.role == "assistant" for u in m.tool_uses}

    def _append_assistant(self, blocks: Sequence[ContentBlock]) -> None:
        last = self._messages[-1] if self._messages else None
        if last is not None and last.role == "assistant":
            self._messages[-1] = Message.of_blocks("assistant", [*last.blocks, *blocks])
        else:
            self._messages.append(Message.of_blocks("assistant", blocks))

    # -- tool results

    def answer(self, results: Sequence[ToolResult]) -> None:
        """Add one user message holding the `tool_result` blocks, in the calls' order."""
        if results:
            self._messages.append(Message.of_blocks("user", [r.to_block() for r in results]))

    def close(
        self,
        why: str,
        *,
        partial: Sequence[ContentBlock] | None = None,
        results: Mapping[str, ToolResult] | None = None,
    ) -> list[tuple[ToolCall, ToolResult]]:
        """Make the history valid after a failure or a cancellation cut a turn short.

        `partial` holds the blocks of a response that never completed (those that
        arrived whole); they are added as the assistant turn, less any `tool_use` whose id
        is already taken. Every `tool_use` of the last assistant turn without a result is
        then answered: with its entry in `results` if the call finished, else with an
        `is_error` result saying `why`. Returns the (call, result) pairs added.
        """
        if partial:
            seen = self._tool_use_ids()
            kept: list[ContentBlock] = []
            for block in partial:
                if isinstance(block, ToolUseBlock):
                    if block.id in seen:
                        continue
                    seen.add(block.id)
                    if not isinstance(block.input, dict):
                        block = block.model_copy(update={"input": {}})
                kept.append(block)
            if kept:
                self._append_assistant(kept)
        last = self._messages[-1] if self._messages else None
        if last is None or last.role != "assistant" or not last.tool_uses:
            return []
        finished = results or {}
        pairs = []
        for block in last.tool_uses:
            call = call_of(block)
            result = finished.get(call.id) or ToolResult.error(call, why, ran=False)
            pairs.append((call, result))
        self.answer([r for _, r in pairs])
        return pairs


def _prompt_blocks(prompt: Any) -> list[ContentBlock]:
    """The prompt as blocks ([] for none), refusing what cannot be a prompt."""
    if prompt is None or prompt == "":
        return []
    if isinstance(prompt, str):
        return [TextBlock(text=prompt)]
    if isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Sequence):
        raise ConfigurationError(
            f"a prompt is a string or a list of content blocks, not {type(prompt).__name__}"
        )
    blocks = list(prompt)
    if any(isinstance(b, (str, Mapping)) for b in blocks):
        # Plain strings or wire dicts: parse them the way a history is parsed.
        try:
            parsed = parse_history([{"role": "user", "content": blocks}])
        except HistoryError as exc:
            raise ConfigurationError(
                f"a prompt list must hold content blocks (e.g. TextBlock or "
                f'{{"type": "text", "text": ...}}): {exc}'
            ) from exc
        return list(parsed[0].blocks)
    return blocks


# --------------------------------------------------------------------------- linter


@dataclass
class _Turn:
    """Consecutive messages of one role, merged as the API merges them."""

    role: str
    start: int  # index of its first message
    blocks: list[tuple[int, Any]]  # (index of the original message, block)


def _turns(messages: Sequence[Message], offset: int = 0) -> list[_Turn]:
    """The turns of `messages` as the Messages API receives them.

    Thinking blocks without a signature are never sent (see `Message.signed_only`), so
    they are not checked; a message holding nothing else is not sent at all.
    """
    turns: list[_Turn] = []
    for index, message in enumerate(messages, offset):
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


def _check_sources(
    block: Any, path: str, index: int, allow_file_sources: bool, nested: bool = False
) -> None:
    kind = block.type
    if kind == "tool_result" and isinstance(block.content, tuple):
        for k, inner in enumerate(block.content):
            _check_sources(
                inner, f"{path}.tool_result.content.{k}", index, allow_file_sources, True
            )
        return
    if kind not in _SOURCE_TAGS:
        return
    allowed = _SOURCE_TAGS[kind] + (("file",) if allow_file_sources else ())
    source = getattr(block, "source", {})
    tag = source.get("type") if isinstance(source, dict) else None
    if tag not in allowed:
        expected = ", ".join(f"'{t}'" for t in allowed)
        where = f"{path}.{kind}.source" if nested else f"{path}.source"
        raise HistoryError(
            f"Input tag '{tag}' found using 'type' does not match any of the expected tags: "
            f"{expected}",
            path=where,
            index=index,
        )


def lint_history(
    messages: Sequence[Message],
    *,
    thinking: bool = False,
    tool_choice: Mapping[str, Any] | None = None,
    allow_file_sources: bool = False,
) -> None:
    """Check a history against the rules the Messages API enforces, before it is sent.

    Args:
        messages: The history, as `Message`s (see `parse_history` for dicts).
        thinking: Whether extended thinking is enabled for the request.
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
        thinking: bool = False,
        tool_choice: Mapping[str, Any] | None = None,
        allow_file_sources: bool = False,
    ) -> None:
        """Create a linter for requests with these options (see `lint_history`)."""
        self.thinking = thinking
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
        if self.thinking and choice and choice.get("type") in ("any", "tool"):
            raise HistoryError("Thinking may not be enabled when tool_choice forces tool use.")
        if not messages:
            raise HistoryError("at least one message is required", path="messages")
        if messages[0].role != "user":
            raise HistoryError(
                "first message must use the user role (see repair())", path="messages.0", index=0
            )
        if self._start > len(messages) or (
            self._start and messages[self._start - 1] is not self._anchor
        ):
            self._reset()
        turns = _turns(messages[self._start :], self._start)
        if not turns:  # nothing but unsigned thinking, which is never sent
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
            _check_sources(block, path, index, self.allow_file_sources)
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
                if not isinstance(block.input, dict):
                    raise HistoryError(
                        "Input should be a valid dictionary", path=f"{path}.input", index=index
                    )
                caller = (block.__pydantic_extra__ or {}).get("caller")
                if isinstance(caller, dict) and caller.get("tool_id"):
                    state.pending_server.pop(str(caller["tool_id"]), None)
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
        if self.thinking and final.role == "user" and assistant == len(turns) - 2:
            _check_thinking_first(turns[assistant], final, last_assistant)


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


# --------------------------------------------------------------------------- repair


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
    Thinking blocks, signatures and tool_use inputs are never touched.
    """
    messages = parse_history(history)
    changes: list[str] = []
    out: list[Message] = []
    if messages and messages[0].role == "assistant":
        changes.append("added a user message before the first (assistant) message")
        out.append(Message.user(CONTINUED_MESSAGE))
    for i, message in enumerate(messages):
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
        if message.role == "assistant":
            continue
    # An assistant turn with tool_use at the end (or followed by another assistant turn).
    fixed: list[Message] = []
    for i, message in enumerate(out):
        fixed.append(message)
        uses = message.tool_uses if message.role == "assistant" else []
        following = out[i + 1] if i + 1 < len(out) else None
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
    previous = out[-1] if out and out[-1].role == "assistant" else None
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
