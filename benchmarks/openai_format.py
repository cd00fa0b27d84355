"""S1-S3 on the Chat Completions path: agentloop over OpenAIChatProvider against a hand loop.

    python -m benchmarks.openai_format [--runs N]

Starts `ChatCompletionsServer` (answering `benchmarks.scenarios.respond`, without linting
or keeping requests) in its own process, runs S1 (one turn of 50 calls x 100 ms), S2 (100
turns of one instant call) and S3 (one turn of 1000 instant calls) for agentloop with
`OpenAIChatProvider` and for a minimal hand-written `AsyncOpenAI` loop (no validation, no
cap, no timeouts: the lower bound), plus openai-agents when it is installed, and writes
`benchmarks/RESULTS-openai.md`.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from benchmarks.scenarios import MAX_TOKENS, SCENARIOS, SCHEMAS, TOOLS

Run = Callable[[Any, str], Awaitable[Any]]
RESULTS = Path(__file__).with_name("RESULTS-openai.md")
NAMES = ("S1", "S2", "S3")
EXPECTED_ROUNDS = {"S1": 2, "S2": 101, "S3": 2}


# -- the server process


def serve() -> None:
    from agentloop.testing import ChatCompletionsServer
    from benchmarks.server import BenchModel

    model = BenchModel()
    server = ChatCompletionsServer(model)
    model.sinks.append(server.requests)
    model.sinks.append(server.request_times)
    server.start()
    print(f"port {server.base_url.rsplit(':', 1)[1]}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop()


# -- the contenders


def chat_tools(names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": n, "description": n, "parameters": SCHEMAS[n]}}
        for n in names
    ]


async def hand(client: Any, name: str) -> Any:
    """create -> run the calls in one task group -> append the tool messages -> repeat."""
    scenario = SCENARIOS[name]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    tools = chat_tools(scenario.tools)
    for _ in range(scenario.max_rounds):
        response = await client.chat.completions.create(
            model=scenario.model, max_tokens=MAX_TOKENS, messages=messages, tools=tools
        )
        message = response.choices[0].message
        calls = message.tool_calls or []
        messages.append(message.model_dump(exclude_none=True))
        if not calls:
            break
        results: list[dict[str, Any]] = [{}] * len(calls)

        async def run(index: int, call: Any, results: list[dict[str, Any]] = results) -> None:
            output = await TOOLS[call.function.name](**json.loads(call.function.arguments))
            results[index] = {"role": "tool", "tool_call_id": call.id, "content": output}

        async with anyio.create_task_group() as group:
            for index, call in enumerate(calls):
                group.start_soon(run, index, call)
        messages.extend(results)
    return messages


async def agentloop(client: Any, name: str) -> Any:
    from agentloop import Agent, OpenAIChatProvider, tool

    scenario = SCENARIOS[name]
    agent = Agent(
        model=scenario.model,
        provider=OpenAIChatProvider(client),
        tools=[tool(TOOLS[n]) for n in scenario.tools],
        max_rounds=scenario.max_rounds,
        max_tokens=MAX_TOKENS,
        tool_concurrency=scenario.tool_concurrency,
    )
    return await agent.run("go")


def contenders() -> dict[str, Run]:
    found: dict[str, Run] = {"agentloop": agentloop, "hand": hand}
    try:
        import agents  # noqa: F401  (openai-agents)
    except ImportError:
        pass
    else:
        found["openai_agents"] = openai_agents
    return found


async def openai_agents(client: Any, name: str) -> Any:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

    scenario = SCENARIOS[name]
    model = OpenAIChatCompletionsModel(model=scenario.model, openai_client=client)
    agent = Agent(
        name="bench",
        model=model,
        tools=[function_tool(TOOLS[n]) for n in scenario.tools],
    )
    return await Runner.run(agent, "go", max_turns=scenario.max_rounds)


# -- measuring


async def measure(base_url: str, name: str, run: Run, runs: int) -> dict[str, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    walls: list[float] = []
    cpus: list[float] = []
    for n in range(runs + 1):  # one warm-up run
        wall, cpu = time.perf_counter(), time.process_time()
        done = await run(client, name)
        rounds = getattr(done, "rounds", None)
        if rounds is None:
            rounds = (
                sum(1 for m in done if m.get("role") == "assistant")
                if isinstance(done, list)
                else None
            )
        if rounds is not None and rounds != EXPECTED_ROUNDS[name]:
            raise RuntimeError(f"{name}: {rounds} rounds, expected {EXPECTED_ROUNDS[name]}")
        if n:
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    await client.close()
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.openai_format", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().split()[1]
        base_url = f"http://127.0.0.1:{port}/v1"
        table: dict[tuple[str, str], dict[str, float]] = {}
        for name in NAMES:
            for contender, run in contenders().items():
                table[name, contender] = anyio.run(measure, base_url, name, run, args.runs)
                print(name, contender, table[name, contender], flush=True)
    finally:
        server.terminate()
        server.wait(10)
    write(table, args.runs)


def write(table: dict[tuple[str, str], dict[str, float]], runs: int) -> None:
    import openai

    from agentloop import __version__

    lines = [
        "# Benchmarks: the Chat Completions path",
        "",
        f"`python -m benchmarks.openai_format --runs {runs}`: medians of {runs} runs after a "
        "warm-up, against `ChatCompletionsServer` in its own process.",
        f"Python {platform.python_version()}, openai {openai.__version__}, "
        f"agentloop-runner {__version__}, {time.strftime('%Y-%m-%d')}. The hand loop passes its "
        "history to `chat.completions.create`, which validates and re-serialises all of it "
        "every round; agentloop sends each message's JSON once. On a shared 2-core machine: "
        "read the figures as ranges.",
        "",
        "| scenario | contender | wall (s) | client CPU (s) | vs hand loop (wall / CPU) |",
        "|---|---|---|---|---|",
    ]
    for name in NAMES:
        base = table[name, "hand"]
        for (scenario, contender), value in table.items():
            if scenario != name:
                continue
            lines.append(
                f"| {name}: {SCENARIOS[name].title} | {contender} | {value['wall']:.3f} | "
                f"{value['cpu']:.3f} | {value['wall'] / base['wall']:.2f}x / "
                f"{value['cpu'] / base['cpu']:.2f}x |"
            )
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
