"""What Chat Completions servers do differently: `ChatCompat` flags and named presets.

The request, response and stream modules read these flags; tool-call ids live here too,
since their shape is one of the things servers disagree on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentloop import errors
from agentloop._wire import base62, random_id

__all__ = ("PRESETS", "ChatCompat", "new_id", "preset", "resolve", "wire_id")


@dataclass(frozen=True, kw_only=True)
class ChatCompat:
    """What a Chat Completions server expects and sends, where servers differ.

    Use a preset by name (`compat="ollama"`), or adjust one:
    `dataclasses.replace(PRESETS["vllm"], tool_call_id_length=9)`.
    """

    server: str = "the server"
    """The server's name, for error messages ("is Ollama running?")."""
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """The request field that carries `max_tokens` (OpenAI's newer models refuse
    `max_tokens`; many local servers know only `max_tokens`)."""
    whole_tool_calls: bool = False
    """The server streams each tool call whole, in one chunk (and may reuse or leave out
    its `index`): each call is complete, and started, as soon as it arrives."""
    tool_call_id_length: int | None = None
    """Tool-call ids must be exactly this many letters and digits (Mistral templates want
    9). Ids in the history are mapped to that shape, the same way in every request, and
    ids agentloop makes up have it."""
    tool_choices: frozenset[str] = frozenset({"auto", "none", "required", "function"})
    """The `tool_choice` values the server accepts (`function` is the named-tool form). A
    request asking for another sends `default_tool_choice`, or leaves `tool_choice` out
    so that the server's default applies; `{"type": "any"}` with one tool is sent as that
    tool named, which means the same, when `required` is refused."""
    default_tool_choice: Literal["auto"] | None = None
    """The `tool_choice` sent with tools when the request names none (or one the server
    refuses): llama-cpp-python's server shows the model the tools only when a
    `tool_choice` is given."""
    single_system: bool = False
    """The server takes one system message only: a system prompt of several blocks is
    sent as one message, its texts joined by blank lines."""
    stream_usage: bool = True
    """Ask for token usage in streamed responses (`stream_options.include_usage`)."""
    send_reasoning: bool = False
    """Send reasoning text the server returned (unsigned thinking blocks) back with its
    assistant message as `reasoning_content`, for servers that want it; by default it
    stays in agentloop's history only."""
    json_schema: bool = False
    """The server constrains its answer to a JSON schema given as `response_format:
    {"type": "json_schema", ...}`: typed output (`output_type`) then uses it
    (`output_mode="auto"` is native). OpenAI and vLLM do; so do Ollama from 0.5.0 and
    llama.cpp's `llama-server` (its OpenAI-compatible chat endpoint), whose presets
    leave it off because older builds do not: `preset("ollama", json_schema=True)`."""
    json_object_schema: bool = False
    """The server constrains its answer to a JSON schema given as `response_format:
    {"type": "json_object", "schema": ...}` (llama-cpp-python's form; it refuses
    `json_schema`): typed output uses it when `json_schema` is off."""


PRESETS: Mapping[str, ChatCompat] = {
    "openai": ChatCompat(
        server="the OpenAI API", max_tokens_field="max_completion_tokens", json_schema=True
    ),
    "ollama": ChatCompat(server="Ollama", whole_tool_calls=True, single_system=True),
    "vllm": ChatCompat(server="the vLLM server", single_system=True, json_schema=True),
    "llamacpp": ChatCompat(
        server="llama.cpp's server",
        single_system=True,
        tool_choices=frozenset({"auto", "none", "required"}),
    ),
    "llama-cpp-python": ChatCompat(
        server="llama-cpp-python's server",
        single_system=True,
        tool_choices=frozenset({"auto", "none", "function"}),
        default_tool_choice="auto",
        json_object_schema=True,
        stream_usage=False,
    ),
}
"""The named presets: `compat="openai" | "ollama" | "vllm" | "llamacpp" |
"llama-cpp-python"` (`llamacpp` is llama.cpp's `llama-server`, `llama-cpp-python` the
Python package's `python -m llama_cpp.server`)."""


def resolve(value: str | ChatCompat | None, base_url: str = "") -> ChatCompat:
    """The `ChatCompat` for a preset name, a `ChatCompat`, or None (by the server's URL).

    Raises:
        ConfigurationError: `value` names no preset.
    """
    if isinstance(value, ChatCompat):
        return value
    if value is None:
        return PRESETS["openai"] if "api.openai.com" in base_url else ChatCompat()
    if value not in PRESETS:
        raise errors.ConfigurationError(
            f"unknown compat preset {value!r}; use one of {', '.join(PRESETS)} or a ChatCompat"
        )
    return PRESETS[value]


def preset(name: str, **changes: Any) -> ChatCompat:
    """A named preset with some flags changed: `preset("vllm", tool_call_id_length=9)`."""
    return replace(resolve(name), **changes)


def wire_id(history_id: str, compat: ChatCompat) -> str:
    """The tool-call id sent for a history id: itself, unless the server wants short ids.

    With `tool_call_id_length`, an id of the wrong shape is mapped to one of the right
    shape by a hash, the same way in every request, so a call and its result still match.
    """
    length = compat.tool_call_id_length
    if length is None or (len(history_id) == length and history_id.isalnum()):
        return history_id
    digest = int.from_bytes(hashlib.sha256(history_id.encode()).digest(), "big")
    return base62(digest, length)


def new_id(compat: ChatCompat, taken: set[str]) -> str:
    """A fresh tool-call id, in the server's shape, unlike any in `taken`."""
    while True:
        length = compat.tool_call_id_length
        candidate = random_id("call_") if length is None else random_id("", length)
        if candidate not in taken:
            return candidate
