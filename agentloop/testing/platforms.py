"""The cloud platforms' wire for `MessagesServer`: their paths, bodies and Bedrock's frames.

Bedrock's client posts a message request to `/model/{model}/invoke` (streamed:
`/invoke-with-response-stream`, answered in AWS event-stream frames), Vertex AI's to
`.../publishers/anthropic/models/{model}:rawPredict` (streamed: `:streamRawPredict`,
answered in SSE); both move the model into the path and put their API version in the
body. The other platform clients (Mantle, Foundry, AWS, Google Cloud) use the first-party
paths, so the server needs nothing more for them.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

__all__ = (
    "EVENT_STREAM_TYPE",
    "PlatformRoute",
    "event_stream_chunk",
    "event_stream_exception",
    "messages_request",
    "platform_route",
)

EVENT_STREAM_TYPE = "application/vnd.amazon.eventstream"
"""The content type of a Bedrock stream."""

_BEDROCK = re.compile(r"/model/(?P<model>[^/]+)/(?P<action>invoke|invoke-with-response-stream)")
_VERTEX = re.compile(
    r"(?:/v1)?/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/"
    r"(?P<model>[^/:]+):(?P<action>rawPredict|streamRawPredict)"
)
_VERTEX_COUNT_TOKENS = "count-tokens"
"""The model segment of Vertex AI's token-counting path."""

_BEDROCK_EXCEPTIONS = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "api_error": "internalServerException",
    "invalid_request_error": "validationException",
}
"""The Bedrock stream exception standing for a Messages API error type."""


@dataclass(frozen=True)
class PlatformRoute:
    """A platform's request path, read: which platform, which model, which answer."""

    platform: Literal["bedrock", "vertex"]
    model: str
    """The model the path names (`count-tokens` on Vertex AI's token-counting path)."""
    stream: bool
    """The path asks for a streamed answer."""
    counts_tokens: bool = False
    """The path is Vertex AI's token count, whose body keeps its `model`."""


def platform_route(path: str) -> PlatformRoute | None:
    """The Bedrock or Vertex AI request `path` stands for, or None for another path."""
    if found := _BEDROCK.fullmatch(path):
        return PlatformRoute("bedrock", unquote(found["model"]), found["action"] != "invoke")
    if found := _VERTEX.fullmatch(path):
        model = unquote(found["model"])
        stream = found["action"] == "streamRawPredict"
        return PlatformRoute("vertex", model, stream, counts_tokens=model == _VERTEX_COUNT_TOKENS)
    return None


def messages_request(route: PlatformRoute, body: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API request a platform request's `body` stands for.

    The platform's own fields (`anthropic_version`, Bedrock's `anthropic_beta`) are left
    out; the model and the choice to stream come back from the path.
    """
    request = {k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")}
    if route.counts_tokens:
        return request
    request["model"] = route.model
    if route.stream:
        request["stream"] = True
    return request


def event_stream_chunk(event: Mapping[str, Any]) -> bytes:
    """A Bedrock stream frame carrying one Messages API stream event (base64 JSON)."""
    encoded = base64.b64encode(json.dumps(event).encode()).decode()
    headers = {":event-type": "chunk", ":content-type": "application/json"}
    return _frame({**headers, ":message-type": "event"}, json.dumps({"bytes": encoded}))


def event_stream_exception(error_type: str, message: str) -> bytes:
    """A Bedrock stream frame reporting an error, named as Bedrock names it."""
    name = _BEDROCK_EXCEPTIONS.get(error_type, "modelStreamErrorException")
    headers = {":exception-type": name, ":content-type": "application/json"}
    return _frame({**headers, ":message-type": "exception"}, json.dumps({"message": message}))


def _frame(headers: Mapping[str, str], payload: str) -> bytes:
    """One AWS event-stream message: prelude, its CRC32, string headers, payload, CRC32."""
    head = b"".join(_header(name, value) for name, value in headers.items())
    body = payload.encode()
    prelude = struct.pack(">II", 12 + len(head) + len(body) + 4, len(head))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + body
    return message + struct.pack(">I", zlib.crc32(message))


def _header(name: str, value: str) -> bytes:
    """A string header (type 7): name length, name, type, value length, value."""
    key, data = name.encode(), value.encode()
    return struct.pack(">B", len(key)) + key + b"\x07" + struct.pack(">H", len(data)) + data
