"""What a Temporal run records: the conversation once per workflow run, a result that fits.

Each model activity's input is what is new since the workflow run's previous request
(`agentloop.durable.temporal.requests`), and the activity rebuilds the whole request
from the inputs its workflow run recorded. The history then grows with the rounds, not
with their square, and a workflow recorded when every request was sent whole replays.
The workflow's result holds the conversation once: the tool-call log does not repeat it.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="temporalio is not installed")

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer
from test_durable_temporal_long import read, script

from agentloop import Agent, tool
from agentloop.durable.temporal import TemporalAgent
from agentloop.durable.temporal.requests import _next, request_input
from agentloop.errors import HistoryError
from agentloop.testing import ScriptedProvider

pytestmark = [pytest.mark.durable]

RECORDED = Path(__file__).parent / "data" / "temporal_whole_requests.json"
"""A 3-round run of `script(3)` recorded when each model activity got the whole request."""


def agent(rounds: int) -> Agent:
    return Agent(provider=ScriptedProvider(script(rounds)), tools=[read], max_rounds=rounds + 1)


async def test_each_model_activity_gets_what_is_new_and_the_run_ends_as_a_plain_run(
    temporal_address: str,
) -> None:
    rounds = 20
    plain = await agent(rounds).run("Read every page.")
    client = await Client.connect(temporal_address)
    durable = TemporalAgent(agent(rounds), name="pages")
    queue, run_id = f"q-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Read every page.", run_id=run_id, task_queue=queue)
    assert (result.messages, result.usage, result.text) == (plain.messages, plain.usage, plain.text)
    sizes = [
        e.activity_task_scheduled_event_attributes.input.ByteSize()
        async for e in client.get_workflow_handle(run_id).fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_id.startswith("model:")
    ]
    # The last request's conversation is 20 pages of 4 kB; its input holds one of them.
    assert len(sizes) == rounds + 1
    assert max(sizes[1:]) < 8_000 < len(json.dumps(plain.messages)) // 10


async def test_a_continued_workflow_run_builds_its_first_request_on_the_carried_messages(
    temporal_address: str,
) -> None:
    rounds = 16
    plain = await agent(rounds).run("Read every page.")
    client = await Client.connect(temporal_address)
    durable = TemporalAgent(agent(rounds), name="pages", max_history_bytes=60_000)
    queue, run_id = f"q-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Read every page.", run_id=run_id, task_queue=queue)
    assert (result.messages, result.usage, result.text) == (plain.messages, plain.usage, plain.text)
    firsts = []  # the input of each workflow run's first model activity, from the last run
    run: str | None = (await client.get_workflow_handle(run_id).describe()).run_id
    while run:
        events = [
            e async for e in client.get_workflow_handle(run_id, run_id=run).fetch_history_events()
        ]
        scheduled = [
            e.activity_task_scheduled_event_attributes
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        firsts.append(
            next(s.input.ByteSize() for s in scheduled if s.activity_id.startswith("model:"))
        )
        run = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    # Continued runs carry 30 kB or more of messages; their first requests send what is new.
    assert len(firsts) > 2
    assert max(firsts) < 8_000


async def test_a_workflow_recorded_with_whole_requests_replays() -> None:
    history = WorkflowHistory.from_json("recorded-before-deltas", RECORDED.read_text())
    durable = TemporalAgent(agent(3), name="pages")
    replay = await Replayer(workflows=[durable.workflow]).replay_workflow(history)
    assert replay.replay_failure is None


@tool(name="read")
async def dump(number: int) -> str:
    """A 700 kB page."""
    return f"{number:05d} " + "y" * 700_000


async def test_a_result_whose_log_repeats_a_large_conversation_fits_in_the_workflow_result(
    temporal_address: str,
) -> None:
    # 1.4 MB of messages: with the log's outputs beside them, past the 2 MB payload limit.
    def agent() -> Agent:
        return Agent(provider=ScriptedProvider(script(2)), tools=[dump], max_rounds=3)

    plain = await agent().run("Read every page.")
    client = await Client.connect(temporal_address)
    durable = TemporalAgent(agent(), name="dumps")
    queue, run_id = f"q-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(
            client,
            "Read every page.",
            run_id=run_id,
            task_queue=queue,
            # A result too large fails its workflow task again and again: end it instead.
            workflow_options={"execution_timeout": timedelta(seconds=120)},
        )
    assert result.messages == plain.messages
    assert [(c.tool_use_id, c.input, c.output) for c in result.tool_calls] == [
        (c.tool_use_id, c.input, c.output) for c in plain.tool_calls
    ]


def test_a_request_is_sent_as_the_messages_after_those_it_shares_with_the_last() -> None:
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    request = {"model": "m", "messages": first}
    assert request_input(request, None) == {"request": request}
    # A capability moved a cache marker off the last message: it is sent again.
    second = [first[0], {"role": "assistant", "content": "b!"}, {"role": "user", "content": "c"}]
    given = request_input({"model": "m", "messages": second}, ("model:1", first))
    assert given == {
        "delta": {"after": "model:1", "keep": 1, "request": {"model": "m", "messages": second[1:]}}
    }
    assert _next(first, "model:1", given) == second
    # A whole request recorded before (an older workflow run's) is a base like any other.
    assert _next(second, "model:2", {"request": request}) == first


def test_a_delta_that_does_not_build_on_the_request_recorded_before_it_is_refused() -> None:
    given = request_input({"messages": [{"role": "user", "content": "a"}]}, ("model:1", []))
    with pytest.raises(HistoryError, match="builds on 'model:1'"):
        _next([], "model:7", given)
    with pytest.raises(HistoryError):
        _next(None, None, given)
