"""One client request, ready to run: the agent (over its upstream provider), its session.

`Gateway` (in `app`) prepares a `Call` from the request and answers it as JSON or as a
stream (`streaming`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from agentloop.agent import Agent

from .errors import Refusal, store_failure
from .sessions import Session, Sessions, Thread, last_marker, moved_markers

__all__ = ("Call", "ThreadCall", "continued_trace", "expand_thread")


@dataclass
class ThreadCall:
    """A request of a message thread: what it continues and what it adds."""

    parent: Thread | None
    fields: dict[str, Any]
    added: list[Any]
    """The visible messages this request adds to the thread (before the reply)."""


@dataclass
class Call:
    """One client request, ready to run."""

    scope: str
    """The client's credential: what its sessions are scoped by."""
    agent: Agent
    """The run's agent, over an `UpstreamProvider` for this request."""
    history: list[dict[str, Any]]
    """The upstream history the run starts from."""
    visible: list[Any]
    """The conversation as the client sees it."""
    session: Session | None
    notes: dict[str, str]
    """Headers telling the client what happened to its session (`agentloop-session`)."""
    client_tools: list[Any]
    client_names: frozenset[str]
    stream: bool
    request_id: str
    model: str = ""
    """The model the client asked for."""
    thread: ThreadCall | None = None
    reply_id: str | None = None
    trace: Context | None = None
    """The W3C trace context the client sent (`traceparent`), which the run continues."""
    run_id: str | None = None
    """The durable run id of the request (`runs`), when the gateway runs it durably."""


@contextmanager
def continued_trace(call: Call) -> Iterator[None]:
    """Make the client's trace context current while its run lasts.

    The run's spans and its upstream requests then continue the client's trace.
    """
    if call.trace is None:
        yield
        return
    token = otel_context.attach(call.trace)
    try:
        yield
    finally:
        otel_context.detach(token)


async def expand_thread(
    sessions: Sessions, body: dict[str, Any], scope: str, *, within: float = math.inf
) -> ThreadCall | None:
    """Expand a message-thread request into a whole conversation (in place).

    The store has `within` seconds to find the thread.
    """
    thread = body.pop("thread", None)
    if thread is None:
        return None
    kind = thread.get("type") if isinstance(thread, dict) else None
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Refusal(400, "invalid_request_error", "messages: Field required")
    if kind == "create":
        fields: dict[str, Any] = {k: body[k] for k in ("system", "tools") if k in body}
        return ThreadCall(None, fields, list(messages))
    if kind != "continue":
        raise Refusal(400, "invalid_request_error", "thread.type: must be create or continue")
    previous = thread.get("previous_message_id")
    if not isinstance(previous, str) or not previous:
        raise Refusal(400, "invalid_request_error", "thread.previous_message_id: required")
    repeated = [k for k in ("system", "tools") if k in body]
    if repeated:
        raise Refusal(
            400,
            "invalid_request_error",
            f"{' and '.join(repeated)}: a thread keeps the values it was created with; "
            "a continue request cannot send them",
            {"error_code": "thread_fingerprint_mismatch"},
        )
    with store_failure("finding the thread", within=within):
        parent = await sessions.load_thread(sessions.thread_key(scope, previous))
    if parent is None:
        raise Refusal(
            404,
            "not_found_error",
            f"no thread holds a response with id {previous!r}",
            {"error_code": "thread_not_found"},
        )
    body.update(parent.fields)
    earlier = moved_markers(parent.messages, last_marker(parent.messages))
    body["messages"] = [*earlier, *messages]
    return ThreadCall(parent, parent.fields, list(messages))
