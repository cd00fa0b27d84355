"""What a client is told when its request's run fails: nothing it cannot see.

`client_failure` answers a failed `Call` through `errors.answer_failure`, after two
changes: an upstream error of a request that carried hidden turns loses its message (it
may quote them), and a history error found in the restored history is numbered as the
client sent its messages (the stored hidden messages are not counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.errors import HistoryError
from agentloop.messages import ROLES

from .calls import Call
from .errors import Failure, answer_failure

__all__ = ("carried_hidden", "client_failure", "numbered_as_sent")


def carried_hidden(call: Call, error: BaseException) -> bool:
    """Whether the upstream request that failed with `error` carried hidden turns.

    It did when the conversation's stored hidden turns were restored, or when one of the
    gateway's own calls ran in this run (a later round sends it and its result).
    """
    partial = getattr(error, "result", None)
    return call.session is not None or bool(getattr(partial, "tool_calls", None))


def client_failure(call: Call, error: Exception) -> Failure:
    """How the failed run of `call` is answered (see the module)."""
    if isinstance(error, HistoryError):
        error = numbered_as_sent(error, call.history, call.visible)
    return answer_failure(error, call.request_id, hidden=carried_hidden(call, error))


def numbered_as_sent(
    error: HistoryError, history: Sequence[Any], sent: Sequence[Any]
) -> HistoryError:
    """`error`, found in `history`, with its path in the messages the client `sent`.

    The client's new messages end the history (the first may be merged into the last
    stored one), so a message is found by counting from the end. Its turn is numbered as
    the API numbers them (consecutive messages of one role are one); a block is found in
    the client's turn by its value. A problem in the stored part loses its path.
    """
    if error.index is None or list(history) == list(sent) or not error.path:
        return error
    text = str(error).removeprefix(f"{error.path}: ")
    index = len(sent) - (len(history) - error.index)
    if not 0 <= index < len(sent):
        return HistoryError(text)
    parts = error.path.split(".")  # messages, N, then content, J, ... or role
    path = f"messages.{_turn_number(sent, index)}"
    if len(parts) > 3 and parts[2] == "content" and parts[3].isdigit():
        block = _at(_turn_blocks(history, error.index), int(parts[3]))
        mine = _turn_blocks(sent, index)
        if block is not None and block in mine:
            path += ".content." + ".".join([str(mine.index(block)), *parts[4:]])
    elif len(parts) > 2 and parts[2] != "content":
        path += "." + ".".join(parts[2:])
    return HistoryError(text, path=path, index=index)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def _turn_number(messages: Sequence[Any], index: int) -> int:
    """The API's number of the turn holding `messages[index]`."""
    number, last = -1, None
    for message in messages[: index + 1]:
        role = _role(message)
        if role in ROLES and role != last:
            number, last = number + 1, role
    return max(number, 0)


def _turn_blocks(messages: Sequence[Any], index: int) -> list[Any]:
    """The content blocks of the turn holding `messages[index]`, in order."""
    role = _role(messages[index])
    first = index
    while first > 0 and _role(messages[first - 1]) == role:
        first -= 1
    last = index
    while last + 1 < len(messages) and _role(messages[last + 1]) == role:
        last += 1
    blocks: list[Any] = []
    for message in messages[first : last + 1]:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        elif isinstance(content, list):
            blocks.extend(content)
    return blocks


def _at(blocks: Sequence[Any], position: int) -> Any:
    return blocks[position] if 0 <= position < len(blocks) else None
