"""An agent's `deps_type`: a run given `deps` of another class is refused before it starts.

The static side (mypy refusing `run(deps=123)`) is in tests/typing and
tests/project/test_typing.py; this is the run-time side, through the SDK to
`MessagesServer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from agentloop import Agent, ConfigurationError, RunContext
from agentloop.testing import MessagesServer, reply, tool_call


@dataclass
class Shop:
    owner: str


@dataclass
class FlagshipShop(Shop):
    city: str = "Paris"


def owner(ctx: RunContext[Shop]) -> str:
    """The shop's owner."""
    return ctx.deps.owner


async def test_deps_of_the_agents_type_reach_the_tools() -> None:
    script = [reply(tool_call("owner", {})), reply("Ada owns it."), reply("Hello.")]
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(), deps_type=Shop, tools=[owner])
        result = await agent.run("Who owns the shop?", deps=FlagshipShop("Ada"))
        untyped = await Agent(client=server.client(), tools=[owner]).run("hi", deps=None)
    assert [c.output for c in result.tool_calls] == ["Ada"]
    assert agent.deps_type is Shop
    assert untyped.stop_reason == "end_turn"


@pytest.mark.parametrize("deps", [123, "shop", {"owner": "Ada"}], ids=["int", "str", "dict"])
async def test_deps_of_another_type_are_refused_before_anything_is_sent(deps: Any) -> None:
    async with MessagesServer(["unused"]) as server:
        agent = Agent(client=server.client(), deps_type=Shop, tools=[owner])
        with pytest.raises(
            ConfigurationError, match=r"deps must be a Shop \(the agent's deps_type\), not "
        ):
            await agent.run("hi", deps=deps)
        with pytest.raises(ConfigurationError, match="deps must be a Shop"):
            agent.start("hi", deps=deps)
        with pytest.raises(ConfigurationError, match="deps must be a Shop"):
            await agent.resume({}, deps=deps)
    assert server.requests == []


class HasOwner(Protocol):
    owner: str


async def test_a_type_isinstance_cannot_check_is_left_to_the_type_checker() -> None:
    script = [reply(tool_call("owner", {})), reply("Ada owns it.")]
    async with MessagesServer(script) as server:
        agent: Agent[Any, str] = Agent(client=server.client(), deps_type=HasOwner, tools=[owner])
        result = await agent.run("Who owns the shop?", deps=Shop("Ada"))
    assert [c.output for c in result.tool_calls] == ["Ada"]
