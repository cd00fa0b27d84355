"""A scripted model: answers requests from a list of responses or a function of the request.

It stands in for Claude in tests and in the offline demo. `ScriptedModel` works on wire
JSON (so the local Messages-API server in `agentloop.testing` can serve it over HTTP) and
checks every request's history with the linter, as the real API would;
`ScriptedProvider` plugs it into an `Agent` in process.

Besides messages, a script can hold a `RawResponse` (an exact HTTP answer), a `Fault` (a
failure: an error status, a dropped connection, a slow or broken response) and a `Paced`
message (streamed with real pauses). They are meant for the HTTP server; in process,
`ScriptedProvider` turns a fault into the `ProviderError` it stands for.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import anyio

from agentloop import errors
from agentloop.errors import AgentloopError, ProviderError
from agentloop.lint import lint_history
from agentloop.messages import Message, _Block, parse_history
from agentloop.providers.anthropic import api_output_schema
from agentloop.providers.base import ModelRequest, ModelResponse

from .caching import breakpoints
from .message_stream import message_events
from .structured import check_output_config

__all__ = (
    "MAX_CACHE_MARKERS",
    "Fault",
    "FaultKind",
    "Paced",
    "RawResponse",
    "ScriptExhausted",
    "ScriptedModel",
    "ScriptedProvider",
    "cache_markers",
    "message_events",
    "reply",
    "text",
    "tool_call",
)


@dataclass(frozen=True)
class RawResponse:
    """An exact HTTP answer for the test server: a status and a JSON body, or raw SSE text.

    Use it to replay recorded exchanges byte for byte or to answer with an API error.
    In process (`ScriptedProvider`), only a 200 JSON body is meaningful.
    """

    status: int = 200
    json: Any = None
    """The JSON body (a message, or an error object for a non-200 status)."""
    sse: str | None = None
    """A raw `text/event-stream` body, sent as is."""
    headers: Mapping[str, str] = field(default_factory=dict)


ScriptItem: TypeAlias = "Mapping[str, Any] | ModelResponse | RawResponse | Fault | Paced | str"
"""One scripted answer: a wire `message` dict, a `ModelResponse`, a `RawResponse`, a `Fault`,
a `Paced` message, or text."""
Answer: TypeAlias = "dict[str, Any] | RawResponse | Fault | Paced"
"""What `ScriptedModel.respond` returns: a wire message, or an item the server acts out."""
Script: TypeAlias = "Iterable[ScriptItem] | Callable[[dict[str, Any]], ScriptItem]"


MAX_CACHE_MARKERS = 4
"""The most `cache_control` markers the API takes in one request."""


def cache_markers(body: Mapping[str, Any]) -> int:
    """How many `cache_control` markers a request body holds (tools, system, messages)."""

    def count(value: Any) -> int:
        if isinstance(value, list):
            return sum(count(v) for v in value)
        if not isinstance(value, Mapping):
            return 0
        own = 1 if isinstance(value.get("cache_control"), Mapping) else 0
        return own + count(value.get("content"))

    messages = body.get("messages")
    return (
        count(body.get("tools"))
        + count(body.get("system"))
        + (count(list(messages)) if isinstance(messages, list) else 0)
    )


class ScriptExhausted(AgentloopError):
    """The scripted model was asked for more responses than its script holds."""


def new_tool_use_id() -> str:
    """A fresh id in the API's `toolu_...` shape."""
    return "toolu_01" + secrets.token_hex(11)


def text(value: str) -> dict[str, Any]:
    """A text block."""
    return {"type": "text", "text": value}


def tool_call(
    name: str, input: Mapping[str, Any] | None = None, *, id: str | None = None
) -> dict[str, Any]:
    """A `tool_use` block calling `name` with `input` (a fresh id unless given)."""
    return {
        "type": "tool_use",
        "id": id or new_tool_use_id(),
        "name": name,
        "input": dict(input or {}),
    }


def reply(
    *blocks: str | Mapping[str, Any] | _Block,
    stop_reason: str | None = None,
    usage: Mapping[str, int] | None = None,
    model: str = "scripted",
    output: Any = None,
) -> dict[str, Any]:
    """A whole response message; the stop reason is inferred when not given.

    Strings become text blocks. `stop_reason` defaults to `tool_use` when a block is a
    tool_use and to `end_turn` otherwise. `output` (any JSON value) is a structured
    reply: a last text block holding it as JSON, as the API answers a request with
    `output_config.format` (and a Chat Completions server one with `response_format`).
    """
    content = [
        text(b) if isinstance(b, str) else b.to_wire() if isinstance(b, _Block) else dict(b)
        for b in blocks
    ]
    if output is not None:
        content.append(text(json.dumps(output)))
    if stop_reason is None:
        stop_reason = (
            "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"
        )
    return {
        "id": "msg_01" + secrets.token_hex(11),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": dict(usage or {"input_tokens": 10, "output_tokens": 5}),
    }


FaultKind: TypeAlias = Literal[
    "http_error", "dropped", "slow", "malformed_json", "stream_ends_early", "stream_error"
]
"""The kinds of `Fault` the test server can act out."""

_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""The API's `error.type` for each HTTP status it uses."""

_ERROR_MESSAGES: Mapping[str, str] = {
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit",
    "api_error": "Internal server error",
    "overloaded_error": "Overloaded",
}


@dataclass(frozen=True)
class Fault:
    """A failure for the test server to answer one request with.

    Build one with a constructor, and put it in a script like any response:

    ```python
    script = [Fault.rate_limited(retry_after=0.2), Fault.dropped(), reply("ok")]
    ```

    Each fault consumes one script item; the SDK's retry then asks for the next one.
    Over HTTP (`MessagesServer`) a fault is acted out on the wire. In process,
    `ScriptedProvider` raises the agentloop error it stands for instead (`RateLimitError`,
    `ServerError`, `OverloadedError`, `APIConnectionError`, ...; see `to_error`), except
    for a slow response, which simply arrives after its delay (no client timeout there).
    """

    kind: FaultKind
    """What goes wrong (see the constructors)."""
    status: int = 200
    """The HTTP status of an `http_error`."""
    error_type: str = ""
    """The API error type (`rate_limit_error`, `overloaded_error`, ...) of an error."""
    message: str = ""
    """The error message of an error."""
    retry_after: float | None = None
    """Seconds sent as the `retry-after` header (the SDK honours it), or None for none."""
    delay: float = 0.0
    """Seconds a `slow` response waits before it is sent."""
    answer: Mapping[str, Any] | None = None
    """The message a `slow` response sends, or whose start a broken stream sends."""
    after_blocks: int = 1
    """How many whole content blocks a broken stream sends before it breaks."""
    clean_end: bool = False
    """For `stream_ends_early`: end the HTTP body properly (just without `message_stop`)
    instead of closing the connection in the middle of it."""

    @classmethod
    def http_error(
        cls,
        status: int,
        error_type: str | None = None,
        message: str | None = None,
        *,
        retry_after: float | None = None,
    ) -> Fault:
        """An API error response: `status` with an `{"type": "error", ...}` body.

        `error_type` defaults to the API's type for `status` (`invalid_request_error` for
        400, `not_found_error` for 404, `request_too_large` for 413, ...).
        """
        kind = error_type or _ERROR_TYPES.get(status, "api_error")
        text = message or _ERROR_MESSAGES.get(kind, f"scripted {status} {kind}")
        return cls("http_error", status, kind, text, retry_after)

    @classmethod
    def prompt_too_long(cls, tokens: int = 208_656, maximum: int = 200_000) -> Fault:
        """400 `invalid_request_error`: the API's refusal of a request over the context window.

        Worded as the API words it: "prompt is too long: N tokens > M maximum".
        """
        return cls.http_error(
            400,
            "invalid_request_error",
            f"prompt is too long: {tokens} tokens > {maximum} maximum",
        )

    @classmethod
    def rate_limited(cls, retry_after: float | None = 1.0) -> Fault:
        """429 `rate_limit_error`, asking the client to wait `retry_after` seconds."""
        return cls.http_error(429, retry_after=retry_after)

    @classmethod
    def server_error(cls, status: int = 500, *, retry_after: float | None = None) -> Fault:
        """A 5xx `api_error` (500 unless `status` says otherwise)."""
        return cls.http_error(status, "api_error", retry_after=retry_after)

    @classmethod
    def overloaded(cls, *, retry_after: float | None = None) -> Fault:
        """529 `overloaded_error`."""
        return cls.http_error(529, retry_after=retry_after)

    @classmethod
    def dropped(cls) -> Fault:
        """The connection is closed without any response (the client sees no status)."""
        return cls("dropped")

    @classmethod
    def slow(cls, delay: float, answer: ScriptItem = "ok") -> Fault:
        """`answer` (a message, as a script takes it), sent only after `delay` seconds."""
        return cls("slow", delay=delay, answer=_whole_message(answer))

    @classmethod
    def malformed_json(cls) -> Fault:
        """A 200 whose body is cut-off JSON (for a streamed request: an SSE event's data)."""
        return cls("malformed_json")

    @classmethod
    def stream_ends_early(
        cls, answer: ScriptItem = "ok", *, after_blocks: int = 1, clean_end: bool = False
    ) -> Fault:
        """A stream that stops after `message_start` and `after_blocks` blocks of `answer`.

        No `message_delta` or `message_stop` is sent. By default the connection is closed
        in the middle of the (chunked) body; `clean_end=True` ends the body properly. A
        request without `stream: true` gets a dropped connection.
        """
        return cls(
            "stream_ends_early",
            answer=_whole_message(answer),
            after_blocks=after_blocks,
            clean_end=clean_end,
        )

    @classmethod
    def stream_error(
        cls,
        answer: ScriptItem = "ok",
        *,
        after_blocks: int = 1,
        error_type: str = "overloaded_error",
        message: str = "Overloaded",
    ) -> Fault:
        """A stream that sends `event: error` after `message_start` and `after_blocks` blocks.

        The error event is `{"type": "error", "error": {"type": error_type, "message":
        message}}`, as the API sends when it is overloaded in the middle of a response. A
        request without `stream: true` gets the matching status instead (529 for
        `overloaded_error`).
        """
        return cls(
            "stream_error",
            error_type=error_type,
            message=message,
            answer=_whole_message(answer),
            after_blocks=after_blocks,
        )

    @property
    def error_body(self) -> dict[str, Any]:
        """The API-shaped error object of an error fault."""
        return {
            "type": "error",
            "error": {"type": self.error_type, "message": self.message},
            "request_id": "req_local",
        }

    def to_error(self) -> ProviderError:
        """The agentloop error this fault stands for (what `ScriptedProvider` raises).

        The same error the real provider raises for the same answer on the wire (both go
        through `agentloop.errors.api_error`): a dropped connection, a broken stream and
        a slow response (as a client timeout would end it) are `APIConnectionError`s;
        malformed JSON is an `InvalidResponseError`.
        """
        if self.kind in ("dropped", "slow", "stream_ends_early"):
            return errors.APIConnectionError(f"scripted fault: {self.kind}")
        if self.kind == "malformed_json":
            return errors.InvalidResponseError("the API's answer is not valid JSON")
        status = None if self.kind == "stream_error" else self.status
        return errors.api_error(status, self.error_body, request_id="req_local")


@dataclass(frozen=True, init=False)
class Paced:
    """A message the test server streams with real pauses, as a model writing it would.

    For a request with `stream: true`, the server waits `first_delay` before
    `message_start`, spreads `block_delay` evenly over each content block (its
    `content_block_stop` arrives `block_delay` after its `content_block_start`, the
    deltas in between), and waits `chunk_delay` more before every delta. Each event is
    flushed as it is written. A request without `stream: true` is answered with the
    whole message once all those pauses have passed; `ScriptedProvider` sleeps as long.

    ```python
    calls = [tool_call("lookup", {"key": k}) for k in "abcde"]
    script = [Paced(reply(*calls), block_delay=0.25), reply("done")]  # ~1.25 s to stream
    ```
    """

    message: dict[str, Any]
    """The wire message streamed."""
    first_delay: float
    """Seconds before `message_start`."""
    block_delay: float
    """Seconds from each block's `content_block_start` to its `content_block_stop`."""
    chunk_delay: float
    """Extra seconds before each `content_block_delta`."""

    def __init__(
        self,
        message: ScriptItem,
        *,
        first_delay: float = 0.0,
        block_delay: float = 0.0,
        chunk_delay: float = 0.0,
    ) -> None:
        """Pace `message` (a message, as a script takes it) with the given pauses."""
        if min(first_delay, block_delay, chunk_delay) < 0:
            raise ValueError("Paced delays must be >= 0")
        object.__setattr__(self, "message", _whole_message(message))
        object.__setattr__(self, "first_delay", first_delay)
        object.__setattr__(self, "block_delay", block_delay)
        object.__setattr__(self, "chunk_delay", chunk_delay)

    def schedule(self, *, chunk: int = 16) -> list[tuple[float, str, Any]]:
        """The stream's events as `(seconds to wait before it, event name, data)`."""
        events = message_events(self.message, chunk=chunk)
        per_block: dict[int, int] = {}
        for name, data in events:
            if name.startswith("content_block_"):
                per_block[data["index"]] = per_block.get(data["index"], 0) + 1
        timed: list[tuple[float, str, Any]] = []
        for name, data in events:
            pause = self.first_delay if name == "message_start" else 0.0
            if name in ("content_block_delta", "content_block_stop"):
                pause = self.block_delay / (per_block[data["index"]] - 1)
            if name == "content_block_delta":
                pause += self.chunk_delay
            timed.append((pause, name, data))
        return timed

    @property
    def total_delay(self) -> float:
        """Seconds the whole stream takes: what a non-streamed answer waits."""
        return sum(pause for pause, _, _ in self.schedule())


def _whole_message(item: ScriptItem) -> dict[str, Any]:
    """The wire message of a script item that must be a message."""
    message = _as_message(item)
    if not isinstance(message, dict):
        raise TypeError(f"expected a message, not {type(message).__name__}")
    return message


def _as_message(item: ScriptItem) -> Answer:
    if isinstance(item, (RawResponse, Fault, Paced)):
        return item
    if isinstance(item, str):
        return reply(item)
    if isinstance(item, ModelResponse):
        return dict(item.raw) or reply(*item.content, stop_reason=item.stop_reason)
    return dict(item)


class ScriptedModel:
    """A deterministic stand-in for the Messages API.

    Give it a list of responses (each a `reply(...)` dict, a `ModelResponse` or a string),
    or a function from the request body to a response. Every request's history is
    checked with `lint_history` first, so a test fails the moment a request would have
    been rejected by the API. Thread-safe: the HTTP test server calls it from threads.
    """

    def __init__(self, script: Script, *, lint: bool = True) -> None:
        """Create a model answering from `script`; `lint=False` skips the history check."""
        self._lock = threading.Lock()
        self._function: Callable[[dict[str, Any]], ScriptItem] | None = None
        self._items: Iterable[ScriptItem] | None = None
        if callable(script):
            self._function = script
        else:
            self._items = iter(list(script))
        self.lint = lint
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self._counter = itertools.count(1)

    def check(self, body: Mapping[str, Any], *, allow_file_sources: bool = False) -> list[Message]:
        """Lint a request body's history as the API would; return the parsed messages.

        `file` sources are allowed when the request was sent under the Files beta.

        Besides the history rules, the body's cache breakpoints must follow the API's
        rules (`caching.breakpoints`): at most `MAX_CACHE_MARKERS` in all (tools, system,
        messages and a top-level `cache_control`), TTLs that never grow along the prompt;
        and an `output_config.format` needs a schema the API accepts (`check_output_config`).
        """
        messages = parse_history(body.get("messages") or [])
        if self.lint:
            lint_history(
                messages,
                thinking=body.get("thinking"),
                tool_choice=body.get("tool_choice"),
                allow_file_sources=allow_file_sources,
            )
            check_output_config(body)
            breakpoints(body)
        return messages

    def respond(self, body: Mapping[str, Any], *, allow_file_sources: bool = False) -> Answer:
        """The response to one request body (sent under the Files beta: `allow_file_sources`).

        Returns wire JSON for a message, or the script's `RawResponse`, `Fault` or `Paced`
        item as it is, for the server to act out.

        Raises:
            HistoryError: the request's history breaks an API rule.
            ScriptExhausted: the script has no response left.
        """
        self.check(body, allow_file_sources=allow_file_sources)
        with self._lock:
            self.requests.append(dict(body))
            number = next(self._counter)
            if self._function is not None:
                function = self._function
            else:
                assert self._items is not None
                try:
                    return _as_message(next(iter(self._items)))
                except StopIteration:
                    raise ScriptExhausted(
                        f"the scripted model has no response left for request #{number}"
                    ) from None
        return _as_message(function(dict(body)))


class ScriptedProvider:
    """A `Provider` answering from a `ScriptedModel`, in process (no HTTP).

    Requests are the bodies `AnthropicProvider` would send (an output schema rewritten
    as the API takes it).

    A `Paced` answer arrives after its `total_delay`. A `Fault` raises the agentloop
    error it stands for (see `Fault.to_error`); a slow one first waits its delay.
    """

    name = "scripted"
    """The provider's name in traces (`gen_ai.provider.name`)."""
    native_output = True
    """Requests may ask for structured output (`output_config.format`), as the API's may."""

    def __init__(self, script: Script | ScriptedModel) -> None:
        """Create a provider from a script or an existing `ScriptedModel`."""
        self.model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer `request` from the script."""
        answer = self.model.respond(api_output_schema(request.to_wire()))
        if isinstance(answer, Paced):
            await anyio.sleep(answer.total_delay)
            answer = answer.message
        elif isinstance(answer, Fault):
            if answer.kind != "slow":
                raise answer.to_error()
            await anyio.sleep(answer.delay)
            answer = dict(answer.answer or {})
        elif isinstance(answer, RawResponse):
            if answer.status != 200:
                raise errors.api_error(answer.status, answer.json, request_id="req_local")
            return ModelResponse.from_wire(answer.json)
        return ModelResponse.from_wire(answer)

    @property
    def requests(self) -> Sequence[dict[str, Any]]:
        """Every request body received, in order."""
        return self.model.requests
