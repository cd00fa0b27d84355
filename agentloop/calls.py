"""The values of a tool call: what the model asked for, and what goes back to it.

`ToolDefinition` announces a tool in a request; `ToolCall` is one call a response asks
for; `ToolResult` is its outcome, ready to become a `tool_result` block. They are
provider-neutral values, below everything that runs calls (`agentloop.tools` makes the
tools, `agentloop.registry` runs them).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import ConfigurationError, HistoryError
from .lint import check_result_content
from .messages import (
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    json_problem,
)
from .result import Spent

__all__ = (
    "AnnouncedTool",
    "CallPaused",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "describe_exception",
    "sendable",
    "to_content",
    "wire_tool_name",
)

_BLOCKS = TypeAdapter(list[ContentBlock])


@dataclass(frozen=True)
class ToolDefinition:
    """A tool as a model request announces it: provider-neutral."""

    name: str
    description: str
    input_schema: dict[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further wire fields sent with the definition (e.g. `cache_control`)."""
    type: str | None = None
    """For a tool whose schema the Messages API defines and its models are trained on
    (the memory tool's `memory_20250818`): the `type` announced in place of the
    description and schema, which a provider without such tools (Chat Completions)
    still announces."""

    def to_wire(self) -> dict[str, Any]:
        """The Anthropic `tools[]` entry."""
        if self.type is not None:
            return {"type": self.type, "name": self.name, **self.extra}
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            **self.extra,
        }


AnnouncedTool = Union[ToolDefinition, Mapping[str, Any]]  # noqa: UP007 (an alias read at run time)
"""A tool as a request announces it: a `ToolDefinition`, or a wire dict (an external tool,
a kind the API runs itself)."""


def wire_tool_name(definition: ToolDefinition | Mapping[str, Any]) -> str | None:
    """The name a tool definition announces, or None for a tool kind without one.

    Some kinds the API runs itself carry no name (the MCP connector's
    `{"type": "mcp_toolset", "mcp_server_name": ...}`): they are announced as they are,
    and the model never calls them by a name of theirs.

    Raises:
        ConfigurationError: the definition has neither a name nor a `type`, or its name
            is not a non-empty string.
    """
    if isinstance(definition, ToolDefinition):
        name: Any = definition.name
    else:
        name = definition.get("name")
        kind = definition.get("type")
        if name is None and isinstance(kind, str) and kind:
            return None
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            "a tool needs a name, unless it is a tool kind without one (a `type` such as "
            f"mcp_toolset): {definition!r}"[:500]
        )
    return name


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: provider-neutral."""

    id: str
    name: str
    input: dict[str, Any]
    error: str | None = None
    """Why this call must not run (its input was cut off, was not valid JSON, was not an
    object, ...): the loop answers it with an `is_error` result carrying this text,
    without running the tool, whatever kind of tool it names."""

    @classmethod
    def from_block(cls, block: ToolUseBlock, *, error: str | None = None) -> ToolCall:
        """The call a `tool_use` block asks for (with `error` if it must not run)."""
        return cls(id=block.id, name=block.name, input=block.input, error=error)


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call, ready to become a `tool_result` block."""

    tool_use_id: str
    name: str
    content: str | list[ContentBlock] | None
    """What the model sees; `None` for a tool that returned nothing."""
    is_error: bool = False
    duration: float = 0.0
    """Seconds the tool ran (not counting the wait for a concurrency slot)."""
    ran: bool = True
    """False when the call was answered without running the tool (cut off, cancelled)."""
    paused: dict[str, Any] | None = None
    """The state of a run the call started that paused (a sub-agent's, see `CallPaused`):
    then the call has no answer yet, and waits with that run for its caller."""
    spent: Spent | None = None
    """What was spent on the run's behalf while the call ran (a sub-run, a capability's
    own requests: `RunContext.add_usage`), which the run counts when it takes the
    result, so a durable run that records the result records it too. None: nothing."""

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON values; `from_json` turns them back into an equal one.

        How a result is recorded outside the process (a durable run's step, a paused run).
        """
        content = self.content
        data: dict[str, Any] = {
            "tool_use_id": self.tool_use_id,
            "name": self.name,
            "content": content if not isinstance(content, list) else [b.to_wire() for b in content],
            "is_error": self.is_error,
            "duration": self.duration,
            "ran": self.ran,
        }
        if self.spent is not None:
            data["spent"] = self.spent.to_json()
        return data if self.paused is None else data | {"paused": self.paused}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolResult:
        """The result `to_json` recorded.

        Raises:
            ValueError: `data` is not what `to_json` writes.
        """
        try:
            content = data["content"]
            if isinstance(content, list):
                content = _BLOCKS.validate_python(content)
            elif content is not None and not isinstance(content, str):
                raise TypeError(f"content is a {type(content).__name__}")
            paused = data.get("paused")  # absent from what an earlier version recorded
            if paused is not None and not isinstance(paused, dict):
                raise TypeError(f"paused is a {type(paused).__name__}")
            spent = data.get("spent")
            return cls(
                str(data["tool_use_id"]),
                str(data["name"]),
                content,
                is_error=bool(data["is_error"]),
                duration=float(data["duration"]),
                ran=bool(data["ran"]),
                paused=paused,
                spent=None if spent is None else Spent.from_json(spent),
            )
        except (KeyError, TypeError, AttributeError, ValidationError) as exc:
            raise ValueError(f"not a recorded tool result: {exc}"[:500]) from exc

    def with_spent(self, spent: Spent) -> ToolResult:
        """This result, also carrying what was `spent` while the call ran (see `spent`)."""
        if spent.nothing:
            return self
        return replace(self, spent=spent if self.spent is None else self.spent + spent)

    @classmethod
    def from_block(cls, block: ToolResultBlock, name: str) -> ToolResult:
        """The result a `tool_result` block holds (of a call of `name` not run here)."""
        content = block.content
        return cls(
            block.tool_use_id,
            name,
            content if isinstance(content, str) else list(content),
            is_error=block.is_error,
            ran=False,
        )

    @classmethod
    def error(
        cls, call: ToolCall, message: str, duration: float = 0.0, *, ran: bool = True
    ) -> ToolResult:
        """An `is_error` result carrying `message`."""
        return cls(call.id, call.name, message, is_error=True, duration=duration, ran=ran)

    def to_block(self) -> ToolResultBlock:
        """The `tool_result` block for the history."""
        fields: dict[str, Any] = {"tool_use_id": self.tool_use_id}
        if self.content is not None and self.content != "":
            fields["content"] = self.content
        if self.is_error:
            fields["is_error"] = True
        return ToolResultBlock(**fields)  # only the fields set here are dumped

    @property
    def text(self) -> str:
        """The content as text (block content joined), for logs and the tool-call log."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text if isinstance(b, TextBlock) else f"[{b.type}]" for b in self.content)


@dataclass(frozen=True)
class CallPaused:
    """What a tool returns when its call waits: a run it started paused.

    A sub-agent's tool (`Agent.as_tool`) returns it when the sub-agent's run ends with
    calls waiting for approval or for the caller. The call then gets no result: the
    calling run pauses too, with this state inside its own, and resuming it resumes
    this run first.
    """

    state: dict[str, Any]
    """The paused run's `RunResult.state`."""


_BLOCK_OUTPUTS = (TextBlock, ImageBlock, DocumentBlock)


def to_content(value: Any) -> str | list[ContentBlock] | None:
    """What the model sees for a tool's return value.

    str as is; None as an empty success; bytes as their text when they are UTF-8, else
    in base64 after a line saying so; a content block, or a list of them, as block
    content (empty text blocks left out); a pydantic model as its JSON; anything else
    JSON-encodable as JSON.

    Raises:
        TypeError: the value cannot be sent to the model: an object pydantic cannot
            serialise, a cycle, bytes that are not UTF-8 inside a container, a block the
            API would refuse. The message says what is wrong.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_text(bytes(value))
    if isinstance(value, _BLOCK_OUTPUTS):
        return _result_blocks([value])
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, _BLOCK_OUTPUTS) for v in value)
    ):
        return _result_blocks(value)
    try:
        if isinstance(value, BaseModel):
            return value.model_dump_json()
        return pydantic_core.to_json(value).decode()
    except Exception as exc:  # the value's own code may run here (a generator, a serialiser)
        raise TypeError(
            f"it is not JSON ({type(value).__name__} value; {describe_exception(exc)})"
        ) from exc


def _bytes_text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        encoded = base64.b64encode(data).decode()
        return f"[{len(data)} bytes that are not UTF-8 text, in base64:]\n{encoded}"


def _result_blocks(blocks: Sequence[ContentBlock]) -> list[ContentBlock] | None:
    """Blocks a tool returned, less empty text (the API refuses it), checked as the API would."""
    kept = [b for b in blocks if not (isinstance(b, TextBlock) and b.text == "")]
    for k, block in enumerate(kept):
        problem = json_problem(block)
        if problem is not None:
            where, why = problem
            raise TypeError(f"block {k} ({block.type}){where}: {why}")
    try:
        check_result_content(kept)
    except HistoryError as exc:
        raise TypeError(f"{exc} (blocks counted from 0, empty text left out)") from None
    return kept or None


def describe_exception(exc: BaseException) -> str:
    """`TYPE: MESSAGE` (`TYPE` when the message is empty), even if reading the message fails."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:
        return f"{name} (its message could not be read)"
    return f"{name}: {text}" if text else name


_SURROGATES = re.compile("[\ud800-\udfff]")


def sendable(result: ToolResult) -> ToolResult:
    """`result` with text UTF-8 cannot carry (lone surrogates) replaced, and the fact said.

    A tool returning `os.fsdecode(...)` of a file name that is not UTF-8 (what `os.listdir`
    gives for such names) would otherwise make the next request impossible to send. Each such
    character becomes U+FFFD, and a note at the end tells the model so.
    """
    content = result.content
    if isinstance(content, str):
        if content.isascii() or not _SURROGATES.search(content):
            return result
        fixed, count = _SURROGATES.subn("\ufffd", content)
        return replace(result, content=fixed + _replaced_note(count))
    if not content or not any(
        isinstance(b, TextBlock) and _SURROGATES.search(b.text) for b in content
    ):
        return result
    blocks: list[ContentBlock] = []
    total = 0
    for block in content:
        if isinstance(block, TextBlock):
            text, count = _SURROGATES.subn("\ufffd", block.text)
            total += count
            block = block.model_copy(update={"text": text}) if count else block
        blocks.append(block)
    blocks.append(TextBlock(text=_replaced_note(total).strip()))
    return replace(result, content=blocks)


def _replaced_note(count: int) -> str:
    return (
        f"\n[{count} character(s) of this result could not be encoded as UTF-8 (lone "
        "surrogates, e.g. from a file name that is not UTF-8) and were replaced with U+FFFD]"
    )
