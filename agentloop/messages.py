"""Content blocks, messages and the history rules: the values every step of the loop passes on.

Blocks are wire-exact pydantic models: parsing a response and dumping it again gives the
same JSON (fields the API sent are kept, even unknown ones and explicit nulls; fields it did
not send are not invented), and a block type this version does not know passes through as
`UnknownBlock` with all its fields. `lint_history` is the one place that owns the rules the
API enforces on a history; `repair` mends a history that came from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError

from .errors import HistoryError

__all__ = (
    "SERVER_TOOL_RESULT_TYPES",
    "ContentBlock",
    "DocumentBlock",
    "HistoryLinter",
    "ImageBlock",
    "Message",
    "RedactedThinkingBlock",
    "RepairReport",
    "ServerToolResultBlock",
    "ServerToolUseBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "UnknownBlock",
    "dump_history",
    "lint_history",
    "parse_history",
    "repair",
)


class _Block(BaseModel):
    """Common base: keep every field the API sent, dump only what was set."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def model_post_init(self, context: Any, /) -> None:
        # `type` has a default so blocks are easy to build by hand, but it must always be
        # dumped: mark it as set, so `exclude_unset` dumps keep it.
        self.__pydantic_fields_set__.add("type")

    def to_wire(self) -> dict[str, Any]:
        """The block exactly as it goes into a request body."""
        return self.model_dump(mode="json", exclude_unset=True)


class TextBlock(_Block):
    """Plain text, from the user or the model (with `citations` kept when present)."""

    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Block):
    """An image; `source` is kept as sent (`base64`, `url`, or `file` with the Files beta)."""

    type: Literal["image"] = "image"
    source: dict[str, Any]


class DocumentBlock(_Block):
    """A document (PDF, plain text, custom content); `source` is kept as sent."""

    type: Literal["document"] = "document"
    source: dict[str, Any]


class ThinkingBlock(_Block):
    """Extended thinking; `signature` must go back byte-exact with the text it signs."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class RedactedThinkingBlock(_Block):
    """Thinking the API encrypted; `data` goes back untouched."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ToolUseBlock(_Block):
    """The model asks for a client tool call; answered by a `ToolResultBlock` with its `id`."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    """The answer to one `tool_use`, sent in the user message right after it."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | list[ContentBlock] = ""
    is_error: bool = False


class ServerToolUseBlock(_Block):
    """A call of a tool the API runs itself (web search, code execution, ...)."""

    type: Literal["server_tool_use", "mcp_tool_use"] = "server_tool_use"
    id: str
    name: str
    input: dict[str, Any] = {}


SERVER_TOOL_RESULT_TYPES = frozenset(
    {
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_result",
    }
)
"""Block types that carry the result of a server-side tool call inside an assistant turn."""


class ServerToolResultBlock(_Block):
    """The result of a server tool call, inside the assistant turn; `content` kept as sent."""

    type: str
    tool_use_id: str
    content: Any = None


class UnknownBlock(_Block):
    """A block type this version does not know, passed through with all its fields."""

    type: str


_KNOWN_TAGS = {
    "text",
    "image",
    "document",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "tool_result",
    "server_tool_use",
    "mcp_tool_use",
}


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in _KNOWN_TAGS:
        return "mcp_tool_use" if kind == "mcp_tool_use" else str(kind)
    if kind in SERVER_TOOL_RESULT_TYPES:
        return "server_tool_result"
    return "unknown"


ContentBlock = Annotated[
    Union[  # noqa: UP007
        Annotated[TextBlock, Tag("text")],
        Annotated[ImageBlock, Tag("image")],
        Annotated[DocumentBlock, Tag("document")],
        Annotated[ThinkingBlock, Tag("thinking")],
        Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
        Annotated[ToolUseBlock, Tag("tool_use")],
        Annotated[ToolResultBlock, Tag("tool_result")],
        Annotated[ServerToolUseBlock, Tag("server_tool_use")],
        Annotated[ServerToolUseBlock, Tag("mcp_tool_use")],
        Annotated[ServerToolResultBlock, Tag("server_tool_result")],
        Annotated[UnknownBlock, Tag("unknown")],
    ],
    Discriminator(_block_tag),
]
"""Any content block: the known types, typed; anything else as `UnknownBlock`."""

ToolResultBlock.model_rebuild()


class Message(BaseModel):
    """One message of a history. `content` is a string or a list of blocks, as on the wire.

    Treat messages as immutable values: their wire form is computed once and cached, which
    keeps the per-request cost of a long history low.
    """

    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    @classmethod
    def user(cls, content: str | Sequence[ContentBlock]) -> Message:
        """A user message."""
        return cls(role="user", content=content if isinstance(content, str) else list(content))

    @classmethod
    def assistant(cls, content: str | Sequence[ContentBlock]) -> Message:
        """An assistant message."""
        return cls(role="assistant", content=content if isinstance(content, str) else list(content))

    @classmethod
    def of_blocks(cls, role: Literal["user", "assistant"], blocks: Sequence[Any]) -> Message:
        """A message from blocks that are already typed block objects, without re-validating.

        The runner builds every message it adds this way: its blocks were validated when
        they were parsed or made, and validating a thousand results again per turn is
        most of the cost of a large turn.
        """
        return cls.model_construct(role=role, content=list(blocks))

    @property
    def blocks(self) -> list[ContentBlock]:
        """The content as blocks (a string content is one text block)."""
        if isinstance(self.content, str):
            return [TextBlock(text=self.content)] if self.content else []
        return self.content

    @property
    def text(self) -> str:
        """The text blocks of this message, joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        """The client tool calls this message asks for, in order."""
        if isinstance(self.content, str):
            return []
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    @cached_property
    def wire(self) -> dict[str, Any]:
        """The message exactly as it goes into a request body (computed once)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def to_wire(self) -> dict[str, Any]:
        """A fresh copy of the wire form, safe for the caller to change."""
        return self.model_dump(mode="json", exclude_unset=True)

    @cached_property
    def wire_json(self) -> bytes:
        """The wire form as JSON bytes (computed once), for building request bodies."""
        return self.__pydantic_serializer__.to_json(self, exclude_unset=True)


_HISTORY = TypeAdapter(list[Message])


def parse_history(items: Iterable[Message | Mapping[str, Any]]) -> list[Message]:
    """Turn a history of `Message`s or wire dicts (e.g. `RunResult.messages`) into messages.

    Raises:
        HistoryError: an item is not a valid message, naming where.
    """
    items = list(items)
    if all(isinstance(m, Message) for m in items):
        return items  # type: ignore[return-value]
    try:
        return _HISTORY.validate_python([m.wire if isinstance(m, Message) else m for m in items])
    except ValidationError as exc:
        first = exc.errors()[0]
        path = "messages." + ".".join(str(p) for p in first["loc"] if not isinstance(p, str) or p)
        raise HistoryError(f"{first['msg']} ({exc.error_count()} problem(s))", path=path) from exc


def dump_history(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The wire form of a history: JSON-serialisable dicts, ready for the API."""
    return [m.to_wire() for m in messages]


# --------------------------------------------------------------------------- linter


@dataclass
class _Turn:
    """Consecutive messages of one role, merged as the API merges them."""

    role: str
    start: int  # index of its first message
    blocks: list[tuple[int, Any]]  # (index of the original message, block)


def _turns(messages: Sequence[Message], offset: int = 0) -> list[_Turn]:
    turns: list[_Turn] = []
    for index, message in enumerate(messages, offset):
        if isinstance(message.content, str):
            blocks: list[Any] = [TextBlock(text=message.content)]
        else:
            blocks = list(message.content)
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
    if kind == "tool_result" and isinstance(block.content, list):
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
        if self._start > len(messages) or (
            self._start and messages[self._start - 1] is not self._anchor
        ):
            self._reset()
        turns = _turns(messages[self._start :], self._start)
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
    duplicate tool_results, moves tool_results to the front of their user message, and
    drops empty text blocks and messages left empty. Thinking blocks, signatures and
    tool_use inputs are never touched.
    """
    messages = parse_history(history)
    changes: list[str] = []
    out: list[Message] = []
    for i, message in enumerate(messages):
        blocks = message.blocks
        kept = [b for b in blocks if not (isinstance(b, TextBlock) and b.text == "")]
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
