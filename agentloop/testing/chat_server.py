"""A local Chat Completions server on 127.0.0.1 that answers from the same scripts.

`ChatCompletionsServer` speaks enough of `POST /v1/chat/completions` for the official
`openai` SDK: JSON responses, SSE chunk streams (`stream: true`, usage with
`stream_options.include_usage`), OpenAI-shaped errors, and the same `Fault`s and `Paced`
messages as `MessagesServer`. Scripts stay in the Messages API shape (`reply(...)`,
`tool_call(...)`): each request is checked against the Chat Completions rules, read back
into a block history, linted and handed to the script; the script's answer is sent as a
chat completion.

Options act out what real servers do differently (calls sent whole with index 0, ids
missing, short ids required, one system message, refused `tool_choice` values or fields),
so each `ChatCompat` flag can be shown against the quirk it is for.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import parse_qsl

from agentloop.errors import AgentloopError
from agentloop.providers.openai import ERROR_PREFIX

from .scripted import Answer, Fault, Paced, RawResponse, Script, ScriptedModel, message_events
from .server import MessagesServer, RecordedRequest, _cut, _Handler

__all__ = ("ChatCompletionsServer", "check_chat_request", "read_chat_request")


@dataclass(frozen=True)
class _Quirks:
    whole_tool_calls: bool = False
    ids: Literal["first", "every", "none"] = "first"
    id_length: int | None = None
    tool_choices: frozenset[str] | None = None
    single_system: bool = False
    refuse_fields: frozenset[str] = frozenset()
    finish_reason_with_tools: str = "tool_calls"
    reasoning_field: str = "reasoning_content"


# --------------------------------------------------------------------------- the rules


def check_chat_request(
    body: Any,
    *,
    id_length: int | None = None,
    single_system: bool = False,
    tool_choices: Collection[str] | None = None,
    refuse_fields: Collection[str] = (),
) -> str | None:
    """What is wrong with a Chat Completions request body, or None if nothing is.

    The format's rules: every `tool` message answers a call of the assistant message
    just before its group of `tool` messages, once; every call is answered before the
    next other message; a call's `function.arguments` is a string holding JSON; an
    assistant message has content or calls. The keyword options add what some servers
    demand (ids of exactly `id_length` letters and digits, one system message first,
    only some `tool_choice` values, fields they refuse).
    """
    if not isinstance(body, Mapping):
        return "the request body must be a JSON object"
    for name in refuse_fields:
        if name in body:
            return f"Unsupported parameter: '{name}' is not supported by this server."
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if tool_choices is not None and "tool_choice" in body:
        choice = body["tool_choice"]
        kind = "function" if isinstance(choice, Mapping) else choice
        if kind not in tool_choices:
            return f"Invalid tool_choice: {json.dumps(choice)}"
    pending: dict[str, bool] = {}  # call id -> answered, for the latest assistant's calls
    in_results = False
    seen_ids: set[str] = set()
    systems = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            return f"{where}: must be an object"
        role = message.get("role")
        if role != "tool" and in_results:
            missing = [c for c, done in pending.items() if not done]
            if missing:
                return _unanswered(missing)
            in_results = False
            pending = {}
        if role in ("system", "developer"):
            systems += 1
            if single_system and (i != 0 or systems > 1):
                return f"{where}: System message must be at the beginning, and only one is allowed."
            if not _is_text_content(message.get("content")):
                return f"{where}.content: must be a string or an array of text parts"
        elif role == "user":
            problem = _check_user_content(message.get("content"), where)
            if problem:
                return problem
        elif role == "assistant":
            if pending and any(not done for done in pending.values()):
                return _unanswered([c for c, done in pending.items() if not done])
            problem = _check_assistant(message, where, id_length, seen_ids)
            if problem:
                return problem
            calls = message.get("tool_calls") or []
            pending = {c["id"]: False for c in calls}
            in_results = bool(calls)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not in_results:
                return (
                    f"{where}: messages with role 'tool' must be a response to a preceding "
                    "message with 'tool_calls'."
                )
            if not isinstance(call_id, str) or call_id not in pending:
                return (
                    f"{where}.tool_call_id: {call_id!r} answers no call of the preceding "
                    "assistant message"
                )
            if pending[call_id]:
                return f"{where}.tool_call_id: {call_id!r} is answered twice"
            pending[call_id] = True
            if not _is_text_content(message.get("content")):
                return f"{where}.content: must be a string or an array of text parts"
        else:
            return f"{where}.role: invalid role {role!r}"
    missing = [c for c, done in pending.items() if not done]
    if missing:
        return _unanswered(missing)
    return None


def _unanswered(missing: Sequence[str]) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        f"{', '.join(missing)}"
    )


def _is_text_content(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    )


def _check_user_content(content: Any, where: str) -> str | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not content:
        return f"{where}.content: must be a string or a non-empty array of parts"
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("text", "image_url", "file", "input_audio"):
            return f"{where}.content[{k}]: invalid part type {kind!r}"
    return None


def _check_assistant(
    message: Mapping[str, Any], where: str, id_length: int | None, seen: set[str]
) -> str | None:
    content = message.get("content")
    if content is not None and not _is_text_content(content):
        return f"{where}.content: must be a string, null or an array of text parts"
    calls = message.get("tool_calls")
    if calls is None:
        calls = []
    if not isinstance(calls, list):
        return f"{where}.tool_calls: must be an array"
    if not calls and not content:
        return f"{where}: an assistant message needs content or tool_calls"
    for k, call in enumerate(calls):
        path = f"{where}.tool_calls[{k}]"
        if not isinstance(call, Mapping):
            return f"{path}: must be an object"
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            return f"{path}.id: must be a non-empty string"
        if id_length is not None and not (len(call_id) == id_length and call_id.isalnum()):
            return (
                f"{path}.id: Tool call id was {call_id} but must be a-z, A-Z, 0-9, "
                f"with a length of {id_length}."
            )
        if call_id in seen:
            return f"{path}.id: duplicate tool call id {call_id!r}"
        seen.add(call_id)
        if call.get("type") != "function":
            return f"{path}.type: must be 'function'"
        function = call.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return f"{path}.function.name: must be a string"
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            kind = type(arguments).__name__
            return f"{path}.function.arguments: must be a string (of JSON), not {kind}"
        try:
            json.loads(arguments)
        except ValueError:
            return f"{path}.function.arguments: not valid JSON: {arguments[:100]}"
    return None


# --------------------------------------------------------------------------- chat -> blocks


def read_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A checked Chat Completions request read into the Messages API shape scripts see.

    `tool` messages become `tool_result` blocks of one user message (a result whose text
    starts with `ERROR_PREFIX` is an `is_error` one), joined by the user message that
    follows them; `tool_calls` become `tool_use` blocks with their parsed arguments;
    returned reasoning becomes an unsigned thinking block; system messages become
    `system`.
    """
    systems: list[str] = []
    messages: list[dict[str, Any]] = []
    results_open = False  # the last message holds tool results a user message may join
    for message in body["messages"]:
        role = message["role"]
        if role in ("system", "developer"):
            systems.append(_joined_text(message["content"]))
        elif role == "assistant":
            messages.append({"role": "assistant", "content": _assistant_blocks(message)})
            results_open = False
        elif role == "tool":
            block = _result_block(message)
            if results_open:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
                results_open = True
        else:
            content = message["content"]
            if results_open:
                blocks = [{"type": "text", "text": content}] if isinstance(content, str) else []
                blocks += [] if isinstance(content, str) else [_user_block(p) for p in content]
                messages[-1]["content"].extend(blocks)
                results_open = False
            elif isinstance(content, str):
                messages.append({"role": "user", "content": content})
            else:
                messages.append({"role": "user", "content": [_user_block(p) for p in content]})
    read: dict[str, Any] = {
        "model": body.get("model"),
        "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens"),
        "messages": messages,
    }
    if systems:
        read["system"] = (
            systems[0] if len(systems) == 1 else [{"type": "text", "text": s} for s in systems]
        )
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        read["tools"] = [_tool_definition(t) for t in tools]
    choice = _read_tool_choice(body.get("tool_choice"))
    if choice is not None:
        if body.get("parallel_tool_calls") is False:
            choice["disable_parallel_tool_use"] = True
        read["tool_choice"] = choice
    if body.get("stop"):
        stop = body["stop"]
        read["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("stream"):
        read["stream"] = True
    return read


def _joined_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content)


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning})
    text = _joined_text(message["content"]) if message.get("content") else ""
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": json.loads(function["arguments"]),
            }
        )
    return blocks


def _result_block(message: Mapping[str, Any]) -> dict[str, Any]:
    text = _joined_text(message["content"])
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message["tool_call_id"]}
    if text.startswith(ERROR_PREFIX):
        text = text[len(ERROR_PREFIX) :]
        block["is_error"] = True
    if text:
        block["content"] = text
    return block


def _user_block(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part["type"]
    if kind == "text":
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        url = str((part.get("image_url") or {}).get("url", ""))
        if url.startswith("data:") and ";base64," in url:
            media, _, data = url[5:].partition(";base64,")
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media, "data": data},
            }
        return {"type": "image", "source": {"type": "url", "url": url}}
    if kind == "file":
        file = part.get("file") or {}
        if "file_id" in file:
            return {"type": "document", "source": {"type": "file", "file_id": file["file_id"]}}
        media, _, data = str(file.get("file_data", ""))[5:].partition(";base64,")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            data = ""
        return {"type": "document", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "text", "text": json.dumps(dict(part))}


def _tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    definition = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        definition["description"] = function["description"]
    return definition


def _read_tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, Mapping):
        return {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    return None


# --------------------------------------------------------------------------- blocks -> chat

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "refusal": "content_filter",
}


def _finish_reason(message: Mapping[str, Any], quirks: _Quirks) -> str:
    reason = message.get("stop_reason")
    if reason == "tool_use":
        return quirks.finish_reason_with_tools
    if reason is None:
        return "stop"
    return _FINISH.get(str(reason), str(reason))


def _usage(message: Mapping[str, Any]) -> dict[str, Any]:
    usage = message.get("usage") or {}
    cached = int(usage.get("cache_read_input_tokens") or 0)
    prompt = (
        int(usage.get("input_tokens") or 0)
        + cached
        + int(usage.get("cache_creation_input_tokens") or 0)
    )
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_of(message: Mapping[str, Any], quirks: _Quirks | None = None) -> dict[str, Any]:
    """The `chat.completion` body for a scripted Messages API answer."""
    quirks = quirks or _Quirks()
    content = message.get("content") or []
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    reasoning = "".join(b.get("thinking", "") for b in content if b.get("type") == "thinking")
    calls = []
    for block in content:
        if block.get("type") != "tool_use":
            continue
        call: dict[str, Any] = {
            "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))},
        }
        if quirks.ids != "none":
            call = {"id": block["id"], **call}
        calls.append(call)
    chat: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        chat[quirks.reasoning_field] = reasoning
    if calls:
        chat["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": message.get("model", "scripted"),
        "choices": [
            {"index": 0, "message": chat, "finish_reason": _finish_reason(message, quirks)}
        ],
        "usage": _usage(message),
    }


Chunk = dict[str, Any] | str
"""A streamed chunk (`chat.completion.chunk`), or the closing `[DONE]`."""


def chat_chunks(
    events: Sequence[tuple[float, str, Any]],
    message: Mapping[str, Any],
    quirks: _Quirks | None = None,
    *,
    usage: bool = False,
) -> list[tuple[float, Chunk]]:
    """The chunks a Chat Completions server streams for a message's Messages API events.

    `events` are `(seconds to wait before it, event name, data)`; an event that has no
    chunk of its own passes its pause on to the next chunk. Usage comes in a chunk of its
    own before `[DONE]` when `usage` is asked for.
    """
    quirks = quirks or _Quirks()
    head = {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": message.get("model", "scripted"),
    }
    out: list[tuple[float, Chunk]] = []
    carried = 0.0
    calls: dict[int, int] = {}  # block index -> call index
    ids: dict[int, str] = {}  # block index -> call id
    whole: dict[int, dict[str, Any]] = {}  # block index -> the call being gathered

    def emit(pause: float, delta: Mapping[str, Any] | None, **extra: Any) -> None:
        nonlocal carried
        chunk: dict[str, Any] = {**head, **extra}
        if delta is not None:
            chunk["choices"] = [{"index": 0, "delta": dict(delta), "finish_reason": None}]
        out.append((carried + pause, chunk))
        carried = 0.0

    def call_part(index: int, **fields: Any) -> dict[str, Any]:
        return {"tool_calls": [{"index": calls[index], **fields}]}

    for pause, name, data in events:
        if name == "message_start":
            emit(pause, {"role": "assistant", "content": ""})
        elif name == "content_block_start" and data["content_block"].get("type") == "tool_use":
            block = data["content_block"]
            calls[data["index"]] = len(calls)
            ids[data["index"]] = block["id"]
            if quirks.whole_tool_calls:
                whole[data["index"]] = {"id": block["id"], "name": block["name"], "arguments": []}
                carried += pause
                continue
            fields: dict[str, Any] = {"type": "function"}
            if quirks.ids != "none":
                fields["id"] = block["id"]
            fields["function"] = {"name": block["name"], "arguments": ""}
            emit(pause, call_part(data["index"], **fields))
        elif name == "content_block_delta":
            delta = data["delta"]
            kind = delta.get("type")
            if kind == "text_delta":
                emit(pause, {"content": delta["text"]})
            elif kind == "thinking_delta":
                emit(pause, {quirks.reasoning_field: delta["thinking"]})
            elif kind == "input_json_delta" and data["index"] in calls and delta["partial_json"]:
                if data["index"] in whole:
                    whole[data["index"]]["arguments"].append(delta["partial_json"])
                    carried += pause
                    continue
                fields = {"function": {"arguments": delta["partial_json"]}}
                if quirks.ids == "every":
                    fields["id"] = ids[data["index"]]
                emit(pause, call_part(data["index"], **fields))
            else:
                carried += pause
        elif name == "content_block_stop" and data["index"] in whole:
            gathered = whole.pop(data["index"])
            fields = {"type": "function"}
            if quirks.ids != "none":
                fields["id"] = gathered["id"]
            fields["function"] = {
                "name": gathered["name"],
                "arguments": "".join(gathered["arguments"]) or "{}",
            }
            # Servers that send calls whole number every one of them 0.
            emit(pause, {"tool_calls": [{"index": 0, **fields}]})
        elif name == "message_delta":
            finish = _finish_reason({"stop_reason": data["delta"].get("stop_reason")}, quirks)
            chunk = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            out.append((carried + pause, chunk))
            carried = 0.0
        elif name == "message_stop":
            if usage:
                emit(pause, None, choices=[], usage=_usage(message))
            out.append((0.0, "[DONE]"))
        else:
            carried += pause
    return out


# --------------------------------------------------------------------------- the server

_MALFORMED_JSON = b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"mess'
_MALFORMED_SSE = b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "cho\n\n'


def _error_body(kind: str, message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _ChatHandler(_Handler):
    """Answers `POST /v1/chat/completions` from the script."""

    _usage = False
    """Whether the request asked for usage in its stream (`stream_options`)."""
    _quirks: _Quirks
    """The server quirks this request is answered with."""

    def do_GET(self) -> None:
        """No `GET` route here (the model list is the Messages server's)."""
        self._json(404, _error_body("invalid_request_error", f"no route {self.path}"))

    def do_POST(self) -> None:
        """Check the request, read it for the script, answer as a chat completion."""
        quirks = cast(_Quirks, getattr(self.server, "quirks"))  # noqa: B009
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        arrived = time.monotonic()
        path, _, query = self.path.partition("?")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._json(404, _error_body("invalid_request_error", f"no route {self.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, _error_body("invalid_request_error", "request body is not valid JSON"))
            return
        seen = RecordedRequest(
            path, dict(parse_qsl(query)), {k.lower(): v for k, v in self.headers.items()}, body
        )
        with self.server.lock:
            self.server.received.append(body)
            self.server.recorded.append(seen)
            self.server.arrivals.append(arrived)
        problem = check_chat_request(
            body,
            id_length=quirks.id_length,
            single_system=quirks.single_system,
            tool_choices=quirks.tool_choices,
            refuse_fields=quirks.refuse_fields,
        )
        if problem is not None:
            self._json(400, _error_body("invalid_request_error", problem))
            return
        try:
            answer = self.server.model.respond(read_chat_request(body))
        except AgentloopError as exc:
            self._json(400, _error_body("invalid_request_error", str(exc)))
            return
        options = body.get("stream_options") or {}
        usage = bool(isinstance(options, Mapping) and options.get("include_usage"))
        self._usage, self._quirks = usage, quirks
        try:
            self._answer(answer, stream=bool(body.get("stream")))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _answer(self, answer: Answer, *, stream: bool) -> None:
        usage, quirks = self._usage, self._quirks
        if isinstance(answer, Fault):
            self._fault(answer, stream=stream)
        elif isinstance(answer, Paced):
            if not stream:
                if self._wait(answer.total_delay):
                    self._json(200, completion_of(answer.message, quirks))
                else:
                    self._drop()
                return
            self._open_stream()
            for pause, chunk in chat_chunks(answer.schedule(), answer.message, quirks, usage=usage):
                if pause and not self._wait(pause):
                    self._drop()
                    return
                self._write_chunks([chunk])
            self._close_stream()
        elif isinstance(answer, RawResponse):
            if answer.sse is not None:
                self._send(answer.status, answer.sse.encode(), "text/event-stream", answer.headers)
            else:
                self._json(answer.status, answer.json, answer.headers)
        elif stream:
            chunks = chat_chunks(_timed(message_events(answer)), answer, quirks, usage=usage)
            self._send(200, b"".join(_sse(c) for _, c in chunks), "text/event-stream")
        else:
            self._json(200, completion_of(answer, quirks))

    malformed_json = _MALFORMED_JSON
    malformed_sse = _MALFORMED_SSE

    def _error_of(self, fault: Fault) -> Any:
        return _error_body(fault.error_type, fault.message)

    def _write_start(self, answer: dict[str, Any], blocks: int) -> None:
        events = _timed(_cut(message_events(answer), blocks))
        self._write_chunks([c for _, c in chat_chunks(events, answer, self._quirks)])

    def _write_stream_error(self, fault: Fault) -> None:
        self._write_chunks([_error_body(fault.error_type, fault.message)])

    def _write_chunks(self, chunks: Sequence[Chunk]) -> None:
        """Write chunks as HTTP chunks, one each, so each is flushed as it is written."""
        for chunk in chunks:
            payload = _sse(chunk)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))


def _timed(events: Sequence[tuple[str, Any]]) -> list[tuple[float, str, Any]]:
    return [(0.0, name, data) for name, data in events]


def _sse(chunk: Chunk) -> bytes:
    data = chunk if isinstance(chunk, str) else json.dumps(chunk)
    return f"data: {data}\n\n".encode()


class ChatCompletionsServer(MessagesServer):
    """A scripted Chat Completions API on 127.0.0.1, for the real `AsyncOpenAI` to talk to.

    ```python
    script = [reply(tool_call("add", {"a": 1, "b": 2})), reply("3")]
    async with ChatCompletionsServer(script) as server:
        agent = Agent(provider=OpenAIChatProvider(server.client()), tools=[add])
        result = await agent.run("1 + 2?")
    ```

    The script is the same as for `MessagesServer` (`reply`, `tool_call`, `Fault`,
    `Paced`, `RawResponse`; a `RawResponse` is sent as it is, so it holds Chat
    Completions JSON or SSE). `requests` are the Chat Completions bodies received;
    `model.requests` are the same requests read into the Messages API shape the script
    saw. A request that breaks the format's rules gets a 400 `invalid_request_error`.
    """

    _handler = _ChatHandler

    def __init__(
        self,
        script: Script | ScriptedModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        whole_tool_calls: bool = False,
        ids: Literal["first", "every", "none"] = "first",
        id_length: int | None = None,
        tool_choices: Collection[str] | None = None,
        single_system: bool = False,
        refuse_fields: Collection[str] = (),
        finish_reason_with_tools: str = "tool_calls",
        reasoning_field: str = "reasoning_content",
    ) -> None:
        """Create (but do not start) a server answering from `script`.

        Args:
            script: A script or a `ScriptedModel`, as `MessagesServer` takes it.
            host: Address to listen on.
            port: Port to listen on (0: any free one).
            whole_tool_calls: Stream each tool call whole in one chunk, every one with
                `index: 0` (as Ollama does).
            ids: Send a streamed call's id on its first chunk (`"first"`, as OpenAI
                does), on every chunk (`"every"`), or never (`"none"`, in JSON too).
            id_length: Refuse tool-call ids that are not exactly this many letters and
                digits (as Mistral templates do).
            tool_choices: The `tool_choice` values accepted (`"auto"`, `"none"`,
                `"required"`, `"function"`); others are refused. None accepts all.
            single_system: Refuse a system message that is not the first message, or a
                second one.
            refuse_fields: Request fields refused with a 400 (`"max_tokens"`,
                `"stream_options"`, ...).
            finish_reason_with_tools: The `finish_reason` sent with tool calls (some
                servers send `"stop"`).
            reasoning_field: Where reasoning text goes (`"reasoning_content"` or
                `"reasoning"`).
        """
        super().__init__(script, host=host, port=port)
        quirks = _Quirks(
            whole_tool_calls=whole_tool_calls,
            ids=ids,
            id_length=id_length,
            tool_choices=frozenset(tool_choices) if tool_choices is not None else None,
            single_system=single_system,
            refuse_fields=frozenset(refuse_fields),
            finish_reason_with_tools=finish_reason_with_tools,
            reasoning_field=reasoning_field,
        )
        self._httpd.quirks = quirks  # type: ignore[attr-defined]

    def client(self, **options: Any) -> Any:
        """An `openai.AsyncOpenAI` pointed at this server (no retries by default).

        `options` go to `AsyncOpenAI`, e.g. `max_retries=2` or `timeout=0.2`.
        """
        import openai

        options.setdefault("api_key", "sk-local-test")
        options.setdefault("max_retries", 0)
        client = openai.AsyncOpenAI(base_url=self.base_url + "/v1", **options)
        self._clients.append(client)
        return client
