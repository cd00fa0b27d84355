"""Sub-agents: an agent run as a tool of another, its spending counted in the parent's.

`Agent.as_tool` wraps an agent in an `AgentTool` whose call starts a run of the agent on
the model's prompt. The sub-run takes the parent's `RunContext.deps`, is bounded by what
is left of the parent's `UsageLimits` (as well as its own), adds its usage, cost and tool
calls to the parent run's (`RunContext.add_usage`), opens its spans under the tool call's
span, and is cancelled with the call.

Its id is the call's idempotency key, so a call run again (a durable run recovered after
a crash) gives the sub-run's own calls the same keys. A sub-run that pauses (calls waiting
for approval or for the caller) pauses the parent with it (`CallPaused`); when the parent
resumes, the call runs again and resumes the sub-run with its answers, which it finds in
the call's context (`RunContext.answers`, see `agentloop.resume`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .calls import CallPaused, ToolDefinition
from .context import RunContext
from .errors import AgentloopError, ConfigurationError, ToolError
from .limits import Spent, UsageLimits, tighter
from .registry import AgentTool, ToolRegistry
from .run import Run
from .state import PausedRun

__all__ = ("StartRun", "agent_tool")

StartRun = Callable[..., Run[Any]]
"""`Agent.start` of the sub-agent."""


def agent_tool(
    start: StartRun,
    *,
    sub_tools: ToolRegistry,
    name: str,
    description: str | None = None,
    timeout: float | None = None,
    limits: UsageLimits | None = None,
    external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
) -> AgentTool:
    """A tool whose call starts a run of a sub-agent with `start`, or resumes one.

    `sub_tools`, `limits` and `external_tools` are the sub-agent's own; see
    `Agent.as_tool`, which builds this from an agent (this module knows no `Agent`: it
    sits below it).
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
        breach = ctx.limit_reached()
        if breach is not None:
            raise ToolError(
                f"Not run: the run's usage limit ({breach.limit} = {breach.bound:g}) was reached."
            )
        paused = ctx.answers.get(ctx.tool_use_id)
        if isinstance(paused, PausedRun):  # the calling run resumes: so does the sub-run
            before = Spent(paused.usage, paused.cost, paused.counted_calls)
            # The calling run's totals hold what the sub-run spent before it paused,
            # which the sub-run counts again itself.
            bounds = tighter(limits, ctx.limits_left(back=before))
            run = start(state=paused, deps=ctx.deps, usage_limits=bounds)
        else:
            before = Spent()
            bounds = tighter(limits, ctx.limits_left())
            run = start(
                prompt,
                deps=ctx.deps,
                usage_limits=bounds,
                external_tools=external_tools,
                run_id=ctx.idempotency_key,
            )
        started = False
        try:
            async with run:
                started = True
        except ConfigurationError as exc:  # e.g. a cost limit over a model without a price
            raise ToolError(f"The {name} agent could not start: {exc}") from exc
        except AgentloopError as exc:
            raise ToolError(f"The {name} agent stopped: {exc}") from exc
        finally:
            if started:
                added = run.spent - before
                ctx.add_usage(added.usage, added.cost, tool_calls=added.tool_calls)
        result = run.result
        if result.state is None:
            return result.text or f"(the {name} agent answered without text)"
        if ctx.apart or ctx.meter is None:
            # Run outside its calling run (in a durable engine's worker, or by hand):
            # nothing can carry the paused sub-run back to the run, nor bring it its
            # answers.
            waits = ", ".join(
                [f"'{a.name}' (approval)" for a in result.approvals]
                + [f"'{p['name']}' (external)" for p in result.pending]
            )
            raise ToolError(
                f"The {name} agent stopped: its calls {waits} wait for the caller, which "
                "this call cannot hand back (it runs apart from the calling run)."
            )
        return CallPaused(result.state)

    made = AgentTool(run_agent, name=name, description=description, timeout=timeout)
    made.sub_tools = sub_tools
    return made
