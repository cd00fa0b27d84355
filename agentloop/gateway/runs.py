"""Durable requests: a client request's run id, so a retried request finds its run again.

With `agentloop serve --durable`, each client request the gateway runs with its own
tools is a durable run. Its id is an HMAC, with the gateway's secret, of the client's
credential and the request's canonical form (`canonical_request`): a client that sends
the same request again (its retry after the gateway crashed) gets the same id and
attaches to the run under way or finished, instead of running the gateway's tools again;
any other request gets another id.

The canonical form is what the request means, not how it was written: the body with
sorted keys, whole numbers written one way, `null` fields and `cache_control` markers
left out (markers only say what the upstream caches), the conversation in the normal
form of `sessions.canonical_json`, and `stream` left out (it only says how the answer
is delivered). The API headers that go upstream (`anthropic-version`, `anthropic-beta`)
and the query string are part of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentloop._wire import compact_json, random_id

from .sessions import Sessions, canonical_messages, canonical_numbers

__all__ = (
    "DELIVERY_FIELDS",
    "RUN_ID_PREFIX",
    "canonical_request",
    "reply_id",
    "request_run_id",
)

DELIVERY_FIELDS = frozenset({"stream"})
"""Body fields that say how the answer is delivered, not what the run does."""

RUN_ID_PREFIX = "gw-"
"""What every run id of a gateway request starts with."""


def canonical_request(
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
) -> bytes:
    """The request as bytes that depend only on what it asks for (see the module).

    Args:
        body: The request body as the client sent it (a message-thread request before
            the gateway expands it).
        headers: The API headers sent upstream (names in any case).
        query: The request's query parameters.
    """
    normal: dict[str, Any] = {}
    for name, value in body.items():
        if name in DELIVERY_FIELDS or name == "cache_control" or value is None:
            continue
        if name == "messages" and isinstance(value, list):
            normal[name] = canonical_messages(value)
        elif name in ("system", "tools") and isinstance(value, list):
            normal[name] = [canonical_numbers(_unmarked(item)) for item in value]
        else:
            normal[name] = canonical_numbers(value)
    request = {
        "body": normal,
        "headers": {k.lower(): v for k, v in (headers or {}).items()},
        "query": dict(query or {}),
    }
    return compact_json(request, sort_keys=True)


def _unmarked(item: Any) -> Any:
    """A system block or a tool without its `cache_control` marker and null fields."""
    if not isinstance(item, Mapping):
        return item
    return {k: v for k, v in item.items() if k != "cache_control" and v is not None}


def request_run_id(sessions: Sessions, credential: str, request: bytes) -> str:
    """The durable run id of a canonical `request` from the client holding `credential`."""
    return RUN_ID_PREFIX + sessions.run_key(credential, request)


def reply_id(run_id: str | None) -> str:
    """The id of a thread's reply: the same for every retry of a durable request."""
    if run_id is None:
        return random_id("msg_")
    return "msg_" + run_id.removeprefix(RUN_ID_PREFIX)[:24]
