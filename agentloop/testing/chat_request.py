"""Chat Completions requests: the format's rules, and reading a request for the script.

`check_chat_request` says what is wrong with a request body (as an OpenAI-compatible
server would refuse it), `template_problem` what a server rendering the model's own chat
template cannot render; `read_chat_request` reads a checked one into the Messages API
shape the scripts see. Pure functions: `chat_server.ChatCompletionsServer` serves them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentloop.providers.openai import ERROR_PREFIX

__all__ = ("check_chat_request", "read_chat_request", "template_problem")


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


def template_problem(body: Mapping[str, Any]) -> str | None:
    """What a chat template that joins strings cannot render in a checked request, or None.

    Chat templates (Jinja, as llama-cpp-python renders the model's own) build the prompt
    by adding each message's `content` to strings: `null`, or a list of parts, fails
    there, although the format allows both. Only a user message holding an image or a
    file needs its parts (a server with a vision model reads them).
    """
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        if content is None:  # refused before the template sees it
            return f"messages[{i}].content: Input should be a valid string"
        if isinstance(content, str):
            continue
        if message.get("role") == "user" and any(p.get("type") != "text" for p in content):
            continue
        return f'can only concatenate str (not "{type(content).__name__}") to str'
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
    if body.get("response_format") is not None:
        read["response_format"] = body["response_format"]  # as sent: the script may read it
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
