"""The state of one run: its history, token usage, tool-call log and limits.

`Agent` makes one `RunState` per run, with everything the run needs; the turns under way
and the stream handle change it only through its methods. Keeping it apart from `Agent`
lets one agent serve any number of concurrent runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from .history import History
from .messages import ContentBlock
from .pricing import add_costs
from .providers.base import ModelResponse
from .result import RunResult, StopReason, ToolCallRecord, Usage
from .tools import ToolCall, ToolDefinition, ToolResult
from .tracing import Tracing

__all__ = ("CANCELLED_MESSAGE", "RunState")

CANCELLED_MESSAGE = "Cancelled: the run was stopped before this call finished."


class RunState:
    """One run's state. Its history changes only through `History`'s methods."""

    def __init__(
        self,
        history: History,
        *,
        deps: Any,
        tool_concurrency: int,
        log: Any,
        tracing: Tracing | None = None,
        external: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        external_names: frozenset[str] = frozenset(),
        price: Callable[[Usage], float | None] | None = None,
    ) -> None:
        """Start a run over `history`; `log` gets the run's id bound.

        `tracing` opens the run's spans (None: no spans); `external` are the definitions
        of external tools announced with each request, `external_names` their names;
        `price` gives one response's cost in US dollars (None: unknown).
        """
        self.id = uuid.uuid4().hex
        self.history = history
        self.deps = deps
        self.tracing = tracing
        self.external = tuple(external)
        self.external_names = external_names
        self.usage = Usage()
        self.price = price
        self.cost: float | None = price(Usage()) if price is not None else None
        """The run's cost so far in US dollars (each response priced as it came), or None
        when the price is unknown."""
        self.rounds = 0
        self.calls: list[ToolCallRecord] = []
        self.container: str | None = None
        self.limiter = anyio.CapacityLimiter(tool_concurrency)
        self.log = log.bind(run_id=self.id)
        self.stopping = False
        """Whether the run stops after the turn under way (see `stop_after_turn`)."""
        self.final: RunResult | None = None
        """The result of a run that finished."""
        self.partial: RunResult | None = None
        """The result of a run that ended early (failed or cancelled)."""
        self.pending: list[dict[str, Any]] = []
        """Calls of external tools handed back to the caller (wire `tool_use` blocks)."""
        self.held: list[dict[str, Any]] = []
        """The run's own results of the turn that handed calls back (wire blocks)."""

    @property
    def outcome(self) -> RunResult | None:
        """The final result, the partial one if the run ended early, or None while it runs."""
        return self.final or self.partial

    def start_round(self) -> int:
        """Count a new model request; return its number (from 1)."""
        self.rounds += 1
        return self.rounds

    def stop_after_turn(self) -> None:
        """Let the turn under way finish, then stop before the next model request."""
        self.stopping = True

    def add_response(
        self, response: ModelResponse, errors: dict[str, str] | None = None
    ) -> list[ToolCall]:
        """Count the response's usage and add it to the history; return its calls."""
        self.usage += response.usage
        if self.price is not None:
            self.cost = add_costs(self.cost, self.price(response.usage))
        if response.container and response.container.get("id"):
            self.container = str(response.container["id"])
        return self.history.add_response(response, errors)

    def add_results(self, pairs: Sequence[tuple[ToolCall, ToolResult]]) -> None:
        """Answer a turn's calls in the history and log them."""
        self.history.answer([result for _, result in pairs])
        self.log_calls(pairs)

    def close_turn(
        self,
        why: str,
        partial: list[ContentBlock] | None,
        results: Mapping[str, ToolResult],
    ) -> None:
        """End a turn cut short: see `History.close`; the calls answered are logged."""
        self.log_calls(self.history.close(why, partial=partial, results=results))

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

    def finish(self, stop_reason: StopReason) -> RunResult:
        """The run is over: its final result."""
        self.final = self.result(stop_reason)
        return self.final

    def end_early(self, stop_reason: StopReason) -> RunResult:
        """The run failed or was cancelled: its partial result (the turn closed already)."""
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
            cost=self.cost,
        )
