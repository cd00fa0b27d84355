"""A scripted model: answers requests from a list of responses or a function of the request.

It stands in for Claude in tests and in the offline demo. `ScriptedModel` works on wire
JSON (so the local Messages-API server in `agentloop.testing` can serve it over HTTP) and
checks every request's history with the linter, as the real API would;
`ScriptedProvider` plugs it into an `Agent` in process.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from agentloop.errors import AgentloopError, ProviderError
from agentloop.messages import Message, _Block, lint_history, parse_history

from .base import ModelRequest, ModelResponse

__all__ = (
    "RawResponse",
    "ScriptExhausted",
    "ScriptedModel",
    "ScriptedProvider",
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


ScriptItem: TypeAlias = "Mapping[str, Any] | ModelResponse | RawResponse | str"
"""One scripted answer: a wire `message` dict, a `ModelResponse`, a `RawResponse`, or text."""
Script: TypeAlias = "Iterable[ScriptItem] | Callable[[dict[str, Any]], ScriptItem]"


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
) -> dict[str, Any]:
    """A whole response message; the stop reason is inferred when not given.

    Strings become text blocks. `stop_reason` defaults to `tool_use` when a block is a
    tool_use and to `end_turn` otherwise.
    """
    content = [
        text(b) if isinstance(b, str) else b.to_wire() if isinstance(b, _Block) else dict(b)
        for b in blocks
    ]
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


def _as_message(item: ScriptItem) -> dict[str, Any] | RawResponse:
    if isinstance(item, RawResponse):
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

    def check(self, body: Mapping[str, Any]) -> list[Message]:
        """Lint a request body's history as the API would; return the parsed messages."""
        messages = parse_history(body.get("messages") or [])
        if self.lint:
            thinking = body.get("thinking") or {}
            lint_history(
                messages,
                thinking=bool(thinking) and thinking.get("type") != "disabled",
                tool_choice=body.get("tool_choice"),
            )
        return messages

    def respond(self, body: Mapping[str, Any]) -> dict[str, Any] | RawResponse:
        """The response to one request body (wire JSON, or an exact `RawResponse`).

        Raises:
            HistoryError: the request's history breaks an API rule.
            ScriptExhausted: the script has no response left.
        """
        self.check(body)
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
    """A `Provider` answering from a `ScriptedModel`, in process (no HTTP)."""

    def __init__(self, script: Script | ScriptedModel) -> None:
        """Create a provider from a script or an existing `ScriptedModel`."""
        self.model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer `request` from the script."""
        answer = self.model.respond(request.to_wire())
        if isinstance(answer, RawResponse):
            if answer.status != 200 or not isinstance(answer.json, Mapping):
                raise ProviderError(
                    f"scripted error response {answer.status}: {answer.json!r}"[:300],
                    status_code=answer.status,
                    body=answer.json,
                )
            answer = dict(answer.json)
        return ModelResponse.from_wire(answer)

    @property
    def requests(self) -> Sequence[dict[str, Any]]:
        """Every request body received, in order."""
        return self.model.requests
