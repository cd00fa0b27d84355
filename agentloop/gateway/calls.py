"""One client request, ready to run: the agent (over its upstream provider), its session.

`Gateway` (in `app`) prepares a `Call` from the request and answers it as JSON or as a
stream (`streaming`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from agentloop.agent import Agent

from .sessions import Session, Thread

__all__ = ("Call", "ThreadCall", "continued_trace")


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
