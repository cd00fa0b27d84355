"""The provider boundary: a `ModelRequest` goes in, a `ModelResponse` comes out.

These values are what the agent hands a provider and gets back; `ToolDefinition` and
`ToolCall` (in `agentloop.tools`) keep the tool side provider-neutral, so other providers
can sit behind the same `Provider` protocol.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol, Union, runtime_checkable

from pydantic import TypeAdapter, ValidationError

from agentloop._wire import compact_json
from agentloop.calls import ToolDefinition
from agentloop.errors import ConfigurationError, HistoryError, InvalidResponseError
from agentloop.messages import (
    ContentBlock,
    Message,
    TextBlock,
    ToolUseBlock,
    dump_history,
    parse_history,
)
from agentloop.pricing import add_costs
from agentloop.result import Spent, Usage

__all__ = (
    "BlockDelta",
    "BlockStart",
    "BlockStop",
    "CountingProvider",
    "MessageStart",
    "ModelRequest",
    "ModelResponse",
    "Provider",
    "StreamEvent",
    "StreamingProvider",
    "Usage",
    "provider_name",
    "retry_after",
)


@dataclass(frozen=True)
class ModelRequest:
    """Everything one model request needs, before it is put on the wire."""

    model: str
    messages: Sequence[Message]
    max_tokens: int
    system: str | Sequence[Mapping[str, Any]] | None = None
    tools: Sequence[ToolDefinition | Mapping[str, Any]] = ()
    """Tool definitions; a mapping is a wire definition, sent as it is."""
    tool_choice: Mapping[str, Any] | None = None
    thinking: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] | None = None
    stop_sequences: Sequence[str] | None = None
    container: str | None = None
    """Container id carried over from an earlier response (code execution)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Further request parameters (`temperature`, `service_tier`, `extra_headers`, ...),
    applied last: a key here replaces the field of the same name, except `tools`, whose
    definitions are added after the agent's."""
    output_format: Mapping[str, Any] | None = None
    """Structured output asked for: `{"name": ..., "schema": <JSON schema of an object>}`.
    The Messages API gets it as `output_config.format` (`AnthropicProvider` has the
    schema rewritten as the API accepts it), Chat Completions as `response_format`."""
    cache: Mapping[str, Any] | None = None
    """The `cache_control` marker a provider that supports prompt caching puts on the
    request's breakpoints (see `agentloop.providers.caching`); None: no breakpoints added.
    It is not a field of the body: `to_wire` leaves it out."""

    def to_json(self, fields: Mapping[str, Any] | None = None) -> bytes:
        """The Messages API body as compact JSON: `messages` plus `fields` (or the rest).

        Each message's JSON is computed once and reused by every later request of the
        run; text holding lone surrogates is written with JSON escapes.
        """
        rest = self.to_wire(messages=False) if fields is None else fields
        head = compact_json(rest)
        messages = b",".join(m.wire_json for m in self._sent())
        return b'{"messages":[' + messages + (b"]," + head[1:] if len(head) > 2 else b"]}")

    def _sent(self) -> list[Message]:
        """The messages as the Messages API receives them: without unsigned thinking."""
        return [s for m in self.messages if (s := m.signed_only) is not None]

    def to_wire(self, *, messages: bool = True) -> dict[str, Any]:
        """The Messages API request body.

        Thinking blocks without a signature (reasoning text from a Chat Completions
        server) stay in the history but are left out here: the API refuses them.
        `params` are applied last and win, except `params["tools"]`, which are added
        after the agent's tools.
        """
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        if messages:
            body["messages"] = [m.wire for m in self._sent()]
        optional = {
            "system": self.system,
            "tools": [t.to_wire() if isinstance(t, ToolDefinition) else dict(t) for t in self.tools]
            or None,
            "tool_choice": self.tool_choice,
            "thinking": self.thinking,
            "metadata": self.metadata,
            "stop_sequences": self.stop_sequences,
            "container": self.container,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.output_format is not None:
            schema = self.output_format["schema"]
            body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        for name, value in self.params.items():
            if name == "tools" and value and "tools" in body:
                body["tools"] = [*body["tools"], *value]
            elif name == "output_config" and "output_config" in body:
                body[name] = {**value, **body[name]}  # e.g. `effort` beside the format
            else:
                body[name] = value
        return body

    def to_dict(self) -> dict[str, Any]:
        """The request as plain JSON values; `from_dict` turns them back into an equal one.

        This is how a request travels to another process (a durable engine's worker).
        Unlike `to_wire`, it keeps every field as it is: unsigned thinking blocks, the
        `cache` marker, `params` and the output format, and which tool definitions are
        `ToolDefinition`s and which wire dicts.
        """
        return {
            "model": self.model,
            "messages": dump_history(self.messages),
            "max_tokens": self.max_tokens,
            "system": self.system
            if self.system is None or isinstance(self.system, str)
            else [dict(block) for block in self.system],
            "tools": [
                {"definition": {**asdict(t), "extra": dict(t.extra)}}
                if isinstance(t, ToolDefinition)
                else {"wire": dict(t)}
                for t in self.tools
            ],
            "tool_choice": _plain(self.tool_choice),
            "thinking": _plain(self.thinking),
            "metadata": _plain(self.metadata),
            "stop_sequences": None if self.stop_sequences is None else list(self.stop_sequences),
            "container": self.container,
            "params": dict(self.params),
            "output_format": _plain(self.output_format),
            "cache": _plain(self.cache),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelRequest:
        """The request `to_dict` wrote.

        Raises:
            ConfigurationError: `data` is not what `to_dict` writes.
        """
        try:
            tools = [
                ToolDefinition(**t["definition"]) if "definition" in t else t["wire"]
                for t in data["tools"]
            ]
            return cls(
                model=data["model"],
                messages=parse_history(data["messages"]),
                max_tokens=data["max_tokens"],
                system=data["system"],
                tools=tools,
                tool_choice=data["tool_choice"],
                thinking=data["thinking"],
                metadata=data["metadata"],
                stop_sequences=data["stop_sequences"],
                container=data["container"],
                params=data["params"],
                output_format=data["output_format"],
                cache=data["cache"],
            )
        except (KeyError, TypeError, HistoryError) as exc:
            raise ConfigurationError(f"not a recorded request: {exc}"[:500]) from exc


def _plain(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)


def _sent_to(value: Any) -> tuple[str, str] | None:
    """A recorded `ModelResponse.sent_to`: a [model, provider] pair, or None."""
    if value is None:
        return None
    model, provider = value
    return str(model), str(provider)


_CONTENT = TypeAdapter(list[ContentBlock])
_USAGE_FIELDS = frozenset(f.name for f in fields(Usage))


@dataclass(frozen=True)
class ModelResponse:
    """One model response: its content blocks verbatim, why it stopped, what it cost."""

    content: list[ContentBlock]
    stop_reason: str | None
    usage: Usage = field(default_factory=Usage)
    id: str = ""
    model: str = ""
    stop_sequence: str | None = None
    container: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """The decoded response body, for fields agentloop does not model."""
    call_errors: Mapping[str, str] = field(default_factory=dict)
    """Tool calls the provider knows must not run, by `tool_use` id, with the reason the
    model is told (arguments that were not valid JSON, a call cut off mid-way, ...)."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The HTTP response headers, lower-cased (`request-id`, `anthropic-ratelimit-*`,
    ...), when the provider has them; empty otherwise."""
    sent_to: tuple[str, str] | None = None
    """Where the request went when a capability sent it elsewhere than the run's model
    and provider (a fallback's, see `agentloop.capabilities.Fallback`): the model it
    named and the provider's name (`provider_name`). The run prices the response as
    that model, and names it in `RunResult.models` when the response names none. None:
    the run's own model and provider."""
    extra_usage: Usage = field(default_factory=Usage)
    """What was spent on the run's behalf while this response was asked for, besides its
    own usage: the responses a capability dropped for it (a fallback's refused ones) and
    a capability's own requests (`RunContext.add_usage` in `wrap_request`). The run
    counts it with this response, so a durable run that records this response records
    it too."""
    extra_cost: float | None = 0.0
    """What that cost in US dollars, each request at its own model's prices (None:
    unknown)."""

    @classmethod
    def from_wire(cls, body: Any) -> ModelResponse:
        """Parse an API `message` object (as decoded from JSON).

        Raises:
            InvalidResponseError: `body` is not a message (an empty object, an error
                object, content that is not a list of blocks).
        """
        if not isinstance(body, Mapping) or body.get("type", "message") != "message":
            kind = body.get("type") if isinstance(body, Mapping) else type(body).__name__
            error = body.get("error") if isinstance(body, Mapping) else None
            detail = f": {error}" if error else ""
            raise InvalidResponseError(
                f"the API answered with a {kind!r} instead of a message{detail}"[:500]
            )
        content = body.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        if not isinstance(content, list) or body.get("role", "assistant") != "assistant":
            shown = json.dumps(body, default=repr)[:300]
            raise InvalidResponseError(f"the API's answer is not an assistant message: {shown}")
        try:
            blocks = _CONTENT.validate_python(content)
        except ValidationError as exc:
            raise InvalidResponseError(
                f"the API's answer holds a content block that cannot be read: {exc}"[:500]
            ) from exc
        return cls(
            content=blocks,
            stop_reason=body.get("stop_reason"),
            usage=Usage.from_wire(body.get("usage")),
            id=str(body.get("id") or ""),
            model=str(body.get("model") or ""),
            stop_sequence=body.get("stop_sequence"),
            container=body.get("container"),
            raw=body,
        )

    def to_json(self) -> dict[str, Any]:
        """The response as plain JSON values; `from_json` turns them back into an equal one.

        This is how a response is recorded outside the process: a durable run's step, a
        paused run's state. Every field is kept, the decoded body (`raw`) and the headers
        included, so a Chat Completions response round-trips as well as a Messages one.
        """
        return {
            "content": [block.to_wire() for block in self.content],
            "stop_reason": self.stop_reason,
            "usage": asdict(self.usage),
            "id": self.id,
            "model": self.model,
            "stop_sequence": self.stop_sequence,
            "container": None if self.container is None else dict(self.container),
            "raw": dict(self.raw),
            "call_errors": dict(self.call_errors),
            "headers": dict(self.headers),
            "sent_to": None if self.sent_to is None else list(self.sent_to),
            "extra_usage": asdict(self.extra_usage),
            "extra_cost": self.extra_cost,
        }

    def with_spent(self, spent: Spent) -> ModelResponse:
        """This response, also carrying what was `spent` besides it (see `extra_usage`)."""
        if spent.nothing:
            return self
        usage, cost = self.extra_usage + spent.usage, add_costs(self.extra_cost, spent.cost)
        return replace(self, extra_usage=usage, extra_cost=cost)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelResponse:
        """The response `to_json` recorded.

        Raises:
            InvalidResponseError: `data` is not what `to_json` writes.
        """
        try:
            usage = {k: v for k, v in data["usage"].items() if k in _USAGE_FIELDS}
            extra = {k: v for k, v in data.get("extra_usage", {}).items() if k in _USAGE_FIELDS}
            return cls(
                content=_CONTENT.validate_python(data["content"]),
                stop_reason=data["stop_reason"],
                usage=Usage(**usage),
                id=data["id"],
                model=data["model"],
                stop_sequence=data["stop_sequence"],
                container=data["container"],
                raw=data["raw"],
                call_errors=data["call_errors"],
                headers=data["headers"],
                # These three are absent from what an earlier version recorded.
                sent_to=_sent_to(data.get("sent_to")),
                extra_usage=Usage(**extra),
                extra_cost=data.get("extra_cost", 0.0),
            )
        except (KeyError, TypeError, ValueError, AttributeError, ValidationError) as exc:
            raise InvalidResponseError(f"not a recorded response: {exc}"[:500]) from exc

    @property
    def message(self) -> Message:
        """The assistant message for the history, content kept verbatim."""
        return Message.of_blocks("assistant", self.content)

    @property
    def text(self) -> str:
        """The text blocks, joined."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        """The client tool calls asked for, in order."""
        return [b for b in self.content if isinstance(b, ToolUseBlock)]


@runtime_checkable
class Provider(Protocol):
    """Anything that turns a `ModelRequest` into a `ModelResponse`.

    Implementations raise `agentloop.ProviderError` subclasses for API failures.
    """

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request and return the whole response."""
        ...


@dataclass(frozen=True)
class MessageStart:
    """A streamed response began: its head as the API sent it (`id`, `model`, `usage`, ...).

    Sent once per response attempt, before its first block; a consumer that only wants
    blocks can ignore it.
    """

    message: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The HTTP response headers, lower-cased, as `ModelResponse.headers` will hold them:
    here before the response is whole (a proxy forwards the rate limits at once)."""


@dataclass(frozen=True)
class BlockStart:
    """A content block began; for a tool_use, `block` carries its id and name."""

    index: int
    block: ContentBlock


@dataclass(frozen=True)
class BlockDelta:
    """More of a block as it streams in.

    `kind` is `text`, `thinking`, `input_json`, `signature`, or another delta type as the
    API names it, without `_delta` (its value is then the delta as JSON).
    """

    index: int
    kind: str
    value: str


@dataclass(frozen=True)
class BlockStop:
    """A content block is complete; `block` is the whole block, verbatim."""

    index: int
    block: ContentBlock
    complete: bool = True
    """False when a tool_use's input JSON did not parse: the block was cut off."""


StreamEvent = Union[MessageStart, BlockStart, BlockDelta, BlockStop]  # noqa: UP007
"""What a streaming provider reports while a response arrives."""


@runtime_checkable
class StreamingProvider(Provider, Protocol):
    """A provider that can report a response while it arrives."""

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        """Send one request, await `on_event` for each event, return the whole response."""
        ...


@runtime_checkable
class CountingProvider(Provider, Protocol):
    """A provider that can count a request's input tokens without sending it."""

    async def count_tokens(self, request: ModelRequest) -> int:
        """The input tokens `request` would use (the Messages API's count endpoint)."""
        ...


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds an error answer asks to wait before a retry, or None when it says none.

    Reads `retry-after-ms`, then `retry-after` as seconds or as an HTTP date, as the SDKs
    do; `headers` have lower-case names (`ModelResponse.headers`, `ProviderError.headers`).
    """
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError):
                continue
        if math.isfinite(seconds):
            return max(seconds, 0.0)
    return None


def provider_name(provider: Provider) -> str:
    """The provider's name (its `name`, or its class's): in traces and the price table."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) else type(provider).__name__
