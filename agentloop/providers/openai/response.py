"""Chat Completions -> blocks: a `chat.completion` body read as a `ModelResponse`.

Finish reasons become stop reasons (not trusted about tool calls), usage becomes `Usage`,
and calls that must not run (no name, arguments that are not JSON) are marked in
`call_errors`; the stream assembler reads deltas with the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentloop import errors
from agentloop.messages import ContentBlock, TextBlock, ThinkingBlock, ToolUseBlock
from agentloop.providers.base import ModelResponse
from agentloop.result import Usage

from .compat import ChatCompat, new_id

__all__ = (
    "NO_NAME_MESSAGE",
    "UNCOUNTED",
    "call_input",
    "parse_completion",
    "stop_reason",
    "usage",
)


_FINISH = {
    "stop": "end_turn",
    "tool_calls": "end_turn",  # without calls: nothing to run
    "function_call": "end_turn",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def stop_reason(finish: Any, has_calls: bool) -> str:
    """The stop reason for a `finish_reason`, which is not trusted about tool calls.

    Servers report `stop` with tool calls present: calls present make a tool turn,
    unless the response was cut off (`length`) or filtered (`content_filter`).
    """
    if finish in ("length", "content_filter"):
        return _FINISH[finish]
    if has_calls:
        return "tool_use"
    if not isinstance(finish, str) or not finish:
        return "end_turn"
    return _FINISH.get(finish, finish)


UNCOUNTED = Usage(requests=1, uncounted_requests=1)
"""The usage of a response that came without token counts."""


def usage(value: Any) -> Usage:
    """`Usage` from a Chat Completions `usage` (prompt tokens include cached ones).

    A response without one is an uncounted request (`Usage.uncounted_requests`), not one
    of 0 tokens.
    """
    if not isinstance(value, Mapping):
        return UNCOUNTED
    prompt = _count(value.get("prompt_tokens"))
    details = value.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    cached = min(cached, prompt)
    return Usage(
        input_tokens=prompt - cached,
        output_tokens=_count(value.get("completion_tokens")),
        cache_read_input_tokens=cached,
        requests=1,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def call_input(raw: Any) -> tuple[Any, str | None]:
    """A call's input from its `arguments`, and why it must not run (None if it may).

    Arguments are a JSON string; some servers send an object. No arguments at all mean
    an empty object. Valid JSON that is not an object is kept (the loop answers it).
    """
    if isinstance(raw, Mapping):
        return dict(raw), None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, str):
        return raw, None
    try:
        return json.loads(raw), None
    except ValueError as exc:
        shown = raw if len(raw) <= 200 else raw[:197] + "..."
        return {}, (
            f"Not run: the arguments of this call were not valid JSON ({exc}): {shown}. "
            "Call the tool again with a JSON object of arguments."
        )


NO_NAME_MESSAGE = "Not run: this call named no tool. Call a tool by its name."


def parse_completion(
    body: Any, compat: ChatCompat | None = None, taken: set[str] | None = None
) -> ModelResponse:
    """A Chat Completions response body (`chat.completion`) as a `ModelResponse`.

    Reasoning text (`reasoning_content` or `reasoning`) becomes a thinking block without
    a signature; text becomes a text block, unless it is empty or whitespace only (an
    empty answer has no text block, as an empty Messages API answer has none, so no
    history holds a text block the API refuses); each tool call a `tool_use` block. A call
    whose id is missing, empty or already used (in `taken` or earlier in the response)
    gets a fresh one; a call whose arguments are not valid JSON is marked in
    `call_errors`, so it is answered without running.

    Raises:
        ProviderError: the body is an error object.
        InvalidResponseError: the body is not a chat completion.
    """
    compat = compat or ChatCompat()
    used = set(taken or ())
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        raise errors.api_error(None, dict(body))
    choices = body.get("choices") if isinstance(body, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        shown = json.dumps(body, default=repr)[:300]
        raise errors.InvalidResponseError(f"the server's answer is not a chat completion: {shown}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        message = {}
    blocks: list[ContentBlock] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        blocks.append(ThinkingBlock(thinking=reasoning))
    text = _text(message.get("content"))
    if not text.strip():
        text = _text(message.get("refusal"))
    if text.strip():  # an answer of whitespace only is an empty answer: no text block
        blocks.append(TextBlock(text=text))
    raw_calls = message.get("tool_calls")
    calls = [c for c in raw_calls if isinstance(c, Mapping)] if isinstance(raw_calls, list) else []
    finish = choice.get("finish_reason")
    call_errors: dict[str, str] = {}
    for n, call in enumerate(calls):
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in used:
            call_id = new_id(compat, used)
        used.add(call_id)
        name = function.get("name")
        value, error = call_input(function.get("arguments"))
        blocks.append(
            ToolUseBlock(id=call_id, name=name if isinstance(name, str) else "", input=value)
        )
        cut = finish == "length" and n == len(calls) - 1  # the loop says why it won't run
        if not isinstance(name, str) or not name:
            call_errors[call_id] = NO_NAME_MESSAGE
        elif error is not None and not cut:
            call_errors[call_id] = error
    return ModelResponse(
        content=blocks,
        stop_reason=stop_reason(finish, bool(calls)),
        usage=usage(body.get("usage")),
        id=str(body.get("id") or ""),
        model=str(body.get("model") or ""),
        raw=body,
        call_errors=call_errors,
    )


def _text(content: Any) -> str:
    """Text of a `content` (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""
