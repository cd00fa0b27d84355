"""Reading a client request: its body, its headers, its credential.

Only what the gateway itself needs is checked (the body's size and nesting, the fields it
reads, the headers it forwards); every other field goes upstream unread, for the
upstream to judge.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request

from agentloop.calls import wire_tool_name
from agentloop.errors import ConfigurationError

from .errors import Refusal
from .upstream import forwarded_headers

__all__ = (
    "AGENT_FIELDS",
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "OPTION_NAMES",
    "CountFields",
    "MessagesFields",
    "api_headers",
    "check_fields",
    "client_tool_names",
    "credential",
    "json_object",
    "last_assistant",
)

# Request fields the Agent takes as its own options; every other field goes upstream as
# it is (through `params`).
AGENT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "stop_sequences",
        "stream",
        "thread",
    }
)
# Names the provider reads as request options rather than body fields: a client field of
# that name is sent in the body through `extra_body`.
OPTION_NAMES = frozenset(
    {
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
        "betas",
        "user_profile_id",
        "workspace_id",
    }
)


def api_headers(request: Request) -> dict[str, str]:
    """The client's API headers to send upstream, which must be ASCII as the API's are."""
    headers = forwarded_headers(request.headers)
    for name, value in headers.items():
        if not value.isascii():
            raise Refusal(400, "invalid_request_error", f"{name}: header value must be ASCII")
    return headers


def credential(request: Request) -> str | None:
    """The client's key: its `x-api-key`, or its `Authorization: Bearer` token."""
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


class CountFields(BaseModel):
    """The fields of a token count the gateway reads itself; the rest goes upstream unread.

    Strict: JSON types only, as the API takes them (a `"true"` is not a boolean).
    """

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    messages: list[Any]
    tools: list[dict[str, Any]] | None = None


class MessagesFields(CountFields):
    """The fields of a `/v1/messages` request the gateway reads itself."""

    max_tokens: int
    system: str | list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stop_sequences: list[Any] | None = None
    stream: bool | None = None


def check_fields(body: Mapping[str, Any], fields: type[BaseModel]) -> None:
    """Refuse a body whose fields do not fit `fields`, naming the first problem.

    As the API names it: `max_tokens: Field required`, `stream: Input should be a valid
    boolean`.
    """
    try:
        fields.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise Refusal(400, "invalid_request_error", f"{where}: {first['msg']}") from None


MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body served, as the API's limit (32 MB): larger ones get 413."""
MAX_DEPTH = 256
"""The deepest nesting of arrays and objects a request body may hold."""


async def json_object(request: Request) -> dict[str, Any]:
    """The request's body, which must be one JSON object of at most `MAX_BODY_BYTES`.

    The body is read in chunks and refused as soon as it is too large, so a huge body
    never sits in memory whole.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
        deep = not _shallow(body, MAX_DEPTH)
    except RecursionError:
        deep = True  # too deep even for the parser
    except ValueError as exc:
        raise Refusal(400, "invalid_request_error", f"the body is not valid JSON: {exc}") from None
    if deep:
        raise Refusal(
            400, "invalid_request_error", f"the body nests arrays and objects over {MAX_DEPTH} deep"
        )
    if not isinstance(body, dict):
        raise Refusal(400, "invalid_request_error", "the body must be a JSON object")
    return body


def _too_large() -> Refusal:
    message = f"the request exceeds the maximum size of {MAX_BODY_BYTES // 2**20} MB"
    return Refusal(413, "request_too_large", message)


def _shallow(value: Any, limit: int) -> bool:
    """Whether `value` nests lists and dicts at most `limit` deep (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children if isinstance(item, (dict, list)) else ():
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return False
                stack.append((child, depth + 1))
    return True


def last_assistant(messages: Sequence[Any]) -> int:
    """The index of the last assistant message, or -1."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            return i
    return -1


def client_tool_names(tools: Any, internal: frozenset[str]) -> frozenset[str]:
    """The names of the client's tools; a tool kind without a name is passed on as it is.

    Only what no upstream could take is refused: `tools` that is not a list of
    objects, a tool with neither a name nor a `type`, and a name of the gateway's own
    (`internal`).
    """
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise Refusal(400, "invalid_request_error", "tools: must be a list of tool objects")
    names: list[str] = []
    for number, definition in enumerate(tools):
        try:
            name = wire_tool_name(definition)
        except ConfigurationError as exc:
            raise Refusal(400, "invalid_request_error", f"tools.{number}: {exc}") from None
        if name is not None:
            names.append(name)
    clash = sorted(set(names) & internal)
    if clash:
        raise Refusal(
            400,
            "invalid_request_error",
            f"tools: {', '.join(clash)} is the name of a tool this gateway runs itself; "
            "rename the client tool",
        )
    return frozenset(names)
