"""Where the front-end endpoints keep a paused run until the page decides.

A run that stops with calls waiting for approval (or for the front end's own tools)
ends its stream; the page answers on its next request, naming its thread (AG-UI's
`threadId`, `useChat`'s chat `id`). The paused run's state stays on the server, so the
page can only decide, never rewrite what the run holds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from agentloop.result import RunResult

__all__ = ("PausedRun", "PausedRuns")


@dataclass(frozen=True)
class PausedRun:
    """A run of a thread that stopped with calls waiting."""

    state: dict[str, Any]
    """`RunResult.state`, for `Agent.start(state=...)`."""
    approvals: tuple[str, ...]
    """The ids of the calls waiting for a decision."""
    external: tuple[str, ...]
    """The ids of the calls of the front end's tools, waiting for their results."""

    @classmethod
    def of(cls, result: RunResult[Any]) -> PausedRun | None:
        """The paused run `result` stands for; None when no call waits."""
        if result.state is None:
            return None
        return cls(
            result.state,
            tuple(a.tool_use_id for a in result.approvals),
            tuple(str(call["id"]) for call in result.pending),
        )


class PausedRuns:
    """Paused runs by thread, in memory, the oldest dropped past `limit`.

    One process's memory: a service with several replicas routes a thread to one of them
    (or passes a store of its own with the same two methods).
    """

    def __init__(self, *, limit: int = 1000) -> None:
        """A store holding at most `limit` paused runs."""
        self.limit = limit
        """How many paused runs are kept; the oldest goes first."""
        self._runs: OrderedDict[str, PausedRun] = OrderedDict()

    def keep(self, thread: str, paused: PausedRun) -> None:
        """Keep the paused run of `thread`, replacing any."""
        self._runs.pop(thread, None)
        self._runs[thread] = paused
        while len(self._runs) > self.limit:
            self._runs.popitem(last=False)

    def take(self, thread: str) -> PausedRun | None:
        """The paused run of `thread`, removed from the store; None when there is none."""
        return self._runs.pop(thread, None)
