"""The run you hold: `Agent.start()` -> `Run`, its events, its result at any moment, its end.

Every way a service stops a run from outside (a timeout's cancel scope, `task.cancel()`,
a trio cancel scope, `run.cancel()`) leaves the partial result on the run: a history
valid to send again, the usage of every response received, each call answered once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
import trio

from agentloop import Agent, ConfigurationError, Run, lint_history, tool
from agentloop.errors import ServerError
from agentloop.events import (
    Event,
    RequestStarted,
    RunFinished,
    RunStarted,
    TextDelta,
    ToolCallReady,
    ToolResultEvent,
)
from agentloop.messages import parse_history
from agentloop.runstate import CANCELLED_MESSAGE
from agentloop.testing import Fault, MessagesServer, reply, text, tool_call

BACKENDS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]


@tool
def echo(value: str) -> str:
    """Echo the value back."""
    return value


def valid(messages: list[dict[str, Any]]) -> None:
    lint_history(parse_history(messages))


class Hang:
    """A tool that signals when it runs, then waits forever (until cancelled)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()

        @tool
        async def hang() -> str:
            """Hang."""
            self.entered.set()
            await anyio.sleep_forever()
            return "never"

        self.tool = hang


def hanging_script() -> list[Any]:
    return [reply(tool_call("echo", {"value": "a"})), reply(text("now"), tool_call("hang"))]


def assert_cancelled_partial(result: Any) -> None:
    """A run cancelled in its second round, while `hang` ran: what it leaves behind."""
    assert result.stop_reason == "cancelled"
    assert result.usage.requests == 2 and result.rounds == 2
    assert [c.output for c in result.tool_calls] == ["a", CANCELLED_MESSAGE]
    valid(result.messages)


# -- the handle


async def test_start_drives_the_run_and_streams_its_events(serve: Any) -> None:
    server = serve([reply(tool_call("echo", {"value": "x"})), reply("done")])
    agent = Agent(client=server.client(), tools=[echo])
    seen: list[Event] = []
    async with agent.start("go") as run:
        assert isinstance(run, Run)
        async for event in run:
            seen.append(event)
    kinds = [type(e) for e in seen]
    assert kinds[0] is RunStarted and kinds[-1] is RunFinished
    assert ToolCallReady in kinds and ToolResultEvent in kinds
    assert kinds.count(RequestStarted) == 2
    assert run.done and run.result.text == "done" and run.result.stop_reason == "end_turn"
    assert run.usage == run.result.usage and run.usage.requests == 2
    final = seen[-1]
    assert isinstance(final, RunFinished) and final.result == run.result


async def test_a_streamed_run_has_deltas_and_a_plain_one_does_not(serve: Any) -> None:
    server = serve([reply("hello there")] * 2)
    agent = Agent(client=server.client())
    async with agent.start("hi") as streamed:
        streamed_events = [e async for e in streamed]
    async with agent.start("hi", stream=False) as plain:
        plain_events = [e async for e in plain]
    assert any(isinstance(e, TextDelta) for e in streamed_events)
    assert not any(isinstance(e, TextDelta) for e in plain_events)
    assert streamed.result.text == plain.result.text == "hello there"
    assert [r.get("stream", False) for r in server.requests] == [True, False]


async def test_the_result_is_there_while_the_run_goes_on(serve: Any) -> None:
    hang = Hang()
    server = serve(hanging_script())
    agent = Agent(client=server.client(), tools=[echo, hang.tool])
    async with agent.start("go") as run:
        with anyio.fail_after(10):
            await hang.entered.wait()
        snapshot = run.result
        assert not run.done
        assert snapshot.stop_reason == "running" and snapshot.rounds == 2
        assert snapshot.usage.requests == 2 and run.usage.requests == 2
        assert [c.output for c in snapshot.tool_calls] == ["a"]
        assert snapshot.messages[-1]["role"] == "assistant"  # the call still runs
        run.cancel()
    assert_cancelled_partial(run.result)


async def test_cancel_after_the_turn_lets_the_calls_finish(serve: Any) -> None:
    release = anyio.Event()

    @tool
    async def slow() -> str:
        """Slow."""
        await release.wait()
        return "finished"

    server = serve([reply(tool_call("slow")), reply("never asked")])
    agent = Agent(client=server.client(), tools=[slow])
    async with agent.start("go") as run:
        async for event in run:
            if isinstance(event, ToolCallReady):
                run.cancel(after_turn=True)
                release.set()
    assert run.result.stop_reason == "cancelled"
    assert [c.output for c in run.result.tool_calls] == ["finished"]
    assert len(server.requests) == 1
    valid(run.result.messages)


async def test_a_failed_run_raises_at_the_block_end_and_keeps_its_partial_result(
    serve: Any,
) -> None:
    server = serve([reply(tool_call("echo", {"value": "a"})), Fault.server_error()])
    agent = Agent(client=server.client(), tools=[echo])
    with pytest.raises(ServerError) as caught:
        async with agent.start("go") as run:
            pass
    assert caught.value.result is not None
    assert run.result.stop_reason == "error" and run.result == caught.value.result
    assert run.result.usage.requests == 1
    valid(run.result.messages)


async def test_iterating_a_failed_run_raises_after_its_events(serve: Any) -> None:
    server = serve([reply(tool_call("echo", {"value": "a"})), Fault.server_error()])
    agent = Agent(client=server.client(), tools=[echo])
    seen: list[Event] = []
    with pytest.raises(ServerError):
        async with agent.start("go") as run:
            async for event in run:
                seen.append(event)
    assert any(isinstance(e, ToolResultEvent) for e in seen)
    assert run.result.stop_reason == "error"


async def test_an_exception_in_the_block_cancels_the_run_and_goes_on_as_itself(
    serve: Any,
) -> None:
    hang = Hang()
    server = serve(hanging_script())
    agent = Agent(client=server.client(), tools=[echo, hang.tool])

    class Mine(Exception):
        pass

    with pytest.raises(Mine):
        async with agent.start("go") as run:
            with anyio.fail_after(10):
                await hang.entered.wait()
            raise Mine
    assert_cancelled_partial(run.result)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_runs_error_and_the_blocks_own_go_on_as_themselves_on_either_backend(
    backend: str,
) -> None:
    class Mine(Exception):
        pass

    async def main() -> None:
        script = [reply(tool_call("echo", {"value": "a"})), Fault.server_error(), reply("hi")]
        async with MessagesServer(script) as server:
            agent = Agent(client=server.client(), tools=[echo])
            with pytest.raises(ServerError):  # raised while iterating, then through the block
                async with agent.start("go") as run:
                    async for _ in run:
                        pass
            assert run.result.stop_reason == "error"
            with pytest.raises(Mine):
                async with agent.start("go"):
                    raise Mine

    anyio.run(main, backend=backend)


async def test_a_run_is_driven_once_and_read_only_once_started(serve: Any) -> None:
    server = serve([reply("one")])
    run = Agent(client=server.client()).start("go")
    with pytest.raises(ConfigurationError, match="not started"):
        _ = run.result
    assert repr(run) == "Run(not started)"
    async with run:
        pass
    with pytest.raises(ConfigurationError, match="driven once"):
        async with run:
            pass
    assert run.result.text == "one"


async def test_bad_options_are_refused_on_entering_before_anything_is_sent(serve: Any) -> None:
    server = serve([reply("never")])
    run = Agent(client=server.client()).start("go", history=[{"role": "user"}])
    with pytest.raises(Exception, match="content"):
        async with run:
            pass
    assert server.requests == []


async def test_on_event_sees_each_event_before_the_run_goes_on(serve: Any) -> None:
    server = serve([reply(tool_call("echo", {"value": "x"})), reply("done")])
    agent = Agent(client=server.client(), tools=[echo])
    hooked: list[Event] = []

    async def record(event: Event) -> None:
        hooked.append(event)

    async with agent.start("go", on_event=record) as run:
        iterated = [e async for e in run]
    assert hooked == iterated


async def test_events_are_for_the_block(serve: Any) -> None:
    server = serve([reply("done")])
    async with Agent(client=server.client()).start("go") as run:
        pass
    assert [e async for e in run] == []  # read after the block: nothing, at once
    assert run.result.text == "done"


# -- a run cancelled from outside keeps its partial result (every way a service does it)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timeout_around_a_held_run_keeps_its_partial_result(backend: str) -> None:
    hang = Hang()

    async def main() -> Any:
        async with MessagesServer(hanging_script()) as server:
            agent = Agent(client=server.client(), tools=[echo, hang.tool])
            run = agent.start("go")
            with anyio.move_on_after(30) as scope:
                async with run:
                    await hang.entered.wait()
                    scope.cancel()  # as a request timeout would, while the tool runs
            assert scope.cancelled_caught
            return run.result

    assert_cancelled_partial(anyio.run(main, backend=backend))


def test_task_cancel_of_a_held_run_keeps_its_partial_result() -> None:
    hang = Hang()

    async def main() -> Any:
        async with MessagesServer(hanging_script()) as server:
            agent = Agent(client=server.client(), tools=[echo, hang.tool])
            run = agent.start("go")

            async def serve_request() -> None:
                async with run:
                    pass

            task = asyncio.get_running_loop().create_task(serve_request())
            await hang.entered.wait()
            task.cancel()  # a client gone: the framework cancels the request's task
            with pytest.raises(asyncio.CancelledError):
                await task
            return run.result

    assert_cancelled_partial(asyncio.run(main()))


def test_a_trio_cancel_scope_around_a_held_run_keeps_its_partial_result() -> None:
    hang = Hang()

    async def main() -> Any:
        async with MessagesServer(hanging_script()) as server:
            agent = Agent(client=server.client(), tools=[echo, hang.tool])
            run = agent.start("go")
            with trio.CancelScope() as scope:
                async with run:
                    await hang.entered.wait()
                    scope.cancel()
            assert scope.cancelled_caught
            return run.result

    assert_cancelled_partial(trio.run(main))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancelled_run_stream_hands_over_its_partial_result(backend: str) -> None:
    hang = Hang()

    async def main() -> Any:
        async with MessagesServer(hanging_script()) as server:
            agent = Agent(client=server.client(), tools=[echo, hang.tool])
            with anyio.move_on_after(30) as scope:
                async with agent.run_stream("go") as stream:
                    await hang.entered.wait()
                    scope.cancel()
            return stream.result

    assert_cancelled_partial(anyio.run(main, backend=backend))


async def test_a_cancelled_resume_hands_over_its_partial_result(serve: Any) -> None:
    from agentloop import Approve

    hang = Hang()

    @tool(requires_approval=True)
    def refund(order: int) -> str:
        """Refund an order."""
        return f"refunded {order}"

    script = [reply(tool_call("refund", {"order": 7})), reply(text("now"), tool_call("hang"))]
    server = serve(script)
    agent = Agent(client=server.client(), tools=[refund, hang.tool])
    paused = await agent.run("refund 7")
    assert paused.stop_reason == "approval_required" and paused.state is not None
    decisions = {paused.approvals[0].tool_use_id: Approve()}
    run = agent.start(state=paused.state, decisions=decisions)
    with anyio.move_on_after(30) as scope:
        async with run:
            await hang.entered.wait()
            scope.cancel()
    result = run.result
    assert result.stop_reason == "cancelled" and result.run_id == paused.run_id
    assert [c.output for c in result.tool_calls] == ["refunded 7", CANCELLED_MESSAGE]
    assert result.usage.requests == 2
    valid(result.messages)


async def test_a_cancelled_plain_run_still_raises_the_cancellation(serve: Any) -> None:
    hang = Hang()
    server = serve(hanging_script())
    agent = Agent(client=server.client(), tools=[echo, hang.tool])
    with anyio.move_on_after(30) as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "go")
            await hang.entered.wait()
            scope.cancel()
    assert scope.cancelled_caught  # nothing returned: `start` is the way to keep it
