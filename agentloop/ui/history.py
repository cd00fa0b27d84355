"""A front end's conversation, turned into the history a run starts from.

AG-UI sends `Message`s (user, assistant with `toolCalls`, tool results); the AI SDK's
`useChat` sends `UIMessage`s (parts, an assistant message spanning several steps). Both
become Messages-API wire messages here, mended by `agentloop.repairs.repair` (a call the
front end never answered gets an `is_error` result), so a run always starts from a valid
history. System and developer messages are dropped: the agent's instructions are the
service's, not the page's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.errors import HistoryError
from agentloop.messages import dump_history
from agentloop.repairs import repair

__all__ = ("agui_history", "ui_message_history")

_Wire = dict[str, Any]


def agui_history(messages: Sequence[Mapping[str, Any]]) -> list[_Wire]:
    """The wire history of an AG-UI `RunAgentInput.messages` list.

    Raises:
        HistoryError: a message is not an object, or a tool call's arguments are not a
            JSON object.
    """
    out: list[_Wire] = []
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise HistoryError(f"messages[{position}] is not an object")
        role = message.get("role")
        if role == "user":
            _append(out, "user", _content_blocks(message.get("content")))
        elif role == "assistant":
            blocks = _content_blocks(message.get("content"))
            for call in message.get("toolCalls") or ():
                function = call.get("function") or {}
                blocks.append(
                    _tool_use(
                        str(call.get("id", "")),
                        str(function.get("name", "")),
                        _arguments(function.get("arguments"), position),
                    )
                )
            _append(out, "assistant", blocks)
        elif role == "tool":
            error = message.get("error")
            text = error or _text_of(message.get("content"))
            _append(out, "user", [_tool_result(str(message.get("toolCallId", "")), text, error)])
        # system, developer, reasoning and activity messages are not the model's history
    return _mended(out)


def ui_message_history(messages: Sequence[Mapping[str, Any]]) -> list[_Wire]:
    """The wire history of `useChat`'s `UIMessage` list (AI SDK UI messages).

    An assistant message is split at its `step-start` parts: each step is one model
    response, followed by the results of its tool calls.

    Raises:
        HistoryError: a message or part is not an object.
    """
    out: list[_Wire] = []
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise HistoryError(f"messages[{position}] is not an object")
        parts = message.get("parts") or []
        if not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
            raise HistoryError(f"messages[{position}].parts is not a list of objects")
        if message.get("role") == "user":
            _append(out, "user", [b for p in parts if (b := _ui_user_block(p))])
        elif message.get("role") == "assistant":
            for step in _steps(parts):
                blocks: list[_Wire] = []
                results: list[_Wire] = []
                for part in step:
                    kind = str(part.get("type", ""))
                    if kind == "text" and part.get("text"):
                        blocks.append({"type": "text", "text": str(part["text"])})
                    elif kind == "dynamic-tool" or kind.startswith("tool-"):
                        name = part.get("toolName") or kind.removeprefix("tool-")
                        call_id = str(part.get("toolCallId", ""))
                        blocks.append(_tool_use(call_id, str(name), _object(part.get("input"))))
                        result = _ui_tool_result(call_id, part)
                        if result is not None:
                            results.append(result)
                _append(out, "assistant", blocks)
                if results:
                    _append(out, "user", results)
    return _mended(out)


def _steps(parts: list[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    steps: list[list[Mapping[str, Any]]] = [[]]
    for part in parts:
        if part.get("type") == "step-start":
            if steps[-1]:
                steps.append([])
        else:
            steps[-1].append(part)
    return steps


def _ui_user_block(part: Mapping[str, Any]) -> _Wire | None:
    if part.get("type") == "text" and part.get("text"):
        return {"type": "text", "text": str(part["text"])}
    if part.get("type") == "file":
        return _image(str(part.get("mediaType", "")), str(part.get("url", "")))
    return None


def _ui_tool_result(call_id: str, part: Mapping[str, Any]) -> _Wire | None:
    state = part.get("state")
    if state == "output-available":
        output = part.get("output")
        text = output if isinstance(output, str) else json.dumps(output)
        return _tool_result(call_id, text, None)
    if state == "output-error":
        return _tool_result(call_id, str(part.get("errorText") or "error"), True)
    if state == "output-denied":
        return _tool_result(call_id, "Denied", True)
    return None  # not answered: `repair` answers it


def _content_blocks(content: Any) -> list[_Wire]:
    """AG-UI content (a string or input parts) as content blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[_Wire] = []
    for part in content or ():
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text" and part.get("text"):
            blocks.append({"type": "text", "text": str(part["text"])})
        elif part.get("type") == "image" and isinstance(part.get("source"), Mapping):
            source = part["source"]
            if source.get("type") == "data":
                url = f"data:{source.get('mimeType', '')};base64,{source.get('value', '')}"
            else:
                url = str(source.get("value", ""))
            image = _image(str(source.get("mimeType") or "image/"), url)
            if image is not None:
                blocks.append(image)
    return blocks


def _image(media_type: str, url: str) -> _Wire | None:
    """An image block for a data: or http(s) URL of an image; None for anything else."""
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        kind = header.removeprefix("data:").split(";")[0]
        if kind.startswith("image/") and ";base64" in header:
            return {"type": "image", "source": {"type": "base64", "media_type": kind, "data": data}}
        return None
    if media_type.startswith("image/") and url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = [str(p.get("text", "")) for p in content or () if isinstance(p, Mapping)]
    return "".join(texts)


def _arguments(arguments: Any, position: int) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        raise HistoryError(
            f"messages[{position}]: a tool call's arguments are not valid JSON"
        ) from None
    if not isinstance(value, dict):
        raise HistoryError(f"messages[{position}]: a tool call's arguments are not an object")
    return value


def _object(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _tool_use(call_id: str, name: str, input: dict[str, Any]) -> _Wire:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input}


def _tool_result(call_id: str, text: str, error: Any) -> _Wire:
    block: _Wire = {"type": "tool_result", "tool_use_id": call_id, "content": text}
    if error:
        block["is_error"] = True
    return block


def _append(out: list[_Wire], role: str, blocks: list[_Wire]) -> None:
    """Add `blocks` as a message of `role`, merged into the last one if it has that role."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _mended(messages: list[_Wire]) -> list[_Wire]:
    # tool_result blocks must come first in their message (a tool message may follow
    # a user's text in AG-UI's order)
    for message in messages:
        if message["role"] == "user":
            message["content"].sort(key=lambda b: b.get("type") != "tool_result")
    return dump_history(repair(messages).messages)
