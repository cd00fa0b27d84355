"""Typed output: streamed partial output stays linear; the tool mode saves a request.

    python -m benchmarks.output [--runs N]

O1 feeds an output's JSON to a streamed run's partial-output reader (`PartialOutputs`, the
path `Agent.run_stream` uses) in deltas of ~50 characters, at 25, 50, 100 and 200 kB, and
times it against re-parsing and validating the whole text so far on every delta (what a
reader without an incremental parser does). Time per kB that stays flat is linear.

O2 counts the model requests of one run that calls a tool and then gives a `Forecast`:
agentloop's tool mode (`output_type=Forecast, output_mode="tool"`) against the by-hand
pattern (a `final_result` tool of the agent's own, whose call the loop answers and sends
back, so the model needs one more request to end its turn). Both run against
`MessagesServer` through the real SDK. Writes `benchmarks/RESULTS-output.md`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import ijson  # type: ignore[import-untyped]
import pydantic
import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

from agentloop import Agent, tool
from agentloop.events import PartialOutput, TextDelta
from agentloop.output import OutputRun, output_schema
from agentloop.partial import PartialOutputs
from agentloop.registry import ToolRegistry
from agentloop.testing import MessagesServer, reply, tool_call

RESULTS = Path(__file__).with_name("RESULTS-output.md")
DELTA = 50
"""Characters per delta: 100 kB arrive in 2,000 deltas."""


class Report(BaseModel):
    title: str
    items: list[str]


class Forecast(BaseModel):
    city: str
    temp_c: float


def _text(kb: int) -> str:
    count = kb * 1000 // 44
    return json.dumps({"title": "report", "items": ["x" * 40] * count})


async def _incremental(text: str) -> int:
    events = 0

    async def emit(event: Any) -> None:
        nonlocal events
        events += isinstance(event, PartialOutput)

    output = OutputRun(
        output_schema(Report), "native", retries=0, validators=(), registry=ToolRegistry()
    )
    watch = PartialOutputs(output, emit, 1)
    for start in range(0, len(text), DELTA):
        await watch(TextDelta(1, 0, text[start : start + DELTA]))
    return events


def _from_the_start(text: str) -> int:
    adapter = TypeAdapter(Report)
    checks = 0
    for end in range(DELTA, len(text) + DELTA, DELTA):
        value = pydantic_core.from_json(text[:end], allow_partial=True)
        try:
            adapter.validate_python(value, experimental_allow_partial=True)
            checks += 1
        except ValidationError:
            pass
    return checks


def _timed(function: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def linearity(runs: int) -> list[str]:
    rows = []
    for kb in (25, 50, 100, 200):
        text = _text(kb)
        deltas = -(-len(text) // DELTA)
        ours = _timed(lambda text=text: anyio.run(_incremental, text), runs)
        naive = _timed(lambda text=text: _from_the_start(text), max(1, runs // 2))
        rows.append(
            f"| {len(text) / 1000:.0f} kB | {deltas} | {ours * 1000:.1f} | "
            f"{ours * 1e6 / len(text) * 1000:.1f} | {naive * 1000:.0f} | "
            f"{naive * 1e6 / len(text) * 1000:.1f} |"
        )
    return rows


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"{city}: 21 C"


@tool
def final_result(city: str, temp_c: float) -> str:
    """Give the final forecast."""
    return "ok"


async def _requests() -> tuple[int, int, Forecast, Forecast]:
    weather = reply(tool_call("get_weather", {"city": "Paris"}))
    final = reply(tool_call("final_result", {"city": "Paris", "temp_c": 21}))
    async with MessagesServer([weather, final]) as server:
        agent = Agent(
            client=server.client(), tools=[get_weather], output_type=Forecast, output_mode="tool"
        )
        typed = await agent.run("Weather in Paris?")
        ours = len(server.requests)
    # By hand: the final-result tool is an ordinary tool; its call is answered and sent
    # back, and the model ends its turn in one more request.
    async with MessagesServer([weather, final, reply("Done.")]) as server:
        agent_ = Agent(client=server.client(), tools=[get_weather, final_result])
        result = await agent_.run("Weather in Paris?")
        by_hand = len(server.requests)
        call = next(c for c in result.tool_calls if c.name == "final_result")
        parsed = Forecast.model_validate(call.input)  # the parsing left to the user
    return ours, by_hand, typed.output, parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = linearity(args.runs)
    ours, by_hand, typed, parsed = anyio.run(_requests)
    assert typed == parsed
    lines = [
        "# Benchmarks: typed output",
        "",
        f"`python -m benchmarks.output --runs {args.runs}`: medians. Python "
        f"{platform.python_version()}, pydantic {pydantic.VERSION}, ijson {ijson.__version__}, "
        f"{time.strftime('%Y-%m-%d')}. On a shared 2-core machine: read the times as ranges.",
        "",
        f"## O1: a streamed output in deltas of {DELTA} characters",
        "",
        "agentloop: `PartialOutputs` (incremental parse, checks when the output grew by half). "
        "From the start: every delta re-parses and validates the whole text so far.",
        "",
        "| output | deltas | agentloop (ms) | agentloop (µs per kB) | from the start (ms) "
        "| from the start (µs per kB) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "## O2: model requests of one run (a tool call, then a Forecast)",
        "",
        "| contender | requests |",
        "|---|---|",
        f"| agentloop `output_type=Forecast`, tool mode | {ours} |",
        f"| by hand: a `final_result` tool of the agent's own | {by_hand} |",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
