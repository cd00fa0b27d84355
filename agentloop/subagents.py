"""Sub-agents: an agent run as a tool of another, its spending counted in the parent's.

`Agent.as_tool` wraps an agent in a `Tool` whose call runs the agent on the model's
prompt. The sub-run takes the parent's `RunContext.deps`, is bounded by what is left of
the parent's `UsageLimits` (as well as its own), adds its usage, cost and tool calls to the
parent run's, opens its spans under the tool call's span, and is cancelled with the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .errors import AgentloopError, ConfigurationError, ToolError
from .limits import UsageLimits, tighter
from .result import RunResult
from .run import RunState
from .scope import current_scope
from .tools import RunContext, Tool

__all__ = ("StartRun", "agent_tool")

StartRun = Callable[[str, Any, "UsageLimits | None"], RunState]
"""Makes the sub-run's state from the prompt, the deps and the limits it runs under."""


def agent_tool(
    start: StartRun,
    drive: Callable[[RunState], Awaitable[RunResult]],
    *,
    name: str,
    description: str | None = None,
    timeout: float | None = None,
    limits: UsageLimits | None = None,
) -> Tool:
    """A tool whose call starts a run with `start` and drives it with `drive`.

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

    async def run_agent(ctx: RunContext[Any], prompt: str) -> str:
        """Run the sub-agent.

        Args:
            ctx: The calling run's context.
            prompt: The whole task for the sub-agent, with everything it needs to know.
        """
        scope = current_scope.get()
        bounds = limits
        if scope is not None:
            parent = scope.run
            breach = parent.meter.before_request(parent.usage)
            if breach is not None:
                raise ToolError(
                    f"Not run: the run's usage limit ({breach.limit} = {breach.bound:g}) "
                    "was reached."
                )
            bounds = tighter(limits, parent.meter.remaining(parent.usage))
        try:
            run = start(prompt, ctx.deps, bounds)
        except AgentloopError as exc:  # e.g. a cost limit over a model without a price
            raise ToolError(f"The {name} agent could not start: {exc}") from exc
        try:
            result = await drive(run)
        except AgentloopError as exc:
            raise ToolError(f"The {name} agent stopped: {exc}") from exc
        finally:
            if scope is not None:
                scope.run.add_usage(run.usage, run.cost, run.meter.tool_calls)
        return result.text or f"(the {name} agent answered without text)"

    return Tool(run_agent, name=name, description=description, timeout=timeout)
