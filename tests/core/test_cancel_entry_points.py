"""Every entry point keeps a cancelled run's partial result, whoever cancels it.

A service stops runs from outside in three ways: a timeout's cancel scope
(`anyio.move_on_after`, on asyncio and trio), `task.cancel()` on asyncio (a client gone), and
a trio `CancelScope`. Each entry point that hands a `Run` out (`start`, `run_stream`, a
resume held through `start(state=...)`, `resume_stream`) must leave on that run a history
valid to send again, the usage of both responses received, and each call answered once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import trio
from test_runs import Hang, assert_cancelled_partial

from agentloop import Agent, Approve, Run, tool
from agentloop.testing import MessagesServer, reply, text, tool_call

ENTRIES = ["start", "run_stream", "resume", "resume_stream"]
RESUMED = ("resume", "resume_stream")


def echo_tool(needs_approval: bool) -> Any:
    def echo(value: str) -> str:
        return value

    return tool(echo, name="echo", description="Echo.", requires_approval=needs_approval)


def script() -> list[Any]:
    return [reply(tool_call("echo", {"value": "a"})), reply(text("now"), tool_call("hang"))]


@asynccontextmanager
async def held(agent: Agent, entry: str, paused: Any) -> AsyncIterator[Run[Any]]:
    """The run `entry` hands out, driven inside the block."""
    if entry == "start":
        async with agent.start("go") as run:
            yield run
    elif entry == "run_stream":
        async with agent.run_stream("go") as run:
            yield run
    else:
        decisions = {paused.approvals[0].tool_use_id: Approve()}
        if entry == "resume":
            async with agent.start(state=paused.state, decisions=decisions) as run:
                yield run
        else:
            async with agent.resume_stream(paused.state, decisions=decisions) as run:
                yield run


async def with_scope(
    agent: Agent, hang: Hang, paused: Any, runs: list[Run[Any]], entry: str
) -> None:
    with anyio.move_on_after(30) as scope:
        async with held(agent, entry, paused) as run:
            runs.append(run)
            await hang.entered.wait()
            scope.cancel()  # as a request timeout would, while the tool runs
    assert scope.cancelled_caught


async def with_task_cancel(
    agent: Agent, hang: Hang, paused: Any, runs: list[Run[Any]], entry: str
) -> None:
    async def serve_request() -> None:
        async with held(agent, entry, paused) as run:
            runs.append(run)
            await anyio.sleep_forever()

    task = asyncio.get_running_loop().create_task(serve_request())
    await hang.entered.wait()
    task.cancel()  # a client gone: the framework cancels the request's task
    with pytest.raises(asyncio.CancelledError):
        await task


async def with_trio_scope(
    agent: Agent, hang: Hang, paused: Any, runs: list[Run[Any]], entry: str
) -> None:
    with trio.CancelScope() as scope:
        async with held(agent, entry, paused) as run:
            runs.append(run)
            await hang.entered.wait()
            scope.cancel()
    assert scope.cancelled_caught


WAYS = [
    pytest.param(with_scope, "asyncio", id="move_on_after-asyncio"),
    pytest.param(with_scope, "trio", id="move_on_after-trio"),
    pytest.param(with_task_cancel, "asyncio", id="task.cancel"),
    pytest.param(with_trio_scope, "trio", id="trio-CancelScope"),
]


@pytest.mark.parametrize(("cancel", "backend"), WAYS)
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_point_keeps_the_partial_result_of_a_cancelled_run(
    entry: str, cancel: Callable[..., Awaitable[None]], backend: str
) -> None:
    async def main() -> Any:
        hang = Hang()
        async with MessagesServer(script()) as server:
            async with server.client() as client:
                agent = Agent(client=client, tools=[echo_tool(entry in RESUMED), hang.tool])
                paused = None
                if entry in RESUMED:
                    paused = await agent.run("go")
                    assert paused.stop_reason == "approval_required"
                runs: list[Run[Any]] = []
                await cancel(agent, hang, paused, runs, entry)
                (run,) = runs
                if paused is not None:
                    assert run.result.run_id == paused.run_id
                return run.result

    assert_cancelled_partial(anyio.run(main, backend=backend))
