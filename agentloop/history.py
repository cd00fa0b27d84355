"""The history of a run, and the one place that changes it.

A run's messages are owned by a `History`: it starts them from the caller's history and
prompt, adds each model response (merging a `pause_turn` continuation; text the API would
refuse to take back, empty or blank, is left out), and answers a turn's tool calls with
one user message of `tool_result` blocks (`answer_turn`, for a finished, cut-short or
resumed turn alike), so that every `tool_use` always has its result. Before each request
it is checked by a `HistoryLinter` (`agentloop.lint`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .calls import ToolCall, ToolResult
from .errors import ConfigurationError, HistoryError, InvalidResponseError
from .lint import HistoryLinter
from .messages import (
    ContentBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    dump_history,
    parse_history,
)
from .providers.base import ModelResponse

__all__ = ("TRUNCATED_MESSAGE", "History", "call_of", "last_user_input", "not_an_object")


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
        self._silent = False  # the latest response had nothing to keep
        # Every tool_use id of the history, kept as it grows: a new response's ids are
        # checked against it each round without reading the whole history again.
        self._tool_use_ids = {
            u.id for m in self._messages if m.role == "assistant" for u in m.tool_uses
        }

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
        """The text of the latest assistant message.

        "" if there is none, or if the model's latest answer had nothing the history keeps.
        """
        if self._silent:
            return ""
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
        new: set[str] = set()
        for block in blocks:
            if isinstance(block, ToolUseBlock):
                if block.id in self._tool_use_ids or block.id in new:
                    raise InvalidResponseError(
                        f"the model's response repeats the tool_use id {block.id!r}; a "
                        "history holding it could not be sent again, so the response was "
                        "not added"
                    )
                new.add(block.id)

    def _append_assistant(self, blocks: Sequence[ContentBlock]) -> None:
        """Add the model's blocks, as received, less the text the API would not take back.

        An empty text block is refused wherever it stands, and an assistant turn of blank
        text alone is refused once a turn follows it: an answer of nothing but that adds
        no message, so the history stays valid to continue.
        """
        last = self._messages[-1] if self._messages else None
        merge = last is not None and last.role == "assistant"
        kept = [b for b in blocks if not (isinstance(b, TextBlock) and b.text == "")]
        if not merge and _blank(kept):
            kept = [b for b in kept if not isinstance(b, TextBlock)]
        self._silent = not merge and not kept
        if self._silent:
            return
        if last is not None and merge:
            self._messages[-1] = Message.of_blocks("assistant", [*last.blocks, *kept])
        else:
            self._messages.append(Message.of_blocks("assistant", kept))
        self._tool_use_ids.update(b.id for b in kept if isinstance(b, ToolUseBlock))

    # -- tool results

    def answer_turn(
        self,
        results: Mapping[str, ToolResult],
        missing: str,
        *,
        partial: Sequence[ContentBlock] | None = None,
    ) -> list[tuple[ToolCall, ToolResult]]:
        """Answer every call of the turn: one user message of `tool_result` blocks.

        The one place the rule "every `tool_use` gets exactly one result, in the next
        user message, in order" is kept, for a turn that finished, one a failure or a
        cancellation cut short, and a paused turn resumed. Each `tool_use` of the last
        assistant message gets its entry in `results` (by id), or, if it has none, an
        `is_error` result saying `missing` (the call did not finish).

        `partial` holds the blocks of a response that never completed (those that
        arrived whole): they are added first as the assistant turn, less any `tool_use`
        whose id is already taken. Returns the (call, result) pairs added, in order.
        """
        if partial:
            self._add_partial(partial)
        last = self._messages[-1] if self._messages else None
        if last is None or last.role != "assistant" or not last.tool_uses:
            return []
        pairs = []
        for block in last.tool_uses:
            call = call_of(block)
            result = results.get(call.id) or ToolResult.error(call, missing, ran=False)
            pairs.append((call, result))
        self._messages.append(Message.of_blocks("user", [r.to_block() for _, r in pairs]))
        return pairs

    def _add_partial(self, blocks: Sequence[ContentBlock]) -> None:
        new: set[str] = set()
        kept: list[ContentBlock] = []
        for block in blocks:
            if isinstance(block, ToolUseBlock):
                if block.id in self._tool_use_ids or block.id in new:
                    continue
                new.add(block.id)
                if not isinstance(block.input, dict):
                    block = block.model_copy(update={"input": {}})
            kept.append(block)
        if kept:
            self._append_assistant(kept)

    def add_user(self, text: str) -> None:
        """Add a user message of `text` after the model's answer (e.g. why it is sent back).

        Merged into the last message when that is a user message already.
        """
        block = TextBlock(text=text)
        last = self._messages[-1] if self._messages else None
        if last is not None and last.role == "user":
            self._messages[-1] = Message.of_blocks("user", [*last.blocks, block])
        else:
            self._messages.append(Message.of_blocks("user", [block]))


def _blank(blocks: Sequence[ContentBlock]) -> bool:
    """Whether what of `blocks` is sent is whitespace text and nothing else.

    Unsigned thinking (reasoning text of another vendor) is never sent, so it does not count.
    """
    sent = [b for b in blocks if not (isinstance(b, ThinkingBlock) and b.unsigned)]
    return all(isinstance(b, TextBlock) and not b.text.strip() for b in sent)


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


def last_user_input(messages: Sequence[Message]) -> str | Sequence[ContentBlock] | None:
    """What the user says last in `messages`, a history given without a prompt.

    The last message's content when it is the user's, its tool results left out (they
    answer the model; they are not the user's words); None when nothing is left.
    """
    if not messages or messages[-1].role != "user":
        return None
    content = messages[-1].content
    if isinstance(content, str):
        return content or None
    said = tuple(b for b in content if not isinstance(b, ToolResultBlock))
    return said or None
