"""What 100 runs of 3 rounds cost sent one request at a time, and as message batches.

    python -m benchmarks.batches [--runs 100]

Both ways run the same agent on the same prompts against `MessagesServer`: each run calls
a tool in rounds 1 and 2 and answers in round 3. Every answer's usage is the server's
stand-in count of the request's input (`agentloop.testing.server.count_tokens`) and 60
output tokens, so both ways are billed the same tokens; caching is off, so only the
batch rate differs. The costs are `RunResult.cost` summed (genai-prices, the agent's
default model), and the batched runs' responses say `service_tier: "batch"` as the API's
do. Wall time is for reference only: the server ends a batch at once (`batch_delay=0`),
where the API takes minutes to hours. Writes `benchmarks/RESULTS-batches.md`.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import anyio

from agentloop import Agent, tool
from agentloop.result import RunResult
from agentloop.testing import MessagesServer, reply, tool_call
from agentloop.testing.server import count_tokens

RESULTS = Path(__file__).with_name("RESULTS-batches.md")
ROUNDS = 3
SYSTEM = "You answer questions about parcels. Look every parcel up before you answer. " * 10


@tool
def track(parcel: str) -> str:
    """Where a parcel is now."""
    return f"parcel {parcel} left the Lyon depot at 06:40 and is due tomorrow before noon"


def answer(body: dict[str, Any]) -> Any:
    """A call of `track` in rounds 1 and 2, then an answer; usage from the request's size."""
    rounds = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
    usage = {"input_tokens": count_tokens(body), "output_tokens": 60}
    if rounds < ROUNDS:
        return reply(tool_call("track", {"parcel": f"P{rounds}"}), usage=usage)
    return reply("Both parcels arrive tomorrow before noon.", usage=usage)


async def each_alone(agent: Agent[Any], prompts: list[str]) -> list[Any]:
    """Each prompt's run, one request at a time (the runs concurrent)."""
    outcomes: list[Any] = [None] * len(prompts)

    async def one(n: int) -> None:
        outcomes[n] = await agent.run(prompts[n])

    async with anyio.create_task_group() as group:
        for n in range(len(prompts)):
            group.start_soon(one, n)
    return outcomes


async def measure(runs: int) -> dict[str, dict[str, float]]:
    """Cost, wall time and HTTP requests of `runs` runs, one by one and batched."""
    prompts = [f"Where are my parcels? (customer {n})" for n in range(runs)]
    found: dict[str, dict[str, float]] = {}
    for way in ("one request at a time", "message batches"):
        async with MessagesServer(answer) as server:
            agent = Agent(client=server.client(), tools=[track], system=SYSTEM, cache="off")
            started = time.perf_counter()
            if way == "message batches":
                outcomes: list[Any] = await agent.run_batch(prompts, poll_interval=0.01)
            else:
                outcomes = await each_alone(agent, prompts)
            wall = time.perf_counter() - started
            results = [o for o in outcomes if isinstance(o, RunResult)]
            assert len(results) == runs and all(r.rounds == ROUNDS for r in results)
            found[way] = {
                "cost": sum(r.cost or 0.0 for r in results),
                "input": sum(r.usage.input_tokens for r in results),
                "output": sum(r.usage.output_tokens for r in results),
                "http": len(server.recorded),
                "wall": wall,
            }
    return found


def report(runs: int, found: dict[str, dict[str, float]]) -> str:
    """The results as a Markdown page."""
    plain = found["one request at a time"]["cost"]
    lines = [
        "# Batch runs: cost of many runs, one request at a time and as message batches",
        "",
        f"{runs} runs of {ROUNDS} rounds each (a tool call in rounds 1 and 2, an answer in",
        "round 3), the same tokens both ways; measured by `python -m benchmarks.batches",
        f"--runs {runs}` on {platform.python_implementation()} {platform.python_version()}.",
        "",
        "| way | cost (USD) | vs one at a time | input tokens | output tokens "
        "| HTTP requests | wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for way, row in found.items():
        lines.append(
            f"| {way} | {row['cost']:.4f} | {row['cost'] / plain:.2f}x | {row['input']:.0f} "
            f"| {row['output']:.0f} | {row['http']:.0f} | {row['wall']:.2f} |"
        )
    lines += [
        "",
        "The batched runs send one batch per round (3 batches, each polled until it has",
        "ended), and are billed half: genai-prices' batch rate for the agent's model. Wall",
        "time is the local server's; the API takes minutes to hours to end a batch.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Measure and write `RESULTS-batches.md`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    found = anyio.run(measure, args.runs)
    text = report(args.runs, found)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
