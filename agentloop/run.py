"""The state of one run: its history, token usage, tool-call log and limits.

`Agent` makes one `RunState` per run and drives it; the turn under way and the stream
handle read and report through it. Keeping it apart from `Agent` lets one agent serve any
number of concurrent runs, and keeps the modules below the agent free of it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import anyio

from .history import History
from .providers.base import ModelResponse
from .result import RunResult, StopReason, ToolCallRecord, Usage
from .tools import ToolCall, ToolResult
from .tracing import Tracing

__all__ = ("CANCELLED_MESSAGE", "RunState")

CANCELLED_MESSAGE = "Cancelled: the run was stopped before this call finished."


class RunState:
    """One run's state. Its history changes only through `History`'s methods."""

    def __init__(self, history: History, *, deps: Any, tool_concurrency: int, log: Any) -> None:
        """Start a run over `history`; `log` gets the run's id bound."""
        self.id = uuid.uuid4().hex
        self.history = history
        self.deps = deps
        self.usage = Usage()
        self.rounds = 0
        self.calls: list[ToolCallRecord] = []
        self.container: str | None = None
        self.limiter = anyio.CapacityLimiter(tool_concurrency)
        self.log = log.bind(run_id=self.id)
        self.turn: Any = None
        """The round under way (a `Turn`): what `end_early` must close after a failure."""
        self.stop_after_turn = False
        """Set by `RunStream.cancel(after_turn=True)`."""
        self.partial: RunResult | None = None
        """The result handed over when the run ended early."""
        self.final: RunResult | None = None
        """The result of a run that finished."""
        self.tracing: Tracing | None = None
        """The run's spans, when a tracer provider records them."""
        self.external: tuple[Any, ...] = ()
        """Definitions of external tools announced with each request."""
        self.external_names: frozenset[str] = frozenset()
        self.pending: list[dict[str, Any]] = []
        """Calls of external tools handed back to the caller (wire `tool_use` blocks)."""
        self.held: list[dict[str, Any]] = []
        """The run's own results of the turn that handed calls back (wire blocks)."""

    def add_response(
        self, response: ModelResponse, errors: dict[str, str] | None = None
    ) -> list[ToolCall]:
        """Count the response's usage and add it to the history; return its calls."""
        self.usage += response.usage
        if response.container and response.container.get("id"):
            self.container = str(response.container["id"])
        return self.history.add_response(response, errors)

    def add_results(self, pairs: Sequence[tuple[ToolCall, ToolResult]]) -> None:
        """Answer a turn's calls in the history and log them."""
        self.history.answer([result for _, result in pairs])
        self.log_calls(pairs)

    def hand_back(
        self, calls: Sequence[ToolCall], own: Sequence[tuple[ToolCall, ToolResult]]
    ) -> None:
        """End the run's turns here: `calls` go back to the caller, `own` results are held."""
        self.pending = [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in calls
        ]
        self.held = [r.to_block().to_wire() for _, r in own]
        self.log_calls(own)

    def log_calls(self, pairs: Sequence[tuple[ToolCall, ToolResult]]) -> None:
        """Add the calls to `RunResult.tool_calls`."""
        for call, r in pairs:
            self.calls.append(
                ToolCallRecord(
                    self.rounds, r.name, call.input, r.tool_use_id, r.is_error, r.text, r.duration
                )
            )

    def end_early(self, why: str, stop_reason: StopReason) -> RunResult:
        """Close the turn under way after a failure or cancellation; return the partial result."""
        if self.turn is not None:
            self.turn.close(why)
            self.turn = None
        self.partial = self.result(stop_reason)
        return self.partial

    def result(self, stop_reason: StopReason) -> RunResult:
        """The run's result as it stands."""
        return RunResult(
            text=self.history.last_text,
            stop_reason=stop_reason,
            messages=self.history.dump(),
            tool_calls=list(self.calls),
            usage=self.usage,
            rounds=self.rounds,
            run_id=self.id,
            pending=list(self.pending),
            held=list(self.held),
        )
