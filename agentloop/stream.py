"""`RunStream`: the handle a streamed run gives its caller.

It is an async iterator of `agentloop.events` values, it can cancel the run now or after
the current turn, and it holds the run's result afterwards: the partial one if the run was
cancelled, by `cancel()` or by any cancel scope around it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from agentloop.events import Event, RunFinished
from agentloop.progress import events_to
from agentloop.result import OutputT, RunResult
from agentloop.run import RunState

__all__ = ("RunStream",)


class RunStream(Generic[OutputT]):
    """Events of a run as they happen, and a way to stop it.

    Iterate it for events; after the last one (`RunFinished`), `result` holds the run's
    `RunResult`. If the run failed, iterating raises the failure after the events that
    came before it.
    """

    def __init__(self, run: RunState, receive: MemoryObjectReceiveStream[Event]) -> None:
        self._run = run
        self._receive = receive
        self._scope = anyio.CancelScope()
        self._error: BaseException | None = None
        self._result: RunResult[Any] | None = None

    @property
    def run_id(self) -> str:
        """Id of the run (bound in its log events too)."""
        return self._run.id

    @property
    def result(self) -> RunResult[OutputT] | None:
        """The final result, the partial one after a cancellation, or None while running."""
        return self._result

    def cancel(self, *, after_turn: bool = False) -> None:
        """Stop the run.

        Args:
            after_turn: Let the current turn's tool calls finish and stop before the next
                model request, instead of stopping everything now.
        """
        if after_turn:
            self._run.stop_after_turn()
        else:
            self._scope.cancel()

    def __aiter__(self) -> RunStream[OutputT]:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None

    async def _drive(
        self,
        drive: Callable[[Callable[[Event], Awaitable[None]]], Awaitable[RunResult[Any]]],
        send: MemoryObjectSendStream[Event],
    ) -> None:
        """Run the loop, feeding `send`; never lets the run's failure escape the task group."""

        async def emit(event: Event) -> None:
            # The buffer is unbounded: sending never waits, so it is never where a
            # cancellation lands, and no event the run produced is lost.
            send.send_nowait(event)

        with send:
            try:
                with self._scope, events_to(send.send_nowait):
                    try:
                        self._result = await drive(emit)
                    except Exception as exc:
                        self._error = exc
                        self._result = getattr(exc, "result", None)
            finally:
                if self._result is None and self._error is None:
                    # Cancelled (here or by a scope around the run): after the final
                    # result was made, or with a partial one.
                    self._result = self._run.outcome
                    if self._run.final is None and self._result is not None:
                        send.send_nowait(RunFinished(self._result))

    def __repr__(self) -> str:
        return f"RunStream(run_id={self.run_id!r}, done={self._result is not None})"
