"""The two places a run touches the world: a model request, and one tool call.

The loop (`Agent` -> `Turn` -> `CallGroup`) decides everything else from values: what to
send, which calls to run, what the history becomes. Its two effects go through an
`Effects`, whose default, `DIRECT`, simply performs them. A durable engine plugs in its
own, which records each effect's outcome as a step (or runs it as an activity) and gives
the recorded outcome back when a run is replayed after a crash: the loop, its rules and
its history stay the same code in both cases.

An `Effects` gets the value of each effect (the request; the call) with its round, and a
function performing it here and now. It returns the outcome, which must equal what that
function returned (or, on a replay, what it returned the first time).

A streamed run's model request also comes with the turn's handler of streamed events:
`DIRECT` streams to it, so the turn reports deltas and starts tool calls as their blocks
close. A durable engine streams elsewhere (to its own stream of the run's events, see
`agentloop.durable.streams`) or not at all: the turn then sees the response only when it
is whole, as it does on a replay, and starts every call after it, in `tool_use` order.

An `Effects` may also say what a run's tasks (its driver, and each turn's calls) run in,
with a `task_group()` method returning `CallTasks` (see `task_group_for`); without one (as
`DIRECT`), they run in an anyio task group. An engine whose event loop cannot take
anyio's cancel scopes needs this: on Temporal's workflow loop, a cancelled scope cancels
its tasks again on every pass of the loop, and a task awaiting an activity (which waits
for the server to confirm the cancellation) keeps the loop from ever going idle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

if TYPE_CHECKING:
    from .calls import ToolCall, ToolResult
    from .providers.base import ModelRequest, ModelResponse, StreamEvent

__all__ = ("DIRECT", "CallTasks", "DirectEffects", "Effects", "OnEvent", "Send", "task_group_for")

OnEvent = Callable[["StreamEvent"], Awaitable[None]]
"""A handler of the events of a streamed model response."""

Send = Callable[["OnEvent | None"], Awaitable["ModelResponse"]]
"""`send(on_event)` sends a model request; it streams the response to `on_event` when one
is given and the provider can stream, and returns the whole response."""


class Effects(Protocol):
    """Where a run's model requests and tool calls are performed (see the module)."""

    async def model(
        self,
        request: ModelRequest,
        round_: int,
        send: Send,
        stream: OnEvent | None,
    ) -> ModelResponse:
        """The response to `request`, the request of round `round_`; `send` sends it.

        `stream` is the turn's handler of streamed events when the run streams, else
        None: `send(stream)` is the plain way (see the module for the other).
        """
        ...

    async def tool(
        self,
        call: ToolCall,
        round_: int,
        run: Callable[[], Awaitable[ToolResult]],
    ) -> ToolResult:
        """The result of `call`, a call of round `round_`; `run()` runs it.

        `run()` never raises for the tool's failure (see `ToolRegistry.run_call`): the
        result says it. The calls of one turn are started in `tool_use` order, each in
        a task of its own, and an implementation reaches its first await in that order.
        """
        ...


class CallTasks(Protocol):
    """The tasks of one turn's calls, as `CallGroup` uses them (an `Effects`' `task_group()`).

    Entered, it runs each `start_soon` function in a task of its own; `cancel()` cancels
    every task once; leaving waits for all of them and raises the first failure of a task
    (other than its cancellation), unless the block itself raised.
    """

    def start_soon(self, function: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `function(*args)` in a new task."""
        ...

    def cancel(self) -> None:
        """Cancel every task started."""
        ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc_info: Any) -> bool | None: ...


class DirectEffects:
    """Performs each effect as it comes, with nothing recorded: a plain run."""

    async def model(
        self,
        request: ModelRequest,
        round_: int,
        send: Send,
        stream: OnEvent | None,
    ) -> ModelResponse:
        """`await send(stream)`."""
        return await send(stream)

    async def tool(
        self,
        call: ToolCall,
        round_: int,
        run: Callable[[], Awaitable[ToolResult]],
    ) -> ToolResult:
        """`await run()`."""
        return await run()


DIRECT: Effects = DirectEffects()
"""The effects of every run that has no engine of its own."""


def task_group_for(effects: Effects) -> anyio.abc.TaskGroup | CallTasks:
    """What a run with `effects` runs its tasks in: the effects' own, or an anyio task group."""
    tasks: Callable[[], CallTasks] | None = getattr(effects, "task_group", None)
    return anyio.create_task_group() if tasks is None else tasks()
