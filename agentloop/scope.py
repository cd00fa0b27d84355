"""The run under way, for code that runs inside it without being handed it.

A history processor's summary request and a sub-agent run as a tool spend on the run's
behalf. The agent sets `current_scope` for the length of each run (tool calls and
processors inherit it, as anyio tasks copy the context), so they can count their usage in
the run and, for a sub-agent, take what is left of its budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from .providers.base import Provider
from .run import RunState

__all__ = ("RunScope", "current_scope", "entered")


@dataclass(frozen=True)
class RunScope:
    """The run under way, with the provider and model its requests go to."""

    run: RunState
    provider: Provider
    model: str


current_scope: ContextVar[RunScope | None] = ContextVar("agentloop_run_scope", default=None)
"""The innermost run under way in this context, or None outside any run."""


@contextmanager
def entered(scope: RunScope) -> Iterator[None]:
    """`scope` is the current one inside the `with` block."""
    token = current_scope.set(scope)
    try:
        yield
    finally:
        current_scope.reset(token)
