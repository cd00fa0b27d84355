"""Parallel execution through the real SDK and the local Messages-API server."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest
import structlog

from agentloop import Agent, AnthropicProvider, ToolError, lint_history, tool
from agentloop.events import ToolResultEvent
from agentloop.messages import parse_history
from agentloop.testing import MessagesServer, SteppedProvider, reply, tool_call

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup


def fanout(name: str, inputs: list[dict[str, Any]], final: str = "done") -> list[dict[str, Any]]:
    return [reply(*[tool_call(name, i) for i in inputs]), reply(final)]


@pytest.mark.both_formats
async def test_fifty_calls_run_in_one_turn_in_parallel(http_agent: Any) -> None:
    arrived = 0
    everyone = anyio.Event()

    @tool
    async def wait_for_all(n: int) -> str:
        """Rendezvous: returns only once all 50 calls are in flight together."""
        nonlocal arrived
        arrived += 1
        if arrived == 50:
            everyone.set()
        with anyio.fail_after(5):
            await everyone.wait()
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
        if body["messages"][-1]["content"][0]["type"] == "text":  # the prompt, not results
            return reply(*[tool_call("counted") for _ in range(6)])
        return reply("done")

    server = serve(script)
    agent = Agent(client=server.client(), tools=[counted], tool_concurrency=8, tool_limiter=limiter)
    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(agent.run, "go")
    assert most == 3


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
        await anyio.sleep(0.15)  # longer than the run's tool_timeout
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
        script, tools=[hangs, hangs_in_a_thread, quick, own_timeout], tool_timeout=0.1
    )
    started = time.perf_counter()
    try:
        result = await agent.run("go")
    finally:
        release.set()
    elapsed = time.perf_counter() - started
    by_name = {c.name: c for c in result.tool_calls}
    assert by_name["hangs"].is_error and "timed out after 0.1 s" in by_name["hangs"].output
    assert by_name["hangs"].output == "Tool 'hangs' timed out after 0.1 s and was stopped."
    # A thread cannot be stopped: the model is told the call may still take effect.
    assert by_name["hangs_in_a_thread"].is_error
    assert by_name["hangs_in_a_thread"].output.startswith(
        "Tool 'hangs_in_a_thread' did not finish within 0.1 s and is still running: "
        "it may yet complete"
    )
    assert not by_name["quick"].is_error and by_name["quick"].output == "quick"
    assert by_name["own_timeout"].output == "slow but allowed"
    assert 0.08 < by_name["hangs"].duration < 2
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
    from agentloop import RunContext
    from agentloop.registry import ToolRegistry
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
    context = RunContext(run_id="run", round=1, limiter=anyio.CapacityLimiter(3), timeout=5)
    results = await registry.execute(calls, context)
    assert [r.tool_use_id for r in results] == [c.id for c in calls]
    assert [r.content for r in results[:10]] == [str(n) for n in range(10)]
    assert results[-1].is_error and most == 3


def test_the_old_execution_context_still_builds_a_context_with_a_warning() -> None:
    from agentloop import RunContext
    from agentloop.registry import ExecutionContext

    with pytest.warns(DeprecationWarning, match="RunContext"):
        ctx = ExecutionContext("run", 2, anyio.CapacityLimiter(1), 5.0, deps="d")
    assert isinstance(ctx, RunContext)
    assert (ctx.run_id, ctx.round, ctx.timeout, ctx.deps) == ("run", 2, 5.0, "d")


# --------------------------------------------------------------------------- timeouts


def context(**options: Any) -> Any:
    from agentloop import RunContext

    values: dict[str, Any] = {
        "run_id": "run",
        "round": 1,
        "limiter": anyio.CapacityLimiter(8),
        "timeout": 5.0,
        **options,
    }
    return RunContext(**values)


def calls_of(name: str, count: int, make: Any = lambda i: {}) -> list[Any]:
    from agentloop.tools import ToolCall

    return [ToolCall(f"toolu_{name}_{i}", name, make(i)) for i in range(count)]


async def test_a_sync_tool_that_times_out_is_not_said_to_be_stopped(http_agent: Any) -> None:
    release, appended = threading.Event(), threading.Event()
    items: list[str] = []

    @tool(timeout=0.2)
    def append(item: str) -> str:
        """Append to the list (slowly)."""
        release.wait(5)
        items.append(item)
        appended.set()
        return "appended"

    agent, _ = http_agent(
        [reply(tool_call("append", {"item": "x"})), reply("done")], tools=[append]
    )
    try:
        result = await agent.run("go")
    finally:
        release.set()
    (record,) = result.tool_calls
    assert record.is_error and "was stopped" not in record.output
    assert record.output == (
        "Tool 'append' did not finish within 0.2 s and is still running: it may yet complete, "
        "so its effects may still happen. Check before calling it again."
    )
    # ... and so it does, after the run has ended.
    assert await anyio.to_thread.run_sync(appended.wait, 5)
    assert items == ["x"]


async def test_a_tool_that_must_not_be_abandoned_finishes_before_the_model_is_told(
    http_agent: Any,
) -> None:
    items: list[str] = []

    @tool(timeout=0.05, abandon=False)
    def append(item: str) -> str:
        """Append to the list; takes longer than its timeout."""
        time.sleep(0.15)  # the work itself, longer than the timeout
        items.append(item)
        return "appended"

    agent, server = http_agent(
        [reply(tool_call("append", {"item": "x"})), reply("done")], tools=[append]
    )
    result = await agent.run("go")
    (record,) = result.tool_calls
    assert items == ["x"]
    assert record.is_error and record.duration >= 0.15
    assert record.output.startswith(
        "Tool 'append' did not finish within 0.05 s; it was left to finish "
        f"(after {record.duration:.3g} s)"
    )
    assert record.output.endswith("so its effects have happened, but its output was discarded.")
    assert server.requests[1]["messages"][-1]["content"][0]["is_error"] is True


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_tool_that_must_not_be_abandoned_holds_up_a_cancelled_run(backend: str) -> None:
    items: list[str] = []

    async def main() -> Any:
        started = anyio.Event()
        cancelled = threading.Event()

        @tool(abandon=False)
        def append(item: str) -> str:
            """Append to the list; slow."""
            anyio.from_thread.run_sync(started.set)
            cancelled.wait(5)  # the work itself: the cancellation arrives meanwhile ...
            time.sleep(0.1)  # ... and some is left after it, that an abandoning run would skip
            items.append(item)
            return "appended"

        agent = Agent(
            provider=SteppedProvider([reply(tool_call("append", {"item": "x"})), reply("no")]),
            tools=[append],
        )

        async def cancel_once_started() -> None:
            await started.wait()
            stream.cancel()
            cancelled.set()

        async with agent.run_stream("go") as stream, anyio.create_task_group() as group:
            group.start_soon(cancel_once_started)
            async for _ in stream:
                pass
        return stream.result

    result = anyio.run(main, backend=backend)
    assert items == ["x"], "the run ended only after the thread had returned"
    assert result.stop_reason == "cancelled"


async def test_a_timed_out_call_does_not_spoil_the_next_in_the_same_task() -> None:
    from agentloop.registry import ToolRegistry

    @tool(timeout=0.05)
    async def hangs() -> str:
        await anyio.sleep(5)
        return "never"

    @tool(timeout=0.05)
    async def ignores_cancel() -> str:
        try:
            await anyio.sleep(5)
        except anyio.get_cancelled_exc_class():
            return "ignored the cancellation"
        return "never"

    @tool(timeout=0.5)
    async def short(n: int) -> int:
        await anyio.sleep(0.01)
        return n

    registry = ToolRegistry([hangs, ignores_cancel, short])
    calls = [*calls_of("hangs", 1), *calls_of("ignores_cancel", 1)]
    calls += calls_of("short", 3, lambda i: {"n": i})
    # A cap of 1: the calls run one after another in one task.
    results = await registry.execute(calls, context(limiter=anyio.CapacityLimiter(1)))
    assert [(r.content, r.is_error) for r in results] == [
        ("Tool 'hangs' timed out after 0.05 s and was stopped.", True),
        ("ignored the cancellation", False),
        ("0", False),
        ("1", False),
        ("2", False),
    ]


# --------------------------------------------------------------------------- cancellations


@tool
async def raises_a_stale_cancellation() -> str:
    """Re-raises a cancellation caught in a scope of its own, after that scope is gone."""
    caught: BaseException | None = None
    with anyio.CancelScope() as inner:
        inner.cancel()
        try:
            await anyio.sleep(5)
        except anyio.get_cancelled_exc_class() as exc:
            caught = exc
    assert caught is not None
    raise caught


def _foreign_cancellation_run(backend: str, stream: bool, tools: list[Any]) -> Any:
    async def main() -> Any:
        both = anyio.Event()
        arrived = 0

        @tool
        async def sibling() -> str:
            """Waits until the other sibling runs too."""
            nonlocal arrived
            arrived += 1
            if arrived == 2:
                both.set()
            with anyio.fail_after(5):
                await both.wait()
            return "fine"

        calls = [tool_call(t.name) for t in tools]
        script = [reply(tool_call("sibling"), *calls, tool_call("sibling")), reply("done")]
        async with MessagesServer(script) as server:
            agent = Agent(
                provider=AnthropicProvider(server.client(), stream=stream),
                tools=[sibling, *tools],
            )
            result = await agent.run("go")
            lint_history(parse_history(server.requests[1]["messages"]))
        return result

    return anyio.run(main, backend=backend)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_cancellation_the_tool_raised_itself_is_a_failure(backend: str, stream: bool) -> None:
    result = _foreign_cancellation_run(backend, stream, [raises_a_stale_cancellation])
    assert result.stop_reason == "end_turn"
    outputs = {c.name: (c.is_error, c.output) for c in result.tool_calls}
    assert outputs["sibling"] == (False, "fine")
    assert outputs["raises_a_stale_cancellation"][0] is True
    assert outputs["raises_a_stale_cancellation"][1].startswith(
        "Tool 'raises_a_stale_cancellation' failed: Cancelled"
    )
    assert outputs["raises_a_stale_cancellation"][1].endswith(
        "(raised by the tool; the call was not cancelled)"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_asyncio_cancellations_a_tool_did_not_receive_are_failures(stream: bool) -> None:
    import asyncio

    @tool
    async def raises_cancelled() -> str:
        raise asyncio.CancelledError()

    @tool
    async def awaits_a_cancelled_future() -> str:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.cancel)
        return str(await future)

    result = _foreign_cancellation_run(
        "asyncio", stream, [raises_cancelled, awaits_a_cancelled_future]
    )
    assert result.stop_reason == "end_turn"
    assert [(c.name, c.is_error, c.output) for c in result.tool_calls] == [
        ("sibling", False, "fine"),
        (
            "raises_cancelled",
            True,
            "Tool 'raises_cancelled' failed: CancelledError "
            "(raised by the tool; the call was not cancelled)",
        ),
        (
            "awaits_a_cancelled_future",
            True,
            "Tool 'awaits_a_cancelled_future' failed: CancelledError "
            "(raised by the tool; the call was not cancelled)",
        ),
        ("sibling", False, "fine"),
    ]


# --------------------------------------------------------------------------- BaseExceptions


class Fatal(BaseException):
    pass


def _raiser(kind: type[BaseException], sync: bool) -> Any:
    if sync:

        def fatal() -> str:
            raise kind("from the tool")

        return tool(fatal)

    async def fatal_async() -> str:
        raise kind("from the tool")

    return tool(name="fatal")(fatal_async)


KINDS = [
    pytest.param(SystemExit, id="SystemExit"),
    pytest.param(KeyboardInterrupt, id="KeyboardInterrupt"),
    pytest.param(GeneratorExit, id="GeneratorExit"),
    pytest.param(Fatal, id="custom"),
]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_base_exceptions_of_a_tool_propagate_as_themselves(
    backend: str, kind: type[BaseException], sync: bool
) -> None:
    from agentloop.registry import ToolRegistry

    @tool
    async def sibling(n: int) -> int:
        await anyio.sleep(5)
        return n

    registry = ToolRegistry([sibling, _raiser(kind, sync)])

    async def batch() -> None:
        calls = [*calls_of("sibling", 2, lambda i: {"n": i}), *calls_of("fatal", 1)]
        await registry.execute(calls, context())

    async def first_of_a_batch() -> None:
        await registry.execute([*calls_of("fatal", 1), *calls_of("sibling", 1)], context())

    async def single() -> None:
        await registry.run_call(calls_of("fatal", 1)[0], context())

    for main in (batch, first_of_a_batch, single):
        with pytest.raises(kind) as caught:
            anyio.run(main, backend=backend)
        assert type(caught.value) is kind and str(caught.value) == "from the tool"


def test_reraise_base_exception_unwraps_nested_groups() -> None:
    from agentloop.registry import reraise_base_exception

    fatal = Fatal("inner")
    group = BaseExceptionGroup("outer", [ValueError("x"), BaseExceptionGroup("inner", [fatal])])
    with pytest.raises(Fatal) as caught:
        reraise_base_exception(group)
    assert caught.value is fatal
    reraise_base_exception(ExceptionGroup("only errors", [ValueError("x")]))  # returns
    reraise_base_exception(ValueError("not a group"))


# --------------------------------------------------------------------------- slots


async def test_a_timed_out_sync_call_keeps_its_slots_until_its_thread_returns(
    http_agent: Any,
) -> None:
    release = threading.Event()
    lock = threading.Lock()
    running = peak = 0
    slots = anyio.CapacityLimiter(2)

    @tool(timeout=0.05)
    def blocks(n: int) -> int:
        """Blocks until released."""
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(5)
        with lock:
            running -= 1
        return n

    agent, _ = http_agent(
        fanout("blocks", [{"n": i} for i in range(6)]), tools=[blocks], tool_limiter=slots
    )
    timeouts = 0
    try:
        async with agent.run_stream("go") as stream:
            async for event in stream:
                if isinstance(event, ToolResultEvent) and event.is_error:
                    timeouts += 1
                    if timeouts == 2:
                        await anyio.wait_all_tasks_blocked()
                        # Both threads still run: their slots are still taken, and the
                        # four other calls still wait for one.
                        assert (running, slots.borrowed_tokens) == (2, 2)
                        assert slots.statistics().tasks_waiting == 4
                        release.set()
    finally:
        release.set()
    result = stream.result
    assert result is not None and peak == 2
    assert [c.is_error for c in result.tool_calls] == [True, True, False, False, False, False]
    assert slots.borrowed_tokens == 0


async def test_worker_threads_are_capped_across_runs() -> None:
    from agentloop.registry import ToolRegistry, thread_limiter

    threads = thread_limiter()
    assert threads.total_tokens == 40
    threads.total_tokens = 3
    release = threading.Event()
    lock = threading.Lock()
    running = peak = 0

    @tool(timeout=0.05)
    def blocks(n: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(5)
        with lock:
            running -= 1
        return n

    registry = ToolRegistry([blocks])
    timed_out = anyio.Event()
    results: list[Any] = []

    async def on_result(result: Any) -> None:
        results.append(result)
        if sum(r.is_error for r in results) == 3:
            timed_out.set()

    async def one_run(run: int) -> None:
        # Each run its own context and caps, as agents make them; no thread limiter given.
        await registry.execute(
            calls_of(f"blocks{run}", 3, lambda i: {"n": i}),
            context(run_id=f"run{run}"),
            on_result=on_result,
        )

    registry._tools = {f"blocks{run}": blocks.replace(name=f"blocks{run}") for run in range(4)}
    try:
        async with anyio.create_task_group() as group:
            for run in range(4):
                group.start_soon(one_run, run)
            with anyio.fail_after(5):
                await timed_out.wait()
            await anyio.wait_all_tasks_blocked()
            # Three threads run (abandoned by their calls); nine calls wait for a thread.
            assert (running, threads.borrowed_tokens) == (3, 3)
            assert threads.statistics().tasks_waiting == 9
            release.set()
    finally:
        release.set()
    assert peak == 3 and len(results) == 12
    assert sum(r.is_error for r in results) == 3  # waiting for a thread is not timed
    # The abandoned calls' threads hand their tokens back on the event loop once they
    # return, which may be just after the task group has ended: every token comes free.
    borrowers = [object() for _ in range(int(threads.total_tokens))]
    with anyio.fail_after(5):
        for borrower in borrowers:
            await threads.acquire_on_behalf_of(borrower)
    for borrower in borrowers:
        threads.release_on_behalf_of(borrower)
    assert threads.borrowed_tokens == 0


# --------------------------------------------------------------------------- batches


async def test_each_call_runs_in_a_context_of_its_own() -> None:
    import contextvars

    from agentloop.registry import ToolRegistry

    seen = contextvars.ContextVar[str]("seen")
    leaked: list[str] = []

    @tool
    async def instant(n: int) -> int:
        leaked.append(seen.get("unset"))
        seen.set(f"call {n}")  # a call's context is its own: its task's
        return n

    registry = ToolRegistry([instant])
    calls = calls_of("instant", 100, lambda i: {"n": i})
    results = await registry.execute(calls, context(limiter=anyio.CapacityLimiter(64)))
    assert [r.content for r in results] == [str(i) for i in range(100)]
    assert leaked == ["unset"] * 100


async def test_instant_calls_do_not_wait_for_waiting_ones() -> None:
    from agentloop.registry import ToolRegistry

    arrived = 0
    everyone = anyio.Event()
    order: list[str] = []

    @tool
    async def waits(n: int) -> int:
        nonlocal arrived
        arrived += 1
        if arrived == 5:
            everyone.set()
        with anyio.fail_after(5):
            await everyone.wait()
        order.append(f"wait {n}")
        return n

    @tool
    async def instant(n: int) -> int:
        order.append(f"instant {n}")
        return n

    registry = ToolRegistry([waits, instant])
    calls = [*calls_of("waits", 5, lambda i: {"n": i}), *calls_of("instant", 2, lambda i: {"n": i})]
    reported: list[str] = []

    async def on_result(result: Any) -> None:
        reported.append(result.tool_use_id)

    results = await registry.execute(calls, context(), on_result=on_result)
    assert [r.content for r in results] == ["0", "1", "2", "3", "4", "0", "1"]
    assert sorted(reported) == sorted(c.id for c in calls)
    # The instant calls did not wait for the waiting ones.
    assert order[:2] == ["instant 0", "instant 1"]


async def test_each_call_of_a_batch_logs_with_its_own_id() -> None:
    from structlog.testing import capture_logs

    from agentloop.registry import ToolRegistry

    @tool
    async def logs(n: int) -> int:
        structlog.get_logger("tool").info("inside", n=n)
        return n

    @tool
    def logs_in_a_thread(n: int) -> int:
        structlog.get_logger("tool").info("inside", n=n)
        return n

    registry = ToolRegistry([logs, logs_in_a_thread])
    calls = [
        *calls_of("logs", 3, lambda i: {"n": i}),
        *calls_of("logs_in_a_thread", 2, lambda i: {"n": i}),
    ]
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs_seen:
        await registry.execute(calls, context())
    inside = {(e["tool_use_id"], e["n"]) for e in logs_seen if e["event"] == "inside"}
    assert inside == {(c.id, c.input["n"]) for c in calls}


async def test_concurrent_runs_share_one_cap_on_worker_threads(serve: Any) -> None:
    from agentloop.registry import thread_limiter

    threads = thread_limiter()
    threads.total_tokens = 3
    release = threading.Event()
    lock = threading.Lock()
    full = anyio.Event()
    running = peak = 0

    @tool
    def blocks(n: int) -> int:
        """Blocks until released."""
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            if running == 3:
                anyio.from_thread.run_sync(full.set)
        release.wait(5)
        with lock:
            running -= 1
        return n

    server = serve(
        lambda body: fanout("blocks", [{"n": i} for i in range(3)])[len(body["messages"]) // 2]
    )
    agent = Agent(client=server.client(), tools=[blocks], tool_concurrency=8)
    results: list[Any] = []

    async def one_run() -> None:
        results.append(await agent.run("go"))

    try:
        async with anyio.create_task_group() as group:
            for _ in range(4):
                group.start_soon(one_run)
            with anyio.fail_after(5):
                await full.wait()
                # The other runs' calls queue on the shared limiter as their model
                # answers arrive (a task waiting on its socket counts as blocked too,
                # so this waits for the queue itself, not for quiet).
                while threads.statistics().tasks_waiting < 9:
                    await anyio.wait_all_tasks_blocked()
            assert (running, threads.borrowed_tokens) == (3, 3)
            assert threads.statistics().tasks_waiting == 9
            release.set()
    finally:
        release.set()
    assert peak == 3 and [r.stop_reason for r in results] == ["end_turn"] * 4


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_abandoned_thread_gives_its_slots_back_on_the_event_loop(backend: str) -> None:
    from agentloop.registry import ToolRegistry

    release = threading.Event()

    @tool(timeout=0.05)
    def blocks() -> str:
        release.wait(5)
        return "late"

    async def main() -> None:
        run_cap, shared = anyio.CapacityLimiter(2), anyio.CapacityLimiter(1)
        registry = ToolRegistry([blocks])
        [result] = await registry.execute(
            calls_of("blocks", 1), context(limiter=run_cap, shared_limiter=shared)
        )
        assert result.is_error and "is still running" in str(result.content)
        assert (run_cap.borrowed_tokens, shared.borrowed_tokens) == (1, 1)
        release.set()  # the thread returns, and hands the tokens back from its thread
        with anyio.fail_after(5):
            while run_cap.borrowed_tokens or shared.borrowed_tokens:
                await anyio.lowlevel.checkpoint()

    try:
        anyio.run(main, backend=backend)
    finally:
        release.set()


@pytest.mark.parametrize("loop_end", ["closed", "stopped, not closed"])
def test_an_abandoned_thread_that_outlives_its_event_loop_ends_quietly(loop_end: str) -> None:
    """The thread's end hands nothing back to a closed loop, and does not wait for one
    that has stopped (it would never run again: the process would wait at exit)."""
    import asyncio

    from agentloop.registry import ToolRegistry

    release = threading.Event()
    threads: list[threading.Thread] = []
    failures: list[Any] = []

    @tool(timeout=0.05)
    def blocks() -> str:
        threads.append(threading.current_thread())
        release.wait(5)
        return "late"

    async def main() -> None:
        [result] = await ToolRegistry([blocks]).execute(calls_of("blocks", 1), context())
        assert result.is_error

    loop = asyncio.new_event_loop()
    hook, threading.excepthook = threading.excepthook, failures.append
    try:
        loop.run_until_complete(main())
        if loop_end == "closed":
            loop.close()  # its limiters are gone with it
        release.set()
        (thread,) = threads
        thread.join(5)
        assert not thread.is_alive() and failures == []
    finally:
        threading.excepthook = hook
        release.set()
        loop.close()
