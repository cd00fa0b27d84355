"""`RunResult.cost` from the `genai-prices` table: cache reads and writes priced as such.

Expected figures use Anthropic's published prices for Claude Sonnet 4.5 (per million
tokens: $3 input, $3.75 5-minute cache writes, $6 1-hour writes, $0.30 cache reads, $15
output; requests under 200k input tokens).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentloop import Agent, tool
from agentloop.pricing import add_costs, cost_of
from agentloop.result import Usage
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

SONNET = "claude-sonnet-4-5"
PER_TOKEN = {"input": 3, "write_5m": 3.75, "write_1h": 6, "read": 0.30, "output": 15}
SYSTEM = "Answer with the tools you have. " * 200


@tool
def echo(value: str) -> str:
    """Say a value back."""
    return value


def published(usage: Usage) -> float:
    """What Anthropic's price list says `usage` costs (requests under 200k tokens)."""
    write_1h = usage.cache_creation_1h_input_tokens
    write_5m = usage.cache_creation_input_tokens - write_1h
    return (
        usage.input_tokens * PER_TOKEN["input"]
        + write_5m * PER_TOKEN["write_5m"]
        + write_1h * PER_TOKEN["write_1h"]
        + usage.cache_read_input_tokens * PER_TOKEN["read"]
        + usage.output_tokens * PER_TOKEN["output"]
    ) / 1e6


@pytest.mark.parametrize(
    "usage",
    [
        pytest.param(Usage(input_tokens=100_000), id="input"),
        pytest.param(Usage(output_tokens=10_000), id="output"),
        pytest.param(Usage(cache_read_input_tokens=100_000), id="read"),
        pytest.param(Usage(cache_creation_input_tokens=100_000), id="write-5m"),
        pytest.param(
            Usage(cache_creation_input_tokens=100_000, cache_creation_1h_input_tokens=60_000),
            id="write-1h",
        ),
    ],
)
def test_each_kind_of_token_has_its_own_price(usage: Usage) -> None:
    assert cost_of(SONNET, usage) == pytest.approx(published(usage))


def test_an_unknown_model_or_provider_has_no_price() -> None:
    usage = Usage(input_tokens=1000, output_tokens=10)
    assert cost_of("a-model-nobody-prices", usage) is None
    assert cost_of(SONNET, usage, provider="no-such-provider") is None
    assert add_costs(1.0, None) is None and add_costs(None, 1.0) is None
    assert add_costs(1.0, 0.5) == 1.5


def loop(rounds: int) -> Any:
    count = {"n": 0}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        count["n"] += 1
        if count["n"] < rounds:
            return reply(tool_call("echo", {"value": "x" * 200}))
        return reply("done")

    return answer


@pytest.mark.parametrize("cache", ["auto", "1h", "off"])
async def test_a_run_of_a_known_model_costs_what_the_price_list_says(cache: str) -> None:
    async with MessagesServer(loop(4), prompt_cache=True) as server:
        agent = Agent(SONNET, client=server.client(), system=SYSTEM, tools=[echo], cache=cache)  # type: ignore[arg-type]
        result = await agent.run("go")
    usage = result.usage
    assert usage.requests == 4
    assert result.cost is not None
    assert result.cost == pytest.approx(published(usage))
    if cache != "off":
        assert usage.cache_read_input_tokens > 0


async def test_caching_makes_the_same_run_cheaper() -> None:
    costs = {}
    for cache in ("auto", "off"):
        async with MessagesServer(loop(6), prompt_cache=True) as server:
            agent = Agent(SONNET, client=server.client(), system=SYSTEM, tools=[echo], cache=cache)  # type: ignore[arg-type]
            costs[cache] = (await agent.run("go")).cost
    assert costs["auto"] is not None and costs["off"] is not None
    assert costs["auto"] < 0.5 * costs["off"]


async def test_an_unknown_model_gives_no_cost_never_a_guess() -> None:
    async with MessagesServer([reply("ok")]) as server:
        result = await Agent("house-model-7", client=server.client()).run("hi")
    assert result.text == "ok" and result.usage.requests == 1
    assert result.cost is None


async def test_a_provider_the_table_does_not_know_is_priced_by_the_model_alone() -> None:
    usage = {"input_tokens": 1_000, "output_tokens": 100}
    result = await Agent(SONNET, provider=ScriptedProvider([reply("ok", usage=usage)])).run("hi")
    assert result.cost == pytest.approx(cost_of(SONNET, Usage(**usage)))
    unknown = await Agent("claude-scripted", provider=ScriptedProvider([reply("ok")])).run("hi")
    assert unknown.cost is None
