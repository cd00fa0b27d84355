"""Parallel execution through the real SDK and the local Messages-API server."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentloop import Agent, ToolError, lint_history, tool
from agentloop.messages import parse_history
from agentloop.testing import reply, tool_call


def fanout(name: str, inputs: list[dict[str, Any]], final: str = "done") -> list[dict[str, Any]]:
    return [reply(*[tool_call(name, i) for i in inputs]), reply(final)]


@pytest.mark.both_formats
async def test_fifty_calls_run_in_one_turn_in_parallel(http_agent: Any) -> None:
    arrived = 0
    everyone = anyio.Event()
    windows: list[tuple[float, float]] = []

    @tool
    async def wait_for_all(n: int) -> str:
        """Rendezvous: returns only once all 50 calls are in flight together."""
        nonlocal arrived
        start = time.perf_counter()
        arrived += 1
        if arrived == 50:
            everyone.set()
        with anyio.fail_after(5):
            await everyone.wait()
        await anyio.sleep(0.2)
        windows.append((start, time.perf_counter()))
        return f"ok {n}"

    agent, server = http_agent(
        fanout("wait_for_all", [{"n": i} for i in range(50)]),
        tools=[wait_for_all],
        tool_concurrency=50,
    )
    result = await agent.run("go")
    assert result.stop_reason == "end_turn" and result.rounds == 2
    assert [c.output for c in result.tool_calls] == [f"ok {i}" for i in range(50)]
    assert not any(c.is_error for c in result.tool_calls)
    # The whole turn's tool work fits well inside twice one call's time.
    assert max(e for _, e in windows) - min(s for s, _ in windows) < 0.4
    results = server.model.requests[1]["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results] == [c.tool_use_id for c in result.tool_calls]


@pytest.mark.both_formats
async def test_concurrency_cap_is_never_exceeded(http_agent: Any) -> None:
    in_flight = 0
    most = 0
    full = anyio.Event()

    @tool
    async def counted(n: int) -> int:
        """Counts how many calls are running at once."""
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        if in_flight == 8:
            full.set()
        with anyio.fail_after(5):
            await full.wait()
        await anyio.lowlevel.checkpoint()
        in_flight -= 1
        return n

    agent, _ = http_agent(
        fanout("counted", [{"n": i} for i in range(64)]), tools=[counted], tool_concurrency=8
    )
    result = await agent.run("go")
    assert most == 8
    assert [c.output for c in result.tool_calls] == [str(i) for i in range(64)]


async def test_shared_limiter_caps_across_runs(serve: Any) -> None:
    limiter = anyio.CapacityLimiter(3)
    in_flight = 0
    most = 0

    @tool
    async def counted() -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        in_flight -= 1
        return "ok"

    def script(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] == "user" and isinstance(
            body["messages"][-1]["content"], str
        ):
            return reply(*[tool_call("counted") for _ in range(6)])
        return reply("done")

    server = serve(script)
    agent = Agent(client=server.client(), tools=[counted], tool_concurrency=8, tool_limiter=limiter)
    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(agent.run, "go")
    assert most <= 3


@pytest.mark.both_formats
async def test_timeout_turns_a_hung_tool_into_an_error_and_siblings_succeed(
    http_agent: Any,
) -> None:
    release = threading.Event()

    @tool
    async def hangs() -> str:
        await anyio.sleep(30)
        return "never"

    @tool
    def hangs_in_a_thread() -> str:
        release.wait(30)
        return "never"

    @tool
    async def quick() -> str:
        return "quick"

    @tool(timeout=5)
    async def own_timeout() -> str:
        await anyio.sleep(0.7)
        return "slow but allowed"

    script = [
        reply(
            tool_call("hangs"),
            tool_call("quick"),
            tool_call("hangs_in_a_thread"),
            tool_call("own_timeout"),
        ),
        reply("done"),
    ]
    agent, _ = http_agent(
        script, tools=[hangs, hangs_in_a_thread, quick, own_timeout], tool_timeout=0.5
    )
    started = time.perf_counter()
    try:
        result = await agent.run("go")
    finally:
        release.set()
    elapsed = time.perf_counter() - started
    by_name = {c.name: c for c in result.tool_calls}
    assert by_name["hangs"].is_error and "timed out after 0.5 s" in by_name["hangs"].output
    assert (
        by_name["hangs_in_a_thread"].is_error and "timed out" in by_name["hangs_in_a_thread"].output
    )
    assert not by_name["quick"].is_error and by_name["quick"].output == "quick"
    assert by_name["own_timeout"].output == "slow but allowed"
    assert 0.45 < by_name["hangs"].duration < 2
    assert elapsed < 5


@pytest.mark.both_formats
async def test_blocking_sync_tools_run_in_parallel_threads(http_agent: Any) -> None:
    barrier = threading.Barrier(6, timeout=5)
    threads: set[int] = set()

    @tool
    def blocking(n: int) -> str:
        """A sync tool that blocks until all six are running."""
        threads.add(threading.get_ident())
        barrier.wait()
        time.sleep(0.05)
        return str(n)

    agent, _ = http_agent(
        fanout("blocking", [{"n": i} for i in range(6)]), tools=[blocking], tool_concurrency=6
    )
    result = await agent.run("go")
    assert [c.output for c in result.tool_calls] == [str(i) for i in range(6)]
    assert not any(c.is_error for c in result.tool_calls)
    assert len(threads) == 6 and threading.get_ident() not in threads


class Boom(Exception):
    pass


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


@tool
def refuse(city: str) -> str:
    """Always refuses."""
    raise ToolError(f"unknown city {city!r}; use a country code")


@tool
async def crash() -> str:
    raise Boom("internal detail")


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param(tool_call("add", {"a": 1, "b": 2}), ("3", False), id="ok"),
        pytest.param(
            tool_call("refuse", {"city": "X"}),
            ("unknown city 'X'; use a country code", True),
            id="tool-error",
        ),
        pytest.param(
            tool_call("crash"), ("Tool 'crash' failed: Boom: internal detail", True), id="exception"
        ),
        pytest.param(
            tool_call("nope"),
            ("Unknown tool 'nope'. Available tools: add, refuse, crash.", True),
            id="unknown",
        ),
        pytest.param(
            tool_call("add", {"a": "one", "b": 2}),
            (
                "Invalid input for tool 'add'. Fix these and call it again:\n- a: Input should be a valid integer, unable to parse string as an integer (got \"one\")",
                True,
            ),
            id="wrong-type",
        ),
        pytest.param(
            tool_call("add", {"a": 1}),
            (
                "Invalid input for tool 'add'. Fix these and call it again:\n- b: required argument is missing",
                True,
            ),
            id="missing",
        ),
        pytest.param(
            tool_call("add", {"a": 1, "b": 2, "c": 3}),
            (
                "Invalid input for tool 'add'. Fix these and call it again:\n- c: unexpected argument; this tool does not take it",
                True,
            ),
            id="extra",
        ),
    ],
)
@pytest.mark.both_formats
async def test_failures_become_actionable_error_results(
    http_agent: Any, call: dict[str, Any], expected: tuple[str, bool]
) -> None:
    agent, server = http_agent([reply(call), reply("ok")], tools=[add, refuse, crash])
    result = await agent.run("go")
    assert result.stop_reason == "end_turn"
    (record,) = result.tool_calls
    assert (record.output, record.is_error) == expected
    block = server.model.requests[1]["messages"][-1]["content"][0]
    assert block["tool_use_id"] == call["id"]
    assert block.get("is_error", False) is expected[1]
    for body in server.model.requests:
        lint_history(parse_history(body["messages"]))


async def test_execute_runs_a_batch_in_order_under_the_cap() -> None:
    from agentloop.registry import ExecutionContext, ToolRegistry
    from agentloop.tools import ToolCall

    in_flight = 0
    most = 0

    @tool
    async def step(n: int) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await anyio.sleep(0.001 * (10 - n))
        in_flight -= 1
        return n

    registry = ToolRegistry([step])
    calls = [ToolCall(f"toolu_{n}", "step", {"n": n}) for n in range(10)] + [
        ToolCall("toolu_x", "nope", {})
    ]
    context = ExecutionContext("run", 1, anyio.CapacityLimiter(3), timeout=5)
    results = await registry.execute(calls, context)
    assert [r.tool_use_id for r in results] == [c.id for c in calls]
    assert [r.content for r in results[:10]] == [str(n) for n in range(10)]
    assert results[-1].is_error and most == 3
