"""Sub-agents: an agent run as a tool of another, its spending counted in the parent's.

`Agent.as_tool` wraps an agent in a `Tool` whose call starts a run of the agent on the
model's prompt. The sub-run takes the parent's `RunContext.deps`, is bounded by what is
left of the parent's `UsageLimits` (as well as its own), adds its usage, cost and tool
calls to the parent run's (`RunContext.add_usage`), opens its spans under the tool call's
span, and is cancelled with the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .context import RunContext
from .errors import AgentloopError, ConfigurationError, ToolError
from .limits import UsageLimits, tighter
from .run import Run
from .tools import Tool

__all__ = ("StartRun", "agent_tool")

StartRun = Callable[..., Run[Any]]
"""`Agent.start` of the sub-agent."""


def agent_tool(
    start: StartRun,
    *,
    name: str,
    description: str | None = None,
    timeout: float | None = None,
    limits: UsageLimits | None = None,
) -> Tool:
    """A tool whose call runs a sub-agent, through its `start`.

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
        breach = ctx.limit_reached()
        if breach is not None:
            raise ToolError(
                f"Not run: the run's usage limit ({breach.limit} = {breach.bound:g}) was reached."
            )
        run = start(prompt, deps=ctx.deps, usage_limits=tighter(limits, ctx.limits_left()))
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
                result = run.result
                ctx.add_usage(result.usage, result.cost, tool_calls=run.calls_run)
        return run.result.text or f"(the {name} agent answered without text)"

    return Tool(run_agent, name=name, description=description, timeout=timeout)
