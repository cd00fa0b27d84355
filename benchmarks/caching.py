"""What a 10-round tool loop is billed, with prompt caching on and off, and by other runners.

    python -m benchmarks.caching [--runs 5]

Every contender runs the same loop against `MessagesServer(prompt_cache=...)`, which bills
each request as Anthropic's prompt caching would (see docs/testing.md, "Prompt caching"):
a ~1,500-token system prompt, two tools, and a model that calls a tool in each of rounds
1-9 (each result ~400 tokens, so the history grows every round) and answers in round 10.
A run's bill is counted in input-token equivalents at the API's multipliers: plain input
1x, cache reads 0.1x, 5-minute writes 1.25x, 1-hour writes 2x (output is the same for
every contender and left out). Runs are interleaved (each round of the benchmark runs
every contender once, in turn) and repeated; the table gives the median with its spread,
and wall time for reference. Contenders: agentloop with `cache="auto"`, `"1h"` and
`"off"`, the SDK's tool runner (its defaults, but `thread=False`: the server-held thread
it uses by default is not a plain Messages API) and pydantic-ai with its defaults
(skipped when not installed). Writes `benchmarks/RESULTS-caching.md`.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import anyio

from agentloop.testing import MessagesServer, reply, tool_call
from agentloop.testing.caching import PromptCache

RESULTS = Path(__file__).with_name("RESULTS-caching.md")
MODEL = "claude-sonnet-5-5"
ROUNDS = 10
SYSTEM = (
    "You are the operations assistant of a small warehouse. Look stock up before you "
    "answer, never guess a count, and say which tool told you what. "
) * 40
PROMPT = "Check the stock of every shelf in aisle 4 and tell me what to reorder."
TARGET = 0.35
WEIGHTS = {"input": 1.0, "read": 0.1, "write_5m": 1.25, "write_1h": 2.0}


def stock(shelf: str) -> str:
    """Look up what a shelf of the warehouse holds."""
    return f"shelf {shelf}: " + "12 boxes of M4 bolts, 3 crates of washers; " * 40


def location(shelf: str) -> str:
    """Where a shelf of the warehouse is."""
    return f"shelf {shelf} is in aisle 4"


class BilledCache(PromptCache):
    """A `PromptCache` that keeps what it billed for each request."""

    def __init__(self) -> None:
        super().__init__()
        self.bills: list[dict[str, Any]] = []

    def bill(self, body: Any) -> dict[str, Any]:
        """Bill `body` as the API would, and keep the bill."""
        billed = super().bill(body)
        self.bills.append(billed)
        return billed


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The model: a `stock` call in rounds 1-9, then the answer (the round from the history)."""
    done = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if done < ROUNDS - 1:
        return reply(f"Shelf {done + 1}.", tool_call("stock", {"shelf": f"4-{done + 1}"}))
    return reply("Reorder washers on every shelf.")


def equivalents(bills: list[dict[str, Any]]) -> float:
    """Input-token equivalents of a run's bills."""
    total = 0.0
    for bill in bills:
        split = bill["cache_creation"]
        total += (
            bill["input_tokens"] * WEIGHTS["input"]
            + bill["cache_read_input_tokens"] * WEIGHTS["read"]
            + split["ephemeral_5m_input_tokens"] * WEIGHTS["write_5m"]
            + split["ephemeral_1h_input_tokens"] * WEIGHTS["write_1h"]
        )
    return total


Run = Callable[[anthropic.AsyncAnthropic], Awaitable[int]]
"""One run of the loop over a client; returns the number of model requests."""


def agentloop_run(cache: str) -> Run:
    async def run(client: anthropic.AsyncAnthropic) -> int:
        from agentloop import Agent

        agent = Agent(MODEL, client=client, system=SYSTEM, tools=[stock, location], cache=cache)  # type: ignore[arg-type]
        result = await agent.run(PROMPT)
        return result.rounds

    return run


async def sdk_runner(client: anthropic.AsyncAnthropic) -> int:
    from anthropic import beta_async_tool

    async def stock_(shelf: str) -> str:
        """Look up what a shelf of the warehouse holds."""
        return stock(shelf)

    async def location_(shelf: str) -> str:
        """Where a shelf of the warehouse is."""
        return location(shelf)

    stock_.__name__, location_.__name__ = "stock", "location"
    runner = client.beta.messages.tool_runner(
        model=MODEL,
        max_tokens=1024,
        system=SYSTEM,
        messages=[{"role": "user", "content": PROMPT}],
        tools=[beta_async_tool(stock_), beta_async_tool(location_)],
        max_iterations=ROUNDS,
        thread=False,  # a plain Messages-API loop: a server-held thread is not one
    )
    rounds = 0
    async for _ in runner:
        rounds += 1
    return rounds


async def pydantic_ai_run(client: anthropic.AsyncAnthropic) -> int:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    model = AnthropicModel(MODEL, provider=AnthropicProvider(anthropic_client=client))
    agent = Agent(
        model,
        system_prompt=SYSTEM,
        tools=[Tool(stock, takes_ctx=False), Tool(location, takes_ctx=False)],
    )
    result = await agent.run(PROMPT)
    usage: Any = result.usage  # a property in pydantic-ai 2.x, a method before
    requests = getattr(usage, "requests", None)
    return int(requests if requests is not None else usage().requests)


CONTENDERS: dict[str, Run] = {
    'agentloop cache="auto"': agentloop_run("auto"),
    'agentloop cache="1h"': agentloop_run("1h"),
    'agentloop cache="off"': agentloop_run("off"),
    "SDK tool runner (defaults)": sdk_runner,
    "pydantic-ai (defaults)": pydantic_ai_run,
}
BASELINE = 'agentloop cache="off"'


def skipped(name: str) -> str | None:
    """Why a contender cannot run here, or None."""
    if name.startswith("pydantic-ai") and importlib.util.find_spec("pydantic_ai") is None:
        return "pydantic-ai is not installed (pip install 'pydantic-ai-slim[anthropic]')"
    return None


async def measure(run: Run) -> tuple[float, float, int]:
    """One run on a fresh cache: (input-token equivalents, wall seconds, requests)."""
    cache = BilledCache()
    async with MessagesServer(answer, prompt_cache=cache) as server:
        client = server.client()
        started = time.perf_counter()
        rounds = await run(client)
        wall = time.perf_counter() - started
    if rounds != ROUNDS or len(cache.bills) != ROUNDS:
        raise RuntimeError(f"expected {ROUNDS} requests, saw {len(cache.bills)}")
    return equivalents(cache.bills), wall, len(cache.bills)


def spread(values: list[float], digits: int = 0) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}-{high:.{digits}f}" if low != high else "0"


async def main(runs: int) -> str:
    names = [n for n in CONTENDERS if skipped(n) is None]
    billed: dict[str, list[float]] = {n: [] for n in names}
    walls: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(runs):
        for name in names:  # interleaved: a busy moment slows every contender alike
            tokens, wall, _ = await measure(CONTENDERS[name])
            billed[name].append(tokens)
            walls[name].append(wall)
    base = statistics.median(billed[BASELINE])
    rows = [
        "| contender | billed input-token equivalents (median) | spread | vs caching off "
        "| wall (s, median) |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        median = statistics.median(billed[name])
        rows.append(
            f"| {name} | {median:,.0f} | {spread(billed[name])} | {median / base:.2f}x "
            f"| {statistics.median(walls[name]):.3f} |"
        )
    notes = [f"- {n}: skipped, {why}" for n in CONTENDERS if (why := skipped(n)) is not None]
    auto = statistics.median(billed['agentloop cache="auto"']) / base
    verdict = "met" if auto <= TARGET else "missed"
    return "\n".join(
        [
            "# Benchmark: what prompt caching saves",
            "",
            f"`python -m benchmarks.caching --runs {runs}`: a {ROUNDS}-round tool loop with a "
            "growing history (a ~1,500-token system prompt, a ~400-token tool result per "
            "round) against `MessagesServer(prompt_cache=...)`, which bills each request as "
            "Anthropic's prompt caching would. Billed input-token equivalents: input 1x, "
            "cache reads 0.1x, 5-minute writes 1.25x, 1-hour writes 2x. Each contender "
            f"with its defaults; {runs} interleaved runs each, on a fresh cache every run.",
            f"Python {platform.python_version()}, anthropic {anthropic.__version__}, "
            f"{time.strftime('%Y-%m-%d')}. The token estimate is the server's (one token "
            "per 4 characters of JSON), the same for every contender.",
            "",
            *rows,
            "",
            f'Target: `cache="auto"` bills <= {TARGET}x caching off: {auto:.2f}x, {verdict}.',
            *(["", *notes] if notes else []),
            "",
        ]
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    table = anyio.run(main, args.runs)
    RESULTS.write_text(table)
    print(table)


if __name__ == "__main__":
    cli()
