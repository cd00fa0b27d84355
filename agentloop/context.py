"""The context a run hands to everything that works on its behalf.

A run builds one frozen `RunContext` per turn, by keyword; each tool call gets a copy
naming the call (`for_call`, a `dataclasses.replace`). Tools, approval rules, output
validators and history processors read it; the registry takes its caps, timeout and
effects from it; and code that spends on the run's behalf (a sub-agent, a summary
request, an MCP server's sampling) counts it with `add_usage`, explicitly.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic

import anyio
from typing_extensions import TypeVar

from .effects import DIRECT, Effects
from .limits import Meter
from .progress import emit_event
from .result import Usage

if TYPE_CHECKING:
    from .calls import ToolCall
    from .events import Event
    from .limits import Breach, Spent, UsageLimits
    from .messages import ContentBlock
    from .providers.base import Provider
    from .tracing import Tracing

__all__ = ("DepsT", "RunContext", "counted_apart")

T = TypeVar("T")

# The default lets a plugin author write a bare `ctx: RunContext` under `mypy --strict`.
DepsT = TypeVar("DepsT", default=Any)


@dataclass(frozen=True)
class RunContext(Generic[DepsT]):
    """What a run tells the code working for it: ids, `deps`, and the run's meter.

    A parameter typed `RunContext` is injected into a tool (and hidden from the schema the
    model sees); approval rules, output validators and history processors may take one
    first. `RunContext[MyDeps]` types `deps`; a bare `RunContext` means `RunContext[Any]`.
    A context made by hand (in a tool's unit test: `RunContext("run", 1, deps=...)`) has
    no run behind it: `add_usage` counts nothing and no limit applies.
    """

    run_id: str
    """Id of the run (also bound in every log event of the run)."""
    round: int
    """Which model request of the run this is about, from 1."""
    tool_use_id: str = ""
    """Id of the `tool_use` block being answered ("" outside a tool call)."""
    tool_name: str = ""
    """Name of the tool being called ("" outside a tool call)."""
    deps: DepsT = None  # type: ignore[assignment]  # None only where no deps were given
    """The object passed as `agent.run(..., deps=...)`: connections, config, the user."""
    _: KW_ONLY
    model: str = ""
    """The model the run's requests go to."""
    provider: Provider | None = field(default=None, repr=False)
    """Where the run's requests go (for code asking the model on the run's behalf)."""
    meter: Meter | None = field(default=None, repr=False)
    """The run's spending and limits (see `add_usage`); None outside a run."""
    limiter: anyio.CapacityLimiter | None = field(default=None, repr=False)
    """Caps the run's tool calls in flight at once (the agent's `tool_concurrency`)."""
    timeout: float = math.inf
    """Default seconds per call (`math.inf`: none); a tool's own `timeout` wins."""
    shared_limiter: anyio.CapacityLimiter | None = field(default=None, repr=False)
    """An optional second cap shared by every run of a process (`tool_limiter`)."""
    thread_limiter: anyio.CapacityLimiter | None = field(default=None, repr=False)
    """Worker threads for sync tools; `registry.thread_limiter()` when None."""
    log: Any = field(default=None, repr=False)
    """The logger of the run's events (`run_id` and `round` bound); a default if None."""
    tracing: Tracing | None = field(default=None, repr=False)
    """The run's spans; each call gets an `execute_tool` span when set."""
    effects: Effects = field(default=DIRECT, repr=False)
    """Where each call is performed (see `agentloop.effects`); `DIRECT` runs it here."""
    prompt: str | Sequence[ContentBlock] | None = field(default=None, repr=False)
    """The run's new user input: what `run(prompt)` was given, or for a run given a
    history and no prompt (as the gateway's and durable runs are), the content of the
    history's last message if it is the user's, its tool results left out. None when
    there is none (the history ends with the model's message, or tool results only) and
    when the run resumes."""
    answers: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """In a resumed turn, the caller's answers to the calls the run waited for, by
    tool_use id: a sub-agent's call finds there the sub-run it resumes (`PausedRun`)."""
    apart: bool = field(default=False, repr=False)
    """True where the call runs apart from its run (a Temporal activity, on a worker):
    nothing there can carry a paused sub-run back to the run."""
    events: Callable[[Event], Awaitable[None]] | None = field(default=None, repr=False)
    """Where `emit` sends events: the run's stream and its `on_event`; None in a context
    made by hand, and in a run whose calls an engine performs (a durable run, where the
    step running the call publishes them)."""

    @property
    def idempotency_key(self) -> str:
        """`"{run_id}:{tool_use_id}"`: the same every time this call is run again.

        A run that is retried or resumed (a durable run after a crash, a paused run)
        may run a call whose effect already happened. A tool that changes the world
        records this key with its effect and skips an effect already recorded under it,
        so the call's effect happens once.
        """
        return f"{self.run_id}:{self.tool_use_id}"

    def for_call(self, call: ToolCall) -> RunContext[DepsT]:
        """This context, naming `call` (what the call's tool and approval rule get)."""
        return replace(self, tool_use_id=call.id, tool_name=call.name)

    async def emit(self, event: Event) -> None:
        """Report `event` to the run: its stream (`async for event in run`) and `on_event`.

        For what code working for the run has to tell the user beside its result: a
        tool's content for the user only (`ToolUserContent`), a log message of the
        service it calls (`ToolLog`). Await it on the run's event loop. In a context
        without `events` (made by hand, or in a durable run), the event goes where this
        task's events go, if anywhere (`agentloop.progress.emit_event`): a durable run's
        step publishes it with the call.

        Args:
            event: The event, naming this call (`round`, `tool_use_id`, `tool_name`).
        """
        if self.events is not None:
            await self.events(event)
        else:
            await emit_event(event)

    @property
    def usage(self) -> Usage:
        """The tokens the run has used so far (sub-runs and summaries included)."""
        return self.meter.usage if self.meter is not None else Usage()

    def add_usage(self, usage: Usage, cost: float | None = None, *, tool_calls: int = 0) -> None:
        """Count requests made on the run's behalf (a sub-run, a summary) in its usage.

        Args:
            usage: The tokens they used, with their number of `requests`.
            cost: What they cost in US dollars; None when unknown (the run's cost then
                becomes unknown too).
            tool_calls: Tool calls they ran (a sub-run's), counted against the run's
                `UsageLimits.tool_calls`.
        """
        if self.meter is not None:
            self.meter.add_usage(usage, cost, tool_calls)

    def limits_left(self, back: Spent | None = None) -> UsageLimits | None:
        """What is left of the run's `UsageLimits` (None: the run has none).

        `back` is a part of the run's spending to leave out (what a resumed sub-run spent
        before it paused, which it counts again itself).
        """
        return self.meter.remaining(back) if self.meter is not None else None

    def limit_reached(self) -> Breach | None:
        """The limit the run's next model request would certainly go over, or None.

        Check it before making a request on the run's behalf (as a sub-agent or a
        summary does): a request past the limit must not be sent.
        """
        return self.meter.before_request() if self.meter is not None else None


async def counted_apart(
    ctx: RunContext[Any],
    effect: Callable[[RunContext[Any]], Awaitable[T]],
    *,
    call: ToolCall | None = None,
) -> tuple[T, Spent]:
    """Run one effect (a model request, a call) counting what it spends apart.

    A durable run records an effect's outcome and, recovering, replays the record
    without running the effect again; a Temporal activity runs it in another process.
    So what a capability's own request or a sub-run spends inside the effect must ride
    on its outcome (`ModelResponse.extra_usage`, `ToolResult.spent`) for the run to count
    it once, live or replayed. `effect` gets `ctx` counting on a copy of the run's meter
    (limits still see the run's totals as they were when it began, plus its own
    spending; a context with no meter gets one), and what the copy counted is returned
    with the outcome. An effect that raises leaves no outcome to carry it: what it spent
    is counted on `ctx` at once. Given a `call`, the context `effect` gets also names it
    (as `ctx.for_call(call)` would: one copy of the context per call, not two).
    """
    meter = copy.copy(ctx.meter) if ctx.meter is not None else Meter(None, ctx.model)
    at_start = meter.spent
    if call is None:
        counting = replace(ctx, meter=meter)
    else:
        counting = replace(ctx, meter=meter, tool_use_id=call.id, tool_name=call.name)
    try:
        outcome = await effect(counting)
    except BaseException:
        spent = meter.spent - at_start
        ctx.add_usage(spent.usage, spent.cost, tool_calls=spent.tool_calls)
        raise
    return outcome, meter.spent - at_start
