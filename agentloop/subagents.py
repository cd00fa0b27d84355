"""Sub-agents: an agent run as a tool of another, its spending counted in the parent's.

`Agent.as_tool` wraps an agent in an `AgentTool` whose call runs the agent on the model's
prompt. The sub-run takes the parent's `RunContext.deps`, is bounded by what is left of
the parent's `UsageLimits` (as well as its own), adds its usage, cost and tool calls to the
parent run's, opens its spans under the tool call's span, and is cancelled with the call.

Its id is the call's idempotency key, so a call run again (a durable run recovered after
a crash) gives the sub-run's own calls the same keys. A sub-run that pauses (calls waiting
for approval or for the caller) pauses the parent with it (`CallPaused`); when the parent
resumes, the call runs again and resumes the sub-run with its answers (`agentloop.resume`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .errors import AgentloopError, ConfigurationError, ToolError
from .limits import UsageLimits, tighter
from .registry import ToolRegistry
from .result import RunResult, Usage
from .run import RunState
from .scope import RunScope, current_scope
from .state import PausedRun, waiting_calls
from .tools import CallPaused, RunContext, Tool

__all__ = ("AgentTool", "RestartRun", "StartRun", "agent_tool")

StartRun = Callable[[str, Any, "UsageLimits | None", str], RunState]
"""Makes the sub-run's state from the prompt, the deps, the limits it runs under and its id."""

RestartRun = Callable[[PausedRun, Any, "UsageLimits | None"], RunState]
"""Makes the state of a paused sub-run to resume (answered) from the deps and the limits."""


class AgentTool(Tool):
    """A tool whose calls run an agent (`Agent.as_tool`)."""

    sub_tools: ToolRegistry
    """The sub-agent's tools: the calls a paused sub-run waits for are answered with them."""


@dataclass(frozen=True)
class _Spent:
    """What a sub-run had spent before this call drives it (a resumed run counts it again)."""

    usage: Usage
    cost: float | None
    tool_calls: int

    @classmethod
    def before(cls, paused: PausedRun | None) -> _Spent:
        if paused is None:
            return cls(Usage(), 0.0, 0)
        return cls(paused.usage, paused.cost, paused.counted_calls)

    def since(self, run: RunState) -> _Spent:
        """What `run` spent on top of this."""
        cost = None if run.cost is None or self.cost is None else run.cost - self.cost
        return _Spent(run.usage - self.usage, cost, run.meter.tool_calls - self.tool_calls)


def agent_tool(
    start: StartRun,
    restart: RestartRun,
    drive: Callable[[RunState], Awaitable[RunResult]],
    *,
    sub_tools: ToolRegistry,
    name: str,
    description: str | None = None,
    timeout: float | None = None,
    limits: UsageLimits | None = None,
) -> AgentTool:
    """A tool whose call starts a run with `start`, or resumes one, and drives it.

    `restart` makes the run a call resumes, `drive` drives either one. `sub_tools` and
    `limits` are the sub-agent's own; see `Agent.as_tool`, which builds this from an
    agent (this module knows no `Agent`: it sits below it).
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError("as_tool needs a name for the tool")
    if description is None:
        description = (
            f"Ask the {name} agent to do a task. Describe the task completely in `prompt`: "
            "it sees nothing else of this conversation. Returns its final answer."
        )

    async def run_agent(ctx: RunContext[Any], prompt: str) -> str | CallPaused:
        """Run the sub-agent.

        Args:
            ctx: The calling run's context.
            prompt: The whole task for the sub-agent, with everything it needs to know.
        """
        scope = current_scope.get()
        paused = _answered_sub_run(scope, ctx.tool_use_id)
        spent = _Spent.before(paused)
        bounds = limits
        if scope is not None:
            parent = scope.run
            breach = parent.meter.before_request(parent.usage)
            if breach is not None:
                raise ToolError(
                    f"Not run: the run's usage limit ({breach.limit} = {breach.bound:g}) "
                    "was reached."
                )
            # The parent's totals hold what a resumed sub-run spent before it paused,
            # which the sub-run counts again itself.
            left = parent.meter.remaining(parent.usage, spent.usage, spent.cost, spent.tool_calls)
            bounds = tighter(limits, left)
        try:
            if paused is None:
                run = start(prompt, ctx.deps, bounds, ctx.idempotency_key)
            else:
                run = restart(paused, ctx.deps, bounds)
        except AgentloopError as exc:  # e.g. a cost limit over a model without a price
            raise ToolError(f"The {name} agent could not start: {exc}") from exc
        try:
            result = await drive(run)
        except AgentloopError as exc:
            raise ToolError(f"The {name} agent stopped: {exc}") from exc
        finally:
            if scope is not None:
                added = spent.since(run)
                scope.run.add_usage(added.usage, added.cost, added.tool_calls)
        if result.state is None:
            return result.text or f"(the {name} agent answered without text)"
        if scope is None:
            # Run outside its calling run (in a durable engine's worker): nothing can
            # carry the paused sub-run back to the run, nor bring it its answers.
            waits = ", ".join(f"'{c.name}' ({c.kind})" for _, c in waiting_calls(run.waiting))
            raise ToolError(
                f"The {name} agent stopped: its calls {waits} wait for the caller, which "
                "this call cannot hand back (it runs apart from the calling run)."
            )
        return CallPaused(result.state)

    made = AgentTool(run_agent, name=name, description=description, timeout=timeout)
    made.sub_tools = sub_tools
    return made


def _answered_sub_run(scope: RunScope | None, tool_use_id: str) -> PausedRun | None:
    """The paused sub-run the call `tool_use_id` resumes, answered; None for a new call.

    The calling run keeps its paused turn's answers while it finishes that turn.
    """
    if scope is None or scope.run.paused is None:
        return None
    answer = scope.run.paused.answers.get(tool_use_id)
    return answer if isinstance(answer, PausedRun) else None
