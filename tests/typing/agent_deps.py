"""An agent's `deps_type` types the `deps` its runs take, and its tools' `RunContext`.

Type-checked by `.ci/run` (`mypy --strict tests/typing`), never run. The mistakes mypy
must refuse (`run(deps=123)`, ...) are in tests/project/test_typing.py, which runs mypy.
"""

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from typing_extensions import assert_type

from agentloop import Agent, RunContext, RunResult, tool


@dataclass
class Shop:
    owner: str


class Forecast(BaseModel):
    city: str


@tool
def owner(ctx: RunContext[Shop]) -> str:
    """The shop's owner."""
    return ctx.deps.owner


agent = Agent(deps_type=Shop, tools=[owner])
assert_type(agent, Agent[Shop, str])
forecaster = Agent(deps_type=Shop, output_type=Forecast)
assert_type(forecaster, Agent[Shop, Forecast])
untyped = Agent()
assert_type(untyped, Agent[Any, str])  # no deps_type: deps is Any


async def main() -> RunResult[str]:
    forecast = await forecaster.run("Weather?", deps=Shop("Ada"))
    assert_type(forecast.output, Forecast)
    await untyped.run("anything goes", deps=123)
    async with agent.start("hi", deps=Shop("Ada")) as run:
        pass
    assert_type(run.result.output, str)
    return await agent.run("Who owns the shop?", deps=Shop("Ada"))


def sync() -> str:
    return agent.run_sync("hi", deps=Shop("Ada")).output
