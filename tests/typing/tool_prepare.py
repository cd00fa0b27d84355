"""A tool's `prepare` may be typed with the run's deps, sync or async; a wrong one is caught.

Type-checked by `.ci/run` (`mypy --strict tests/typing`), never run. An ignore below marks
an error mypy must report (`--strict` warns about an ignore that silences nothing).
"""

from dataclasses import dataclass

from agentloop import RunContext, ToolDefinition, tool


@dataclass
class Deps:
    admin: bool


def admins_only(ctx: RunContext[Deps], definition: ToolDefinition) -> ToolDefinition | None:
    return definition if ctx.deps.admin else None


async def from_round_two(ctx: RunContext[Deps], definition: ToolDefinition) -> ToolDefinition:
    return definition


def wire(ctx: RunContext[Deps], definition: ToolDefinition) -> dict[str, object]:
    return definition.to_wire()


@tool(prepare=admins_only, max_uses=2)
def wipe(table: str) -> str:
    """Wipe a table."""
    return table


@tool(prepare=from_round_two)
async def audit(entry: str) -> str:
    """Write an audit entry."""
    return entry


capped = wipe.replace(prepare=from_round_two, max_uses=1)
wrong = wipe.replace(prepare=wire)  # type: ignore[arg-type]
