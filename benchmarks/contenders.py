"""The contenders: each prepares once, then runs a scenario's conversation any number of times.

`CONTENDERS[name](client, scenario)` does the setup a service would do once (build the
agent, wrap the tools) and returns the `Run`: an async function that runs the whole
conversation once over the shared `AsyncAnthropic` client (max_retries=0) and returns
facts to check (the final text, the rounds made). Only `Run` calls are timed.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Awaitable, Callable
from typing import Any

from anthropic import AsyncAnthropic

from benchmarks.hand_loop import hand_loop
from benchmarks.scenarios import MAX_TOKENS, TOOLS, Scenario, definitions

PROMPT = "Go."
Run = Callable[[], Awaitable[dict[str, Any]]]
Contender = Callable[[AsyncAnthropic, Scenario], Run]


def agentloop(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """agentloop's `Agent.run` with the scenario's cap (64 unless the scenario sets one)."""
    return _agentloop(client, scenario, scenario.tool_concurrency)


def agentloop_cap8(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """agentloop with its default `tool_concurrency=8`."""
    return _agentloop(client, scenario, 8)


def _agentloop(client: AsyncAnthropic, scenario: Scenario, cap: int) -> Run:
    from agentloop import Agent, tool

    agent = Agent(
        scenario.model,
        client=client,
        tools=[tool(TOOLS[n]) for n in scenario.tools],
        max_tokens=MAX_TOKENS,
        max_rounds=scenario.max_rounds,
        tool_concurrency=cap,
    )

    async def run() -> dict[str, Any]:
        result = await agent.run(PROMPT)
        # The worker measures the history's size after the clock has stopped.
        return {"text": result.text, "rounds": result.rounds, "history": result.messages}

    return run


def agentloop_untraced(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """agentloop with its tracing hooks stubbed out: the baseline for "tracing off costs
    nothing" (S3), since `agentloop` itself runs with tracing off (no tracer provider)."""
    import agentloop.agent

    agentloop.agent.tracing_for = lambda provider: None  # type: ignore[assignment]
    return _agentloop(client, scenario, scenario.tool_concurrency)


def agentloop_eager(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """agentloop's `run_stream` over SSE: each call starts when its block closes."""
    return _agentloop_stream(client, scenario, eager=True)


def agentloop_noneager(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """agentloop's `run_stream` over SSE with `eager=False` tools: calls start at the end."""
    return _agentloop_stream(client, scenario, eager=False)


def _agentloop_stream(client: AsyncAnthropic, scenario: Scenario, *, eager: bool) -> Run:
    from agentloop import Agent, AnthropicProvider, tool

    agent = Agent(
        scenario.model,
        provider=AnthropicProvider(client, stream=True),
        # `tool(fn, eager=False)` would drop the option: use the decorator form.
        tools=[tool(eager=eager)(TOOLS[n]) for n in scenario.tools],
        max_tokens=MAX_TOKENS,
        max_rounds=scenario.max_rounds,
        tool_concurrency=scenario.tool_concurrency,
    )

    async def run() -> dict[str, Any]:
        from agentloop.events import ToolCallReady
        from benchmarks import scenarios

        async with agent.run_stream(PROMPT) as stream:
            async for event in stream:
                if isinstance(event, ToolCallReady) and "k" in event.input:
                    probe = scenarios.PROBE
                    probe.block_closed[event.input["k"]] = time.perf_counter() - probe.started
        result = stream.result
        assert result is not None
        return {"text": result.text, "rounds": result.rounds}

    return run


def hand(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """The minimal hand-written loop (benchmarks/hand_loop.py), calls in a task group."""
    return _hand(client, scenario, gather=False)


def hand_gather(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """The minimal hand-written loop with the calls run by `asyncio.gather`."""
    return _hand(client, scenario, gather=True)


def _hand(client: AsyncAnthropic, scenario: Scenario, *, gather: bool) -> Run:
    tools = {n: TOOLS[n] for n in scenario.tools}
    wire = definitions(scenario.tools)

    async def run() -> dict[str, Any]:
        messages = await hand_loop(
            client,
            model=scenario.model,
            prompt=PROMPT,
            tools=tools,
            definitions=wire,
            max_tokens=MAX_TOKENS,
            max_rounds=scenario.max_rounds,
            gather=gather,
        )
        last = messages[-1]["content"]
        text = "".join(getattr(b, "text", "") for b in last) if isinstance(last, list) else ""
        return {"text": text, "rounds": len(messages) // 2}

    return run


def sdk_runner(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """The SDK's `client.beta.messages.tool_runner` (runs a turn's calls one by one)."""
    return _sdk_runner(client, scenario, stream=False)


def sdk_runner_eager(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """The SDK's tool runner with `stream=True, run_tools_eagerly=True`."""
    return _sdk_runner(client, scenario, stream=True)


def _sdk_runner(client: AsyncAnthropic, scenario: Scenario, *, stream: bool) -> Run:
    from anthropic import beta_async_tool

    tools = [beta_async_tool(TOOLS[n]) for n in scenario.tools]

    async def run() -> dict[str, Any]:
        options: dict[str, Any] = {
            "model": scenario.model,
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": tools,
            "max_iterations": scenario.max_rounds,
            "thread": False,  # a plain Messages-API loop, not a server-held thread
        }
        rounds = 0
        if stream:
            runner: Any = client.beta.messages.tool_runner(
                stream=True, run_tools_eagerly=True, **options
            )
            async for message_stream in runner:
                rounds += 1
                async for _ in message_stream:
                    pass
        else:
            runner = client.beta.messages.tool_runner(**options)
            async for _ in runner:
                rounds += 1
        final = await runner.until_done()
        return {"text": "".join(getattr(b, "text", "") for b in final.content), "rounds": rounds}

    return run


def pydantic_ai(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """pydantic-ai's `Agent.run` over the same client (no request limit)."""
    from pydantic_ai import Agent, Tool
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.usage import UsageLimits

    model = AnthropicModel(scenario.model, provider=AnthropicProvider(anthropic_client=client))
    agent = Agent(
        model,
        tools=[Tool(TOOLS[n], takes_ctx=False) for n in scenario.tools],
        model_settings={"max_tokens": MAX_TOKENS},
    )

    async def run() -> dict[str, Any]:
        result = await agent.run(PROMPT, usage_limits=UsageLimits(request_limit=None))
        return {"text": str(result.output), "rounds": result.usage.requests}

    return run


def openai_agents(client: AsyncAnthropic, scenario: Scenario) -> Run:
    """openai-agents' `Runner.run` on its LiteLLM model, speaking the Messages API to the
    same server (LiteLLM brings its own HTTP client: `client` only gives the address)."""
    import os

    # Offline: LiteLLM would otherwise fetch its price list from the network on import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.extensions.models.litellm_model import LitellmModel

    model = LitellmModel(
        f"anthropic/{scenario.model}", base_url=str(client.base_url), api_key=client.api_key
    )
    agent = Agent(
        name="bench",
        model=model,
        tools=[function_tool(TOOLS[n]) for n in scenario.tools],
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
    )
    # No tracing, like the other contenders: with no OpenAI key there is nowhere to send it.
    config = RunConfig(tracing_disabled=True)

    async def run() -> dict[str, Any]:
        result = await Runner.run(agent, PROMPT, max_turns=scenario.max_rounds, run_config=config)
        return {"text": str(result.final_output), "rounds": len(result.raw_responses)}

    return run


CONTENDERS: dict[str, Contender] = {
    "agentloop": agentloop,
    "agentloop_cap8": agentloop_cap8,
    "agentloop_untraced": agentloop_untraced,
    "agentloop_eager": agentloop_eager,
    "agentloop_noneager": agentloop_noneager,
    "hand": hand,
    "hand_gather": hand_gather,
    "sdk_runner": sdk_runner,
    "sdk_runner_eager": sdk_runner_eager,
    "pydantic_ai": pydantic_ai,
    "openai_agents": openai_agents,
}


def available(name: str) -> str | None:
    """Why contender `name` cannot run here, or None if it can."""
    if name == "pydantic_ai" and importlib.util.find_spec("pydantic_ai") is None:
        return "pydantic-ai is not installed (pip install 'pydantic-ai-slim[anthropic]')"
    if name == "openai_agents" and not all(
        importlib.util.find_spec(package) for package in ("agents", "litellm")
    ):
        return "openai-agents is not installed (pip install 'openai-agents[litellm]')"
    return None
