"""`agentloop.durable.dbos`: what a run reads of its own workflow, besides DBOS's step writes.

Each step looks whether `DurableAgent.cancel` asked the run to stop: the model step before
its request, the calls of a turn once for them all. Those reads take the workflow's status
row alone, never its input (the history the run started with) or its output. Counted
with SQLAlchemy's public statement events, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")

import sqlalchemy as sa

from agentloop import Agent, tool
from agentloop.durable.dbos import DurableAgent
from agentloop.runstate import CANCELLED_MESSAGE
from agentloop.testing import ScriptedProvider, SteppedProvider, reply, tool_call

pytestmark = pytest.mark.durable


@tool
async def note(item: str) -> str:
    """Note an item."""
    return f"noted {item}"


@contextmanager
def status_reads() -> Iterator[list[str]]:
    """The statements that read a workflow's status row with its attributes, as they run."""
    reads: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        text = " ".join(statement.split())
        if text.startswith("SELECT") and "workflow_status.attributes" in text:
            reads.append(text)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        yield reads
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)


def _calls(round_: int, items: str) -> list[dict[str, Any]]:
    return [tool_call("note", {"item": i}, id=f"toolu_{round_}{i}") for i in items]


async def test_the_calls_of_a_turn_share_one_read_of_the_status_row_alone(
    launch: Callable[[], None],
) -> None:
    # Three rounds: three calls, then two, then the end. A read per model step and one
    # per turn of calls, whatever the number of calls: five, not eight.
    script = [reply("Three.", *_calls(1, "abc")), reply("Two.", *_calls(2, "ab")), reply("Done.")]
    durable = DurableAgent(Agent(provider=ScriptedProvider(script), tools=[note], name="reads"))
    launch()
    history = [{"role": "user", "content": "x" * 50_000}, {"role": "assistant", "content": "ok"}]
    with status_reads() as reads:
        result = await durable.run("Go.", run_id="reads-1", history=history)
    assert result.stop_reason == "end_turn" and len(result.tool_calls) == 5
    # The first read is the caller's, before the run starts: is there a run of that id?
    in_steps = reads[1:]
    assert len(in_steps) == 5, in_steps
    # Neither the run's input (here a long history) nor its output is read by a step,
    # nor by the caller's question.
    assert not [r for r in reads if "workflow_input" in r or "workflow_output" in r]


async def test_the_calls_of_a_later_turn_read_again_and_see_a_cancel(
    launch: Callable[[], None],
) -> None:
    # Round 1's calls read "not stopped"; the run is cancelled while round 2's response
    # is on its way: round 2's calls must not reuse that answer.
    asked, answer = anyio.Event(), anyio.Event()
    ran: list[str] = []

    @tool
    async def charge(item: str) -> str:
        """Charge an item."""
        ran.append(item)
        return f"charged {item}"

    async def hold(number: int, event: Any) -> None:
        if len(provider.model.requests) == 2 and not asked.is_set():  # round 2's first event
            asked.set()
            await answer.wait()

    first = [tool_call("charge", {"item": i}, id=f"toolu_1{i}") for i in "ab"]
    second = [tool_call("charge", {"item": i}, id=f"toolu_2{i}") for i in "cd"]
    script = [reply("Two.", *first), reply("Two more.", *second), reply("Done.")]
    provider = SteppedProvider(script, hook=hold)
    durable = DurableAgent(Agent(provider=provider, tools=[charge], name="later"))
    launch()
    results: list[Any] = []

    async def run() -> None:
        results.append(await durable.run("Go.", run_id="later-1"))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await asked.wait()
            await durable.cancel("later-1")
            answer.set()
    (result,) = results
    assert result.stop_reason == "cancelled" and sorted(ran) == ["a", "b"]
    answers = [(b["tool_use_id"], b["content"]) for b in result.messages[4]["content"]]
    assert answers == [("toolu_2c", CANCELLED_MESSAGE), ("toolu_2d", CANCELLED_MESSAGE)]
    assert result.rounds == 2 and len(provider.model.requests) == 2
