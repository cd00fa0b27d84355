"""Dynamic tools: what each turn announces of a run's tools, and which calls a cap refuses.

Before each model request the run asks every tool with a `prepare` function for the
definition to announce this turn (or none), and leaves out a tool whose `max_uses` the run
has used up; the run's capabilities' `prepare_tools` come after. When a response arrives,
`over_max_uses` says which of its calls go past a tool's cap. Uses are counted from the
run's call log, so a resumed or recovered run counts the calls it made before.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .calls import ToolDefinition
from .context import RunContext
from .errors import ConfigurationError
from .messages import ToolUseBlock
from .registry import ToolRegistry
from .result import ToolCallRecord
from .tools import Tool

__all__ = ("announced", "is_dynamic", "may_start", "over_max_uses", "used_up", "uses_of")


def is_dynamic(registry: ToolRegistry) -> bool:
    """Whether a tool of `registry` may be announced differently from turn to turn."""
    return any(t.prepare is not None or t.max_uses is not None for t in registry)


def uses_of(calls: Sequence[ToolCallRecord]) -> Counter[str]:
    """How many calls of each tool ran, by name, in a run's call log."""
    return Counter(r.name for r in calls if r.ran)


async def announced(
    registry: ToolRegistry, ctx: RunContext[Any], uses: Mapping[str, int]
) -> list[ToolDefinition]:
    """The definitions of `registry`'s tools to announce in the turn of `ctx`, in order.

    `uses` are the run's calls that ran, by tool name (`uses_of`).

    Raises:
        ConfigurationError: a `prepare` returned something other than a definition of
            its tool or None.
    """
    definitions = []
    for tool in registry:
        if tool.max_uses is not None and uses.get(tool.name, 0) >= tool.max_uses:
            continue
        definition: ToolDefinition | None = tool.definition
        if tool.prepare is not None:
            definition = await _prepared(tool, ctx)
        if definition is not None:
            definitions.append(definition)
    return definitions


async def _prepared(tool: Tool, ctx: RunContext[Any]) -> ToolDefinition | None:
    """What `tool.prepare` makes of the tool's own definition this turn."""
    assert tool.prepare is not None
    made = tool.prepare(ctx, tool.definition)
    if inspect.isawaitable(made):
        made = await made
    if made is None:
        return None
    if not isinstance(made, ToolDefinition):
        raise ConfigurationError(
            f"tool {tool.name!r}: prepare returned {type(made).__name__}, not a "
            "ToolDefinition or None (change the definition with dataclasses.replace)"
        )
    if made.name != tool.name:
        raise ConfigurationError(
            f"tool {tool.name!r}: prepare returned a definition named {made.name!r}; a "
            "tool keeps its name (calls find it by name): change it with Tool.replace"
        )
    return made


def over_max_uses(
    registry: ToolRegistry,
    uses: Sequence[ToolUseBlock],
    ran: Mapping[str, int],
    refused: Collection[str],
    started: Collection[str],
) -> dict[str, str]:
    """The calls of a turn's `uses` that go past their tool's `max_uses`, with the reason.

    `ran` are the run's earlier calls that ran, by tool name; `refused` the ids of calls
    answered without running for another reason (they use nothing); `started` those
    running already (they count, and are never refused). The others count in `tool_use`
    order: the first ones within the cap run, the rest are refused. A call of a tool that
    was used up before the turn is refused whatever else is said of it.
    """
    left: dict[str, int] = {}
    errors: dict[str, str] = {}
    for use in uses:
        tool = registry.get(use.name)
        if tool is None or tool.max_uses is None or use.id in started:
            continue
        if use.name not in left:
            running = sum(1 for u in uses if u.name == use.name and u.id in started)
            left[use.name] = tool.max_uses - ran.get(use.name, 0) - running
        if ran.get(use.name, 0) >= tool.max_uses or (left[use.name] <= 0 and use.id not in refused):
            errors[use.id] = used_up(tool)
        elif use.id not in refused:
            left[use.name] -= 1
    return errors


def may_start(
    registry: ToolRegistry,
    name: str,
    ran: Mapping[str, int],
    running: int,
) -> bool:
    """Whether another call of tool `name` may start while its turn streams in.

    `running` are the turn's calls of it started already. Calls start in `tool_use` order,
    so this agrees with `over_max_uses` once the whole response is in.
    """
    tool = registry.get(name)
    return tool is None or tool.max_uses is None or ran.get(name, 0) + running < tool.max_uses


def used_up(tool: Tool) -> str:
    """What the model is told of a call past `tool`'s `max_uses`."""
    times = "once" if tool.max_uses == 1 else f"{tool.max_uses} times"
    return (
        f"Not run: the tool '{tool.name}' may be called {times} per run, and this run has "
        "used it up; it is no longer available. Go on without it."
    )
