"""Batch runs: each round of many runs goes as one message batch to the local Messages API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentloop import Agent, ConfigurationError, OpenAIChatProvider, lint_history, tool
from agentloop.batches import BatchStore
from agentloop.errors import BatchRequestError, OverloadedError
from agentloop.messages import parse_history
from agentloop.pricing import cost_of
from agentloop.result import RunResult, Usage
from agentloop.testing import ChatCompletionsServer, Fault, MessagesServer, reply, tool_call

USAGE = {"input_tokens": 1_000, "output_tokens": 100}
CREATE = "/v1/messages/batches"


class Adder:
    """A tool that counts the calls it ran; it may hook a test in at each call."""

    def __init__(self, on_call: Callable[[], None] = lambda: None) -> None:
        self.calls = 0

        @tool
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            self.calls += 1
            on_call()
            return a + b

        self.tool = add


def answer(body: dict[str, Any]) -> Any:
    """One round for a prompt of "quick", a call of `add` then an answer for the others."""
    messages = body["messages"]
    last = messages[-1]["content"]
    if isinstance(last, list) and last and last[0].get("type") == "tool_result":
        return reply(f"sum {last[0]['content']}", usage=USAGE)
    prompt = str(messages[0]["content"])
    if "quick" in prompt:
        return reply("quick answer", usage=USAGE)
    if "broken" in prompt:
        return Fault.overloaded()
    return reply(tool_call("add", {"a": 2, "b": 3}), usage=USAGE)


def batch_sizes(server: MessagesServer) -> list[int]:
    return [len(r.body["requests"]) for r in server.recorded if r.path == CREATE]


def polled(server: MessagesServer, batch_id: str) -> bool:
    """Whether the job asked for the batch's status: it knows (and has stored) its id."""
    return any(r.path == f"{CREATE}/{batch_id}" for r in server.recorded)


async def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait until `condition()` holds, failing after `seconds`.

    What is waited for is the server thread's record of a request: there is no event to
    wait on, so the condition is looked at every few milliseconds.
    """
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (see above)
            await anyio.sleep(0.005)


async def test_each_round_of_the_live_runs_goes_as_one_batch() -> None:
    adder = Adder()
    async with MessagesServer(answer, batch_delay=0.05) as server:
        agent = Agent(client=server.client(), tools=[adder.tool], system="Be brief.")
        outcomes = await agent.run_batch(["one", "quick", "two"], poll_interval=0.01)
        plain = await agent.run("one")
    assert [o.text for o in outcomes if isinstance(o, RunResult)] == [
        "sum 5",
        "quick answer",
        "sum 5",
    ]
    assert batch_sizes(server) == [3, 2]  # the quick run ended after the first round
    assert adder.calls == 2 + 1  # run here, once per call (the plain run's too)
    batched = [r for r in server.recorded if r.path == "/v1/messages"]
    assert len(batched) == 2  # only the plain run's requests went one by one
    first = server.recorded[0].body["requests"][0]
    assert first["custom_id"] == "run-0-round-1" and first["params"]["system"]
    for outcome in outcomes:
        assert isinstance(outcome, RunResult)
        lint_history(parse_history(outcome.messages))  # raises on a broken history
    one = outcomes[0]
    assert isinstance(one, RunResult)
    assert one.usage.batch_requests == one.usage.requests == 2
    assert one.usage.input_tokens == plain.usage.input_tokens
    assert one.cost is not None and plain.cost is not None
    assert one.cost == pytest.approx(plain.cost / 2)


async def test_a_pending_batch_is_picked_up_again_after_a_restart(tmp_path: Path) -> None:
    server = MessagesServer(answer)

    def hold_next_batches() -> None:
        server.batches.delay = 3600.0  # the second round's batch stays pending

    adder = Adder(hold_next_batches)
    async with server:
        agent = Agent(client=server.client(), tools=[adder.tool])
        store = BatchStore(tmp_path / "jobs.db")
        with anyio.CancelScope() as crash:

            async def crash_once_sent_again() -> None:
                await wait_for(lambda: polled(server, "msgbatch_0002"))
                crash.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(crash_once_sent_again)
                await agent.run_batch(["one", "two"], job="j", store=store, poll_interval=0.01)
        assert crash.cancelled_caught
        store.close()
        pending = server.batches.batches["msgbatch_0002"]
        assert pending.cancelled is None  # a durable job leaves its batch to be picked up
        server.batches.finish()
        again = BatchStore(tmp_path / "jobs.db")
        outcomes = await agent.run_batch(["one", "two"], job="j", store=again, poll_interval=0.01)
        again.close()
    assert batch_sizes(server) == [2, 2]  # nothing was sent again
    assert adder.calls == 2  # the recorded calls were not run again
    for outcome in outcomes:
        assert isinstance(outcome, RunResult)
        assert outcome.text == "sum 5" and outcome.rounds == 2
        assert outcome.usage.requests == outcome.usage.batch_requests == 2
        assert [c.output for c in outcome.tool_calls] == ["5"]


async def test_a_failed_request_ends_only_its_run() -> None:
    async with MessagesServer(answer) as server:
        agent = Agent(client=server.client(), tools=[Adder().tool])
        outcomes = await agent.run_batch(["broken", "quick"], poll_interval=0.01)
    broken, quick = outcomes
    assert isinstance(broken, OverloadedError)
    assert broken.result is not None
    lint_history(parse_history(broken.result.messages))
    assert isinstance(quick, RunResult) and quick.text == "quick answer"


async def test_a_job_nothing_picks_up_again_cancels_its_batch_when_stopped() -> None:
    async with MessagesServer(answer, batch_delay=3600.0) as server:
        agent = Agent(client=server.client(), tools=[Adder().tool])
        with anyio.CancelScope() as scope:

            async def stop_once_sent() -> None:
                await wait_for(lambda: polled(server, "msgbatch_0001"))
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(stop_once_sent)
                await agent.run_batch(["one"], poll_interval=0.01)
        await wait_for(lambda: server.batches.batches["msgbatch_0001"].cancelled is not None)


async def test_a_canceled_request_is_a_typed_error() -> None:
    async with MessagesServer(answer, batch_delay=3600.0) as server:
        agent = Agent(client=server.client(), tools=[Adder().tool])
        client = server.client()

        async def cancel_once_sent() -> None:
            await wait_for(lambda: bool(server.batches.batches))
            await client.messages.batches.cancel("msgbatch_0001")

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_once_sent)
            [outcome] = await agent.run_batch(["one"], poll_interval=0.01)
    assert isinstance(outcome, BatchRequestError) and "canceled" in str(outcome)


async def test_what_run_batch_refuses(
    serve_chat: Callable[..., ChatCompletionsServer],
) -> None:
    chat = serve_chat([])
    with pytest.raises(ConfigurationError, match="Anthropic provider"):
        await Agent(provider=OpenAIChatProvider(chat.client())).run_batch(["hi"])
    async with MessagesServer([]) as server:
        agent = Agent(client=server.client())
        with pytest.raises(ConfigurationError, match="stream"):
            await agent.run_batch(["hi"], stream=True)
        with pytest.raises(ConfigurationError, match="poll_interval"):
            await agent.run_batch(["hi"], poll_interval=0)
    assert server.recorded == []


async def test_the_server_serves_the_batches_api() -> None:
    params = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    async with MessagesServer([reply("a"), Fault.overloaded()], batch_delay=3600.0) as server:
        client = server.client()
        requests: Any = [{"custom_id": f"r{i}", "params": params} for i in range(2)]
        made = await client.messages.batches.create(requests=requests)
        assert made.processing_status == "in_progress" and made.request_counts.processing == 2
        server.batches.finish()
        ended = await client.messages.batches.retrieve(made.id)
        assert ended.processing_status == "ended" and ended.request_counts.succeeded == 1
        lines = {
            r.custom_id: r.result async for r in await client.messages.batches.results(made.id)
        }
        assert lines["r0"].type == "succeeded" and lines["r1"].type == "errored"
        assert lines["r0"].message.usage.service_tier == "batch"  # type: ignore[union-attr]
        other = await client.messages.batches.create(requests=requests[:1])
        cancelled = await client.messages.batches.cancel(other.id)
        assert cancelled.processing_status == "ended"
        assert cancelled.request_counts.canceled == 1
        results = [r.result.type async for r in await client.messages.batches.results(other.id)]
        assert results == ["canceled"]


def test_batched_usage_is_priced_at_the_batch_rate() -> None:
    model = "claude-sonnet-5-5"
    standard = cost_of(model, Usage(input_tokens=1_000_000, output_tokens=1_000, requests=1))
    batched = cost_of(
        model, Usage(input_tokens=1_000_000, output_tokens=1_000, requests=1, batch_requests=1)
    )
    assert standard is not None and batched == pytest.approx(standard / 2)
    mixed = Usage(input_tokens=10, output_tokens=1, requests=2, batch_requests=1)
    assert cost_of(model, mixed) is None
    assert Usage.from_wire({"input_tokens": 3, "service_tier": "batch"}).batch_requests == 1
