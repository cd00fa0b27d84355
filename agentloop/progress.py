"""Progress of a running tool call, as `ToolProgress` events of a streamed run.

The streamed run (`stream.py`) names where events go and the registry names the call
running, each in a context variable, so a tool reports without taking a parameter:
`report_progress(3, 10, "copying")`. Outside a streamed run, or outside a tool call, a
report goes nowhere. A tool that forwards progress from elsewhere (an MCP server's
notifications, which arrive in another task) takes `progress_reporter()` while it runs and
calls what it got from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .events import Event, ToolProgress

__all__ = (
    "ProgressReporter",
    "emit_event",
    "progress_reporter",
    "report_event",
    "report_progress",
)

ProgressReporter = Callable[[float, "float | None", "str | None"], None]
"""`reporter(progress, total, message)`: one report of the call it was taken in."""

_sink: ContextVar[Callable[[Event], None] | None] = ContextVar("agentloop_events", default=None)
_emit: ContextVar[Callable[[Event], Awaitable[None]] | None] = ContextVar(
    "agentloop_emit", default=None
)
_call: ContextVar[tuple[int, str, str] | None] = ContextVar("agentloop_call", default=None)


def progress_reporter() -> ProgressReporter | None:
    """The reporter of the tool call running here, or None when no one listens.

    Call it from the tool's own task (async code on the run's event loop); what it returns
    may be called from any task of that loop, for as long as the run lasts.
    """
    sink, call = _sink.get(), _call.get()
    if sink is None or call is None:
        return None
    round_, tool_use_id, name = call

    def report(progress: float, total: float | None = None, message: str | None = None) -> None:
        sink(ToolProgress(round_, tool_use_id, name, progress, total, message))

    return report


def report_progress(
    progress: float, total: float | None = None, message: str | None = None
) -> None:
    """Report how far the running tool call got, as a `ToolProgress` event of the stream.

    Args:
        progress: How far it got (grows with each report).
        total: The value `progress` reaches at the end, when known.
        message: What it is doing, in words.
    """
    reporter = progress_reporter()
    if reporter is not None:
        reporter(progress, total, message)


def report_event(event: Event) -> None:
    """Put `event` on the stream of the run whose task this is; nowhere outside a run.

    For events made below the run's loop, where no handler is passed down: a provider's
    `RequestRetry`, for one.
    """
    sink = _sink.get()
    if sink is not None:
        sink(event)


async def emit_event(event: Event) -> None:
    """Hand `event` to the run whose task this is: its `on_event` (awaited), its stream.

    Nowhere outside a run. For async code below the run's loop (a provider's
    `RequestRetry`); `report_event` is for code that cannot await.
    """
    emit = _emit.get()
    if emit is not None:
        await emit(event)
    else:
        report_event(event)


@contextmanager
def events_to(
    sink: Callable[[Event], None], emit: Callable[[Event], Awaitable[None]] | None = None
) -> Iterator[None]:
    """Within the block (and tasks started in it), reports go to `sink`.

    Events emitted there (`emit_event`) go to `emit` (or to `sink` when it is None).
    """
    token, emit_token = _sink.set(sink), _emit.set(emit)
    try:
        yield
    finally:
        _emit.reset(emit_token)
        _sink.reset(token)


@contextmanager
def running_call(round_: int, tool_use_id: str, name: str) -> Iterator[None]:
    """Within the block, progress reports are the call's."""
    token = _call.set((round_, tool_use_id, name))
    try:
        yield
    finally:
        _call.reset(token)
