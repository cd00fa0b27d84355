"""Content blocks and messages: the immutable wire values every step of the loop passes on.

Blocks are wire-exact pydantic models: parsing a response and dumping it again gives the
same JSON (fields the API sent are kept, even unknown ones and explicit nulls; fields it did
not send are not invented), and a block type this version does not know passes through as
`UnknownBlock` with all its fields. The rules a history must follow live in
`agentloop.lint`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import cached_property
from typing import Annotated, Any, Literal, TypeVar, Union, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    StrictBool,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticSerializationError

from ._wire import compact_json
from .errors import HistoryError

_T = TypeVar("_T")

__all__ = (
    "ROLES",
    "SERVER_TOOL_RESULT_TYPES",
    "ContentBlock",
    "DocumentBlock",
    "ImageBlock",
    "Message",
    "RedactedThinkingBlock",
    "ServerToolResultBlock",
    "ServerToolUseBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "UnknownBlock",
    "dump_history",
    "json_problem",
    "parse_history",
)


ROLES = frozenset({"user", "assistant"})
"""The roles whose turns the history rules are about. A message of another role (a
mid-conversation `system` message) is kept and sent as it is; the linter, `repair` and
the runner step over it, and the API judges where it stands."""

OTHER_ROLES = frozenset({"system"})
"""The roles the API takes beside `ROLES`: a mid-conversation system message (under its
beta). The linter refuses any other role; `history_check="off"` sends it anyway."""


class _Block(BaseModel):
    """Common base: keep every field the API sent, dump only what was set."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

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

    @classmethod
    def from_file_id(cls, file_id: str) -> ImageBlock:
        """The image uploaded through the Files API as `file_id` (see `agentloop.files`)."""
        return cls(source={"type": "file", "file_id": file_id})


class DocumentBlock(_Block):
    """A document (PDF, plain text, custom content); `source` is kept as sent."""

    type: Literal["document"] = "document"
    source: dict[str, Any]

    @classmethod
    def from_file_id(
        cls, file_id: str, *, title: str | None = None, citations: bool = False
    ) -> DocumentBlock:
        """The document uploaded through the Files API as `file_id` (see `agentloop.files`).

        Args:
            file_id: The id the upload returned (`file_...`).
            title: A title the model sees with the document.
            citations: Whether the model may cite passages of it.
        """
        fields: dict[str, Any] = {"source": {"type": "file", "file_id": file_id}}
        if title is not None:
            fields["title"] = title
        if citations:
            fields["citations"] = {"enabled": True}
        return cls(**fields)


class ThinkingBlock(_Block):
    """Extended thinking; `signature` must go back byte-exact with the text it signs.

    A block without a signature (`signature` absent or null) holds reasoning text from a
    server that returns it unsigned (`reasoning_content` of a Chat Completions server). It
    is kept in the history but never sent to the Messages API, which would refuse it:
    see `Message.signed_only`.
    """

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str | None = None

    @property
    def unsigned(self) -> bool:
        """Whether this is reasoning text without a signature (never sent to Anthropic)."""
        return self.signature is None


class RedactedThinkingBlock(_Block):
    """Thinking the API encrypted; `data` goes back untouched."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ToolUseBlock(_Block):
    """The model asks for a client tool call; answered by a `ToolResultBlock` with its `id`."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: Any
    """The call's arguments: an object, as the API sends them (kept as received)."""


class ToolResultBlock(_Block):
    """The answer to one `tool_use`, sent in the user message right after it."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | tuple[ContentBlock, ...] = ""
    is_error: StrictBool = False
    """Exactly `true` or `false`, as the API takes it (`"yes"` or `1` is refused, not read)."""

    @property
    def text(self) -> str:
        """The result's text: the content itself, or its text blocks joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


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
    """One message of a history: an immutable value, as on the wire.

    `role` is `"user"` or `"assistant"`, or a role this version does not know (a
    mid-conversation `"system"` message, under its beta), kept as sent: the linter and the
    runner step over such messages, and the API judges them.

    `content` is a string or a tuple of blocks. Messages and blocks are frozen, and a
    message's wire form is computed once and cached, which keeps the per-request cost of
    a long history low; `model_copy` and `copy` drop that cache, so the bytes sent can
    never disagree with the content.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    role: str
    content: str | tuple[ContentBlock, ...]

    @classmethod
    def user(cls, content: str | Sequence[ContentBlock]) -> Message:
        """A user message."""
        return cls(role="user", content=content if isinstance(content, str) else tuple(content))

    @classmethod
    def of_blocks(cls, role: str, blocks: Iterable[Any]) -> Message:
        """A message from blocks that are already typed block objects, without re-validating.

        The runner builds every message it adds this way: its blocks were validated when
        they were parsed or made, and validating a thousand results again per turn is
        most of the cost of a large turn.
        """
        return cls.model_construct(role=role, content=tuple(blocks))

    @property
    def blocks(self) -> tuple[ContentBlock, ...]:
        """The content as blocks (a string content is one text block)."""
        if isinstance(self.content, str):
            return (TextBlock(text=self.content),) if self.content else ()
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
    def signed_only(self) -> Message | None:
        """This message as the Messages API may receive it (computed once).

        Thinking blocks without a signature (reasoning text another vendor returned) are
        left out: the API refuses them. The message itself when it has none; None when
        nothing else is left (the message is then not sent at all).
        """
        if isinstance(self.content, str) or not any(
            isinstance(b, ThinkingBlock) and b.unsigned for b in self.content
        ):
            return self
        kept = [b for b in self.content if not (isinstance(b, ThinkingBlock) and b.unsigned)]
        return Message.of_blocks(self.role, kept) if kept else None

    def converted(self, key: Hashable, convert: Callable[[Message], _T]) -> _T:
        """`convert(self)`, computed once per `key` and kept with this message.

        A provider that sends another wire format keeps its form of each message here,
        under a key of its own (its format and options), so a long history is converted
        once rather than on every request. The cache lives and dies with the message;
        copies start without it.
        """
        cache: dict[Hashable, Any] | None = self.__dict__.get("_converted")
        if cache is None:
            cache = self.__dict__["_converted"] = {}
        try:
            return cast("_T", cache[key])
        except KeyError:
            value = cache[key] = convert(self)
            return value

    @cached_property
    def wire_json(self) -> bytes:
        """The wire form as JSON bytes (computed once), for building request bodies.

        Text holding lone surrogates (which UTF-8 cannot carry) is written with JSON
        escapes, exactly as the API itself sends such text.
        """
        try:
            return self.__pydantic_serializer__.to_json(self, exclude_unset=True)
        except (PydanticSerializationError, UnicodeError):
            return compact_json(self.wire)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Message:
        """A copy with `update` applied (and validated); its wire form is computed afresh."""
        if update:
            fields = {"role": self.role, "content": self.content, **(self.__pydantic_extra__ or {})}
            return type(self).model_validate({**fields, **update})
        return super().model_copy(deep=deep)

    def __copy__(self) -> Message:
        return _uncached(super().__copy__())

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Message:
        return _uncached(super().__deepcopy__(memo))


def _uncached(message: Message) -> Message:
    """`message` without the cached wire forms it was copied with."""
    for name in ("wire", "wire_json", "signed_only", "_converted"):
        message.__dict__.pop(name, None)
    return message


_HISTORY = TypeAdapter(list[Message])


def parse_history(items: Iterable[Message | Mapping[str, Any]]) -> list[Message]:
    """Turn a history of `Message`s or wire dicts (e.g. `RunResult.messages`) into messages.

    A wire dict must hold JSON values only (see `json_problem`): anything else (NaN, bytes,
    a set, a key that is not a string, a cycle) would be sent changed or not at all.

    Raises:
        HistoryError: an item is not a valid message, naming where.
    """
    items = list(items)
    if all(isinstance(m, Message) for m in items):
        return items  # type: ignore[return-value]
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            problem = json_problem(item)
            if problem is not None:
                where, why = problem
                raise HistoryError(why, path=f"messages.{i}{where}", index=i)
    try:
        return _HISTORY.validate_python([m.wire if isinstance(m, Message) else m for m in items])
    except ValidationError as exc:
        raise _invalid(exc) from exc


def _invalid(exc: ValidationError) -> HistoryError:
    """The most precise problem of a validation error, with its path as the API writes it."""
    errors = exc.errors(include_url=False)
    # A content that fits neither a string nor a list of blocks fails both: the deepest
    # failure says what is wrong inside it.
    first = max(errors, key=lambda e: len(e["loc"]))
    # Left out of the path: which type of the union was tried (ours, not the API's words).
    loc = [
        p for p in first["loc"] if p not in ("str", "unknown") and not str(p).startswith("tuple[")
    ]
    path = "messages." + ".".join(str(p) for p in loc if not isinstance(p, str) or p)
    message = first["msg"]
    if loc and loc[-1] == "content" and first["type"] in ("string_type", "tuple_type"):
        message = "content must be a string or a list of content blocks"
    elif first["loc"][-1] == "unknown":
        message = f"a content block is an object with a type, not {type(first['input']).__name__}"
    index = loc[0] if loc and isinstance(loc[0], int) else None
    return HistoryError(f"{message} ({exc.error_count()} problem(s))", path=path, index=index)


def json_problem(value: Any) -> tuple[str, str] | None:
    """Where `value` stops being JSON, and why; None when it is JSON all through.

    JSON here is dicts with string keys, lists and tuples, strings, booleans, None, whole
    numbers and finite floats; content blocks and messages are read as their fields. The
    place is a path suffix (`.content.0.input.x`), the reason a sentence.
    """
    on_path: set[int] = set()  # containers between the root and the value looked at

    def walk(item: Any, path: str) -> tuple[str, str] | None:
        if item is None or isinstance(item, (str, bool, int)):
            return None
        if isinstance(item, float):
            return None if math.isfinite(item) else (path, f"{item} is not a JSON number")
        if isinstance(item, (_Block, Message)):
            item = item.model_dump(exclude_unset=True)
        if not isinstance(item, (dict, list, tuple)):
            return (path, f"a value of type {type(item).__name__} is not JSON")
        if id(item) in on_path:
            return (path, "a value that contains itself (a cycle) is not JSON")
        on_path.add(id(item))
        try:
            if isinstance(item, dict):
                for key, inner in item.items():
                    if not isinstance(key, str):
                        return (path, f"a key of type {type(key).__name__} is not JSON")
                    found = walk(inner, f"{path}.{key}")
                    if found is not None:
                        return found
            else:
                for k, inner in enumerate(item):
                    found = walk(inner, f"{path}.{k}")
                    if found is not None:
                        return found
        finally:
            on_path.discard(id(item))
        return None

    try:
        return walk(value, "")
    except RecursionError:
        return ("", "a value nested this deeply is not sent")


def dump_history(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The wire form of a history: JSON-serialisable dicts, ready for the API."""
    return [m.to_wire() for m in messages]
