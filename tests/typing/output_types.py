"""What a run's `output` is to a type checker: the `output_type` given, else `str`.

Type-checked by `.ci/run` (`mypy --strict tests/typing`), never run.
"""

from pydantic import BaseModel
from typing_extensions import assert_type

from agentloop import Agent


class Forecast(BaseModel):
    city: str
    temp_c: float


agent = Agent(output_type=Forecast)


async def main() -> float:
    result = await agent.run("Weather in Paris?")
    assert_type(result.output, Forecast)
    number = await agent.run("a number", output_type=int)
    assert_type(number.output, int)
    total: int = number.output + 1
    return result.output.temp_c + total


def text() -> str:
    return assert_type(Agent().run_sync("hi").output, str)
