"""`@tool` keeps the function's signature: a direct call is checked and returns its type.

Type-checked by `.ci/run` (`mypy --strict tests/typing`), never run. The calls mypy must
refuse are in tests/project/test_typing.py, which runs mypy on them.
"""

from dataclasses import dataclass

from typing_extensions import assert_type

from agentloop import RunContext, Tool, tool


@dataclass
class Shop:
    owner: str


@tool
def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b


@tool(timeout=5.0, eager=False)
async def fetch(url: str, ctx: RunContext[Shop]) -> str:
    """Fetch a page for the shop's owner."""
    return f"{ctx.deps.owner}: {url}"


class Counter:
    """A tool made of a bound method."""

    def __init__(self) -> None:
        self.count = 0

    def bump(self, by: int) -> int:
        """Bump the counter."""
        self.count += by
        return self.count


bump = tool(Counter().bump, name="bump")


async def main() -> str:
    assert_type(add(1, 2), int)
    assert_type(add(1), int)
    assert_type(bump(2), int)
    page = await fetch("https://example.com", RunContext("run", 1, deps=Shop("Ada")))
    return assert_type(page, str)


# Decorated tools are still `Tool`s: they go in lists of tools and keep their options.
tools: list[Tool] = [add, fetch, bump, add.replace(name="plus")]
slow: Tool = fetch.replace(timeout=10.0)
