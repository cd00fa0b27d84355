"""`agentloop.durable.dbos`: runs as DBOS workflows, on SQLite (and Postgres when installed).

DBOS is one instance per process: each test registers its durable agents, launches DBOS
on a fresh system database in its tmp_path and destroys it (and its registry) at the end.
A crash is a real one: a child process (_durable_app.py) killed with SIGKILL in the
middle of a tool call, and a second child recovering the run from the same database.
DBOS runs on asyncio, so these tests do too.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import _durable_app as app
import anyio
import pytest

pytest.importorskip("dbos", reason="dbos is not installed (pip install 'agentloop-runner[dbos]')")

from _dbos import child
from _tool_values import UNSENDABLE, check_recorded, giving
from dbos import DBOS
from pydantic import BaseModel
from structlog.testing import capture_logs

from agentloop import Agent, Approve, RunContext, UsageLimits, tool
from agentloop.durable.dbos import DurableAgent
from agentloop.durable.records import result_from_json
from agentloop.errors import (
    ConfigurationError,
    DecisionError,
    RateLimitError,
    RecoveryLimitExceeded,
    SessionConflict,
    UsageLimitExceeded,
)
from agentloop.events import RunFinished, ToolResultEvent
from agentloop.lint import lint_history
from agentloop.messages import parse_history
from agentloop.result import RunResult
from agentloop.runstate import CANCELLED_MESSAGE
from agentloop.testing import MessagesServer, ScriptedProvider, SteppedProvider, reply, tool_call

pytestmark = pytest.mark.durable


def _log(result: Any) -> list[tuple[Any, ...]]:
    """The tool log without durations (wall-clock time differs between runs)."""
    return [
        (r.round, r.name, r.input, r.tool_use_id, r.is_error, r.output) for r in result.tool_calls
    ]


async def test_a_durable_run_equals_a_plain_run(
    tmp_path: Path, serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    plain_server, durable_server = serve(app.script), serve(app.script)
    durable = DurableAgent(app.make_agent(durable_server))
    launch()
    deps = {"ledger": str(tmp_path / "plain.jsonl")}
    plain = await app.make_agent(plain_server).run("Record a and b.", deps=deps)
    result = await durable.run(
        "Record a and b.", run_id="run-1", deps={"ledger": str(tmp_path / "durable.jsonl")}
    )
    assert result.run_id == "run-1" and result.stop_reason == "end_turn"
    assert result.messages == plain.messages
    assert result.usage == plain.usage and result.rounds == plain.rounds == 2
    assert result.cost == plain.cost and result.text == plain.text == "Both recorded."
    assert _log(result) == _log(plain)
    assert durable_server.model.requests == plain_server.model.requests
    ledger = [json.loads(line) for line in (tmp_path / "durable.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in ledger) == ["run-1:toolu_a", "run-1:toolu_b"]
    steps = await DBOS.list_workflow_steps_async("run-1")
    assert [s["function_name"] for s in steps] == [
        "agentloop.ledger.model",
        "agentloop.ledger.tool",
        "agentloop.ledger.tool",
        "agentloop.ledger.model",
    ]
    # What DBOS records are JSON values: the response and the results, in tool_use order.
    assert [s["output"]["tool_use_id"] for s in steps[1:3]] == ["toolu_a", "toolu_b"]
    assert json.loads(json.dumps([s["output"] for s in steps])) == [s["output"] for s in steps]
    # A replay from the record performs nothing and ends with the same run, durations too.
    replayed = await durable.cancelled_result("run-1")
    assert replayed.messages == result.messages and replayed.usage == result.usage
    assert replayed.tool_calls == result.tool_calls and replayed.rounds == result.rounds
    assert len(durable_server.model.requests) == 2
    assert len((tmp_path / "durable.jsonl").read_text().splitlines()) == 2


async def test_the_same_run_id_attaches_to_the_recorded_run(
    tmp_path: Path, serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    server = serve(app.script)
    durable = DurableAgent(app.make_agent(server))
    launch()
    deps = {"ledger": str(tmp_path / "ledger.jsonl")}
    first = await durable.run("Record a and b.", run_id="again", deps=deps)
    assert len(server.model.requests) == 2
    second = await durable.run("Record a and b.", run_id="again", deps=deps)
    assert second == first
    assert len(server.model.requests) == 2  # no new request: the recorded result
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 2


class Verdict(BaseModel):
    city: str
    warm: bool


async def test_typed_output_and_usage_limits_come_back_whole(
    launch: Callable[[], None],
) -> None:
    provider = ScriptedProvider([reply(output={"city": "Rome", "warm": True})])
    durable = DurableAgent(Agent(provider=provider, name="typed"))
    launch()
    result = await durable.run("Rome?", run_id="typed-1", output_type=Verdict)
    assert result.output == Verdict(city="Rome", warm=True)
    assert result.stop_reason == "end_turn" and result.rounds == 1
    # Attached by id alone, the output comes back as the type the run was started with.
    assert await durable.result("typed-1") == result
    with pytest.raises(ConfigurationError):
        await durable.result("no-such-run")
    with pytest.raises(ConfigurationError):
        await durable.run("Rome?", run_id="typed-2", deps=object())


async def test_inside_a_workflow_of_your_own_the_steps_are_its_steps(
    launch: Callable[[], None],
) -> None:
    keys: list[str] = []

    @tool
    async def note(ctx: RunContext, fact: str) -> str:
        """Note a fact."""
        keys.append(ctx.idempotency_key)
        return "noted"

    call = tool_call("note", {"fact": "x"}, id="toolu_note")
    provider = ScriptedProvider([reply("Noting.", call), reply("Done.")])
    durable = DurableAgent(Agent(provider=provider, tools=[note], name="inner"))

    @DBOS.workflow(name="tests.outer")
    async def outer(prompt: str) -> str:
        result = await durable.run(prompt)
        return f"{result.run_id} {result.text}"

    launch()
    handle = await DBOS.start_workflow_async(outer, "go")
    assert await handle.get_result() == f"{handle.get_workflow_id()} Done."
    assert keys == [f"{handle.get_workflow_id()}:toolu_note"]
    steps = await DBOS.list_workflow_steps_async(handle.get_workflow_id())
    assert [s["function_name"] for s in steps] == [
        "agentloop.inner.model",
        "agentloop.inner.tool",
        "agentloop.inner.model",
    ]


async def test_a_run_killed_mid_tool_is_recovered_with_one_effect_per_key(
    tmp_path: Path, database: str, serve: Callable[..., MessagesServer]
) -> None:
    # B has made its effect and hangs: the process dies before its step is recorded.
    crashed = await child(database, "crash-1", tmp_path, until="EFFECT", DURABLE_HANG="b")
    assert crashed["EFFECT"] == "b"
    recovered = await child(database, "crash-1", tmp_path)
    # The first process sent round 1; the second replays it and sends round 2 only.
    assert recovered["REQUESTS"] == "1"
    result = result_from_json(json.loads(recovered["RESULT"]))

    plain_deps = {"ledger": str(tmp_path / "plain.jsonl")}
    plain = await app.make_agent(serve(app.script)).run("Record a and b.", deps=plain_deps)
    assert result.messages == plain.messages
    assert result.usage == plain.usage and result.rounds == plain.rounds
    assert result.stop_reason == plain.stop_reason == "end_turn"
    assert _log(result) == _log(plain)
    lint_history(parse_history(result.messages))
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in ledger) == ["crash-1:toolu_a", "crash-1:toolu_b"]


async def test_a_recovered_run_counts_a_tool_s_uses_as_the_first_process_did(
    tmp_path: Path, database: str, serve: Callable[..., MessagesServer]
) -> None:
    # `record` may run once: a runs (and the process dies in it), b is refused; the
    # process recovering the run runs a's step again, refuses b again, and hides `record`.
    crashed = await child(
        database, "capped-1", tmp_path, until="EFFECT", DURABLE_HANG="a", DURABLE_MAX_USES="1"
    )
    assert crashed["EFFECT"] == "a"
    recovered = await child(database, "capped-1", tmp_path, DURABLE_MAX_USES="1")
    result = result_from_json(json.loads(recovered["RESULT"]))

    server = serve(app.script)
    plain_deps = {"ledger": str(tmp_path / "plain.jsonl")}
    plain = await app.make_agent(server, max_uses=1).run("Record a and b.", deps=plain_deps)
    assert [t["name"] for t in server.requests[1].get("tools", [])] == []
    assert result.messages == plain.messages and _log(result) == _log(plain)
    assert result.text == plain.text == "Recorded what I could."
    assert [(c.tool_use_id, c.ran) for c in result.tool_calls] == [
        ("toolu_a", True),
        ("toolu_b", False),
    ]
    assert "may be called once per run" in result.tool_calls[1].output
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [e["key"] for e in ledger] == ["capped-1:toolu_a"]


async def test_a_capability_s_effects_inside_steps_are_recorded_and_never_repeated(
    tmp_path: Path, database: str, serve: Callable[..., MessagesServer]
) -> None:
    witness = tmp_path / "witness.jsonl"
    # a's step is recorded (with what the capability made of its result); b has made its
    # effect and hangs inside the capability's call_next: the process dies there.
    crashed = await child(
        database, "cap-1", tmp_path, until="EFFECT", DURABLE_HANG="b", DURABLE_CAPABILITY="1"
    )
    assert crashed["EFFECT"] == "b"
    before = [json.loads(line) for line in witness.read_text().splitlines()]
    assert before == [{"response": 1}, {"result": "toolu_a"}]
    recovered = await child(database, "cap-1", tmp_path, DURABLE_CAPABILITY="1")
    assert recovered["REQUESTS"] == "1"
    # The recovery replays round 1's response and a's result without the capability: its
    # effects there happened once; b's call and round 2 run, through it, once.
    seen = [json.loads(line) for line in witness.read_text().splitlines()]
    assert seen == [*before, {"result": "toolu_b"}, {"response": 2}]
    result = result_from_json(json.loads(recovered["RESULT"]))
    # What the capability made of a's result was recorded with its step: nothing is lost.
    assert [c.output for c in result.tool_calls] == [
        "recorded a (witnessed)",
        "recorded b (witnessed)",
    ]

    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    plain_deps = {"ledger": str(plain_dir / "ledger.jsonl")}
    agent = app.make_agent(serve(app.script), capabilities=[app.Witness(str(plain_dir))])
    plain = await agent.run("Record a and b.", deps=plain_deps)
    assert result.messages == plain.messages and _log(result) == _log(plain)
    assert result.usage == plain.usage
    lint_history(parse_history(result.messages))


async def test_a_run_whose_process_keeps_dying_is_given_up_with_a_typed_error(
    tmp_path: Path, database: str, launch: Callable[[], None]
) -> None:
    # No recovery allowed: the process running the run dies in the middle of b, and the
    # first recovery (here) is refused: DBOS gives up on the run.
    crashed = await child(
        database, "doomed-1", tmp_path, until="EFFECT", DURABLE_HANG="b", DURABLE_MAX_RECOVERY="0"
    )
    assert crashed["EFFECT"] == "b"
    provider = ScriptedProvider(app.script)
    agent = Agent(provider=provider, tools=[app.record], name="ledger")
    durable = DurableAgent(agent, max_recovery_attempts=0)
    launch()
    for attach in (
        lambda: durable.result("doomed-1"),
        lambda: durable.run("Record a and b.", run_id="doomed-1"),
    ):
        with pytest.raises(RecoveryLimitExceeded) as raised:
            await attach()
        error = raised.value
        assert error.run_id == "doomed-1" and error.max_recovery_attempts == 0
        assert "DBOS.resume_workflow('doomed-1')" in str(error)
        assert type(error.__cause__).__module__.startswith("dbos")
        # The run as its recorded steps leave it: the response, b (never recorded) cut short.
        assert error.result is not None and error.result.stop_reason == "error"
        assert error.result == replace(
            await durable.cancelled_result("doomed-1"), stop_reason="error"
        )
        lint_history(parse_history(error.result.messages))
        assert error.result.messages[2]["content"][1]["content"] == CANCELLED_MESSAGE
    assert provider.model.requests == []  # nothing ran again here
    status = await DBOS.get_workflow_status_async("doomed-1")
    assert status is not None and status.status == "MAX_RECOVERY_ATTEMPTS_EXCEEDED"
    # What the error advises, once the cause is gone: the run goes on from its record.
    await DBOS.resume_workflow_async("doomed-1")
    result = await durable.result("doomed-1")
    assert result.stop_reason == "end_turn" and result.text == "Both recorded."
    assert len(provider.model.requests) == 1  # round 2 only: round 1 was recorded


async def test_a_tool_renamed_before_the_recovery_is_answered_unknown_with_a_warning(
    tmp_path: Path, database: str, launch: Callable[[], None]
) -> None:
    crashed = await child(database, "renamed-1", tmp_path, until="EFFECT", DURABLE_HANG="b")
    assert crashed["EFFECT"] == "b"  # the response is recorded; b's step is not

    @tool(name="record_item")
    async def renamed(ctx: RunContext[dict[str, str]], item: str) -> str:
        """Record an item (the app's `record`, under its new name)."""
        return await app.record.function(ctx, item)

    # The process that recovers the run has the tool under another name; another agent of
    # it meets a name the model made up, in a fresh run: that one is not warned about.
    recovering = Agent(provider=ScriptedProvider(app.script), tools=[renamed], name="ledger")
    made_up = reply("Trying.", tool_call("nope", {}, id="toolu_nope"))
    fresh = Agent(provider=ScriptedProvider([made_up, reply("Sorry.")]), name="fresh")
    durable, other = DurableAgent(recovering), DurableAgent(fresh)
    with capture_logs() as logs:
        launch()
        result = await durable.result("renamed-1")
        unknown = await other.run("Go.", run_id="fresh-1")
    # b's step runs again here and finds no tool `record` (a's too, if the crash came
    # before a's step was recorded): each such call is answered, and warned about, once.
    unknown_here = {b["tool_use_id"] for b in result.messages[2]["content"] if b.get("is_error")}
    assert "toolu_b" in unknown_here
    for block in result.messages[2]["content"]:
        if block["tool_use_id"] in unknown_here:
            assert block["content"].startswith("Unknown tool 'record'")
    assert unknown.messages[2]["content"][0]["content"].startswith("Unknown tool 'nope'")
    warnings = [e for e in logs if e["event"] == "durable.unknown_tool"]
    assert {w["log_level"] for w in warnings} == {"warning"}
    assert sorted((w["run_id"], w["tool"], w["tool_use_id"]) for w in warnings) == sorted(
        ("renamed-1", "record", id_) for id_ in unknown_here
    )


@pytest.mark.parametrize("streams", [False, True], ids=["json", "streamed"])
async def test_a_tool_result_over_the_cap_is_recorded_cut_with_a_note(
    launch: Callable[[], None], streams: bool
) -> None:
    @tool
    async def dump() -> str:
        """Dump everything."""
        return "x" * 3_000_000

    def agent(name: str) -> Agent:
        script = [reply("Dumping.", tool_call("dump", {}, id="toolu_1")), reply("Done.")]
        return Agent(provider=ScriptedProvider(script), tools=[dump], name=name)

    capped, whole = (
        DurableAgent(agent("capped")),
        DurableAgent(agent("whole"), max_result_bytes=None),
    )
    launch()
    events: list[Any] = []
    if streams:
        async with capped.run_stream("Go.", run_id="big-1") as stream:
            events = [e async for e in stream]
        assert stream.result is not None
        result = stream.result
    else:
        result = await capped.run("Go.", run_id="big-1")
    content = result.messages[2]["content"][0]["content"]
    assert len(content.encode()) <= 1_000_000 and content.startswith("x" * 990_000)
    assert content.endswith("Ask for less (a page, a filter) to see more.]")
    assert "3,000,000 bytes" in content and not result.messages[2]["content"][0].get("is_error")
    assert result.tool_calls[0].output == content
    steps = await DBOS.list_workflow_steps_async("big-1")
    assert [s["output"]["content"] for s in steps if s["function_name"].endswith(".tool")] == [
        content
    ]
    if streams:
        (done,) = [e for e in events if isinstance(e, ToolResultEvent)]
        assert done.output == content
    kept = await whole.run("Go.", run_id="big-2")
    assert kept.messages[2]["content"][0]["content"] == "x" * 3_000_000
    for wrong in (0, -1, 1.5, "1MB"):
        with pytest.raises(ConfigurationError, match="max_result_bytes"):
            DurableAgent(agent("wrong"), max_result_bytes=wrong)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_recovery_attempts"):
        DurableAgent(agent("wrong"), max_recovery_attempts=-1)


async def test_a_run_waits_for_external_results_across_a_restart(
    tmp_path: Path, database: str, launch: Callable[[], None]
) -> None:
    crashed = await child(database, "wait-1", tmp_path, until="WAITING", DURABLE_WAIT="1")
    assert "WAITING" in crashed
    # DBOS recovers the run on an event loop of its own: an in-process model, so that no
    # HTTP connection outlives the test on that loop.
    server = ScriptedProvider(app.script)
    durable = DurableAgent(Agent(provider=server, tools=[app.record], name="ledger"))
    launch()  # recovers the waiting run in this process: it waits again
    waiting = await durable.waiting("wait-1", wait_seconds=30)
    assert waiting is not None and waiting.stop_reason == "tool_use"
    assert [p["id"] for p in waiting.pending] == ["toolu_ask"]
    with pytest.raises(DecisionError):
        await durable.send_results("wait-1", {"toolu_other": "blue"})
    with pytest.raises(DecisionError):
        await durable.send_results("wait-1", {})
    await durable.send_results("wait-1", {"toolu_ask": "blue"})
    result = await durable.run(run_id="wait-1")
    assert result.stop_reason == "end_turn" and result.text == "Both recorded."
    answer = result.messages[2]["content"]
    assert [(b["tool_use_id"], b["content"]) for b in answer] == [
        ("toolu_a", "recorded a"),
        ("toolu_b", "recorded b"),
        ("toolu_ask", "blue"),
    ]
    assert len(server.model.requests) == 1  # round 1 was recorded by the first process
    assert result.rounds == 2 and result.usage.requests == 2
    lint_history(parse_history(result.messages))
    assert await durable.waiting("wait-1") is None


async def test_a_wait_that_times_out_ends_the_run_paused(
    tmp_path: Path, serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    server = serve(app.script)
    durable = DurableAgent(app.make_agent(server))
    launch()
    result = await durable.run(
        "Record a and b.",
        run_id="timeout-1",
        deps={"ledger": str(tmp_path / "ledger.jsonl")},
        external_tools=[app.EXTERNAL],
        wait_for_external=timedelta(seconds=0.2),
    )
    assert result.stop_reason == "tool_use" and result.state is not None
    assert [p["id"] for p in result.pending] == ["toolu_ask"]
    # The state resumes the run as any paused run's does.
    resumed = await app.make_agent(server).resume(
        result.state, results={"toolu_ask": "red"}, deps={"ledger": str(tmp_path / "ledger.jsonl")}
    )
    assert resumed.stop_reason == "end_turn" and resumed.run_id == "timeout-1"


class Barrier:
    """The calls of `gated` hold here: each says it has started, then waits to be let go."""

    def __init__(self, *items: str) -> None:
        self.started = {item: anyio.Event() for item in items}
        self.done: list[str] = []
        self.release = anyio.Event()

    async def all_started(self) -> None:
        for event in self.started.values():
            await event.wait()


def gated(barrier: Barrier, effects: list[str]) -> Any:
    """A tool that makes its effect, then holds at `barrier` (items not in it run through)."""

    @tool
    async def charge(item: str) -> str:
        """Charge an item."""
        effects.append(item)
        if item in barrier.started:
            barrier.started[item].set()
            await barrier.release.wait()
        return f"charged {item}"

    return charge


async def _run_and_cancel(
    durable: DurableAgent[Any],
    run_id: str,
    started: Callable[[], Any],
    release: anyio.Event,
    events: list[Any] | None = None,
) -> RunResult[Any]:
    """Run `run_id`; once `started()` returns, cancel it with `durable.cancel`, then `release`.

    With `events`, the run is streamed and its events go there.
    """
    results: list[Any] = []

    async def run() -> None:
        if events is None:
            results.append(await durable.run("Go.", run_id=run_id))
            return
        async with durable.run_stream("Go.", run_id=run_id) as stream:
            events.extend([e async for e in stream])
        results.append(stream.result)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await started()
            await durable.cancel(run_id)
            release.set()
    (result,) = results
    return result  # type: ignore[no-any-return]


async def test_cancel_keeps_the_real_results_of_the_calls_under_way(
    launch: Callable[[], None],
) -> None:
    # Both calls have made their effect when the run is cancelled, and end after it.
    barrier, effects = Barrier("a", "b"), []
    calls = [tool_call("charge", {"item": i}, id=f"toolu_{i}") for i in "ab"]
    provider = ScriptedProvider([reply("Both.", *calls), reply("Done.")])
    agent = Agent(provider=provider, tools=[gated(barrier, effects)], name="cancel")
    durable = DurableAgent(agent)
    launch()
    result = await _run_and_cancel(durable, "cancel-1", barrier.all_started, barrier.release)
    assert result.stop_reason == "cancelled" and result.run_id == "cancel-1"
    lint_history(parse_history(result.messages))
    answers = [(b["tool_use_id"], b["content"]) for b in result.messages[2]["content"]]
    assert answers == [("toolu_a", "charged a"), ("toolu_b", "charged b")]
    assert [(r.tool_use_id, r.is_error) for r in result.tool_calls] == [
        ("toolu_a", False),
        ("toolu_b", False),
    ]
    assert sorted(effects) == ["a", "b"]
    assert result.rounds == 1 and len(provider.model.requests) == 1  # no request after it
    assert await durable.result("cancel-1") == result  # the workflow's recorded result
    assert await durable.cancelled_result("cancel-1") == result  # and its steps say the same


@pytest.mark.parametrize("streams", [False, True], ids=["json", "streamed"])
async def test_cancel_answers_the_calls_not_started_without_running_them(
    launch: Callable[[], None], streams: bool
) -> None:
    # The model is answering when the run is cancelled: its calls must not run.
    asked, answer = anyio.Event(), anyio.Event()

    async def hold(number: int, event: Any) -> None:
        if number == 1:
            asked.set()
            await answer.wait()

    effects: list[str] = []
    calls = [tool_call("charge", {"item": i}, id=f"toolu_{i}") for i in "ab"]
    provider = SteppedProvider([reply("Both.", *calls), reply("Done.")], hook=hold)
    agent = Agent(provider=provider, tools=[gated(Barrier(), effects)], name="unstarted")
    durable = DurableAgent(agent)
    launch()
    events: list[Any] | None = [] if streams else None
    result = await _run_and_cancel(durable, "cancel-2", asked.wait, answer, events)
    assert result.stop_reason == "cancelled" and effects == []
    lint_history(parse_history(result.messages))
    answers = [(b["tool_use_id"], b["content"]) for b in result.messages[2]["content"]]
    assert answers == [("toolu_a", CANCELLED_MESSAGE), ("toolu_b", CANCELLED_MESSAGE)]
    assert result.rounds == 1 and len(provider.model.requests) == 1
    assert await durable.cancelled_result("cancel-2") == result
    if events is not None:  # the stream says it too, and ends with the run's result
        # (each call's step publishes its own: in the order the steps get to it)
        done = [(e.tool_use_id, e.output) for e in events if isinstance(e, ToolResultEvent)]
        assert sorted(done) == [("toolu_a", CANCELLED_MESSAGE), ("toolu_b", CANCELLED_MESSAGE)]
        assert isinstance(events[-1], RunFinished) and events[-1].result == result


async def test_dbos_cancel_workflow_answers_the_unrecorded_calls_as_cancelled(
    launch: Callable[[], None],
) -> None:
    # DBOS's own cancellation stops the workflow at once: it records no step after it,
    # so b (which ends after it) is answered as cancelled; a was recorded a round before.
    barrier, effects = Barrier("b"), []
    provider = ScriptedProvider(
        [
            reply("A first.", tool_call("charge", {"item": "a"}, id="toolu_a")),
            reply("Then b.", tool_call("charge", {"item": "b"}, id="toolu_b")),
            reply("Done."),
        ]
    )
    durable = DurableAgent(Agent(provider=provider, tools=[gated(barrier, effects)], name="dbc"))
    launch()
    results: list[Any] = []

    async def run() -> None:
        results.append(await durable.run("Go.", run_id="cancel-3"))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await barrier.all_started()
            await DBOS.cancel_workflow_async("cancel-3")
            barrier.release.set()
    (result,) = results
    assert result.stop_reason == "cancelled" and result.run_id == "cancel-3"
    lint_history(parse_history(result.messages))
    answers = [
        (b["tool_use_id"], b["content"]) for m in result.messages[2::2] for b in m["content"]
    ]
    assert answers == [("toolu_a", "charged a"), ("toolu_b", CANCELLED_MESSAGE)]
    assert effects == ["a", "b"] and result.rounds == 2  # round 3 was never sent
    assert await durable.cancelled_result("cancel-3") == result


async def test_cancel_stops_a_run_waiting_for_answers(
    tmp_path: Path, serve: Callable[..., MessagesServer], launch: Callable[[], None]
) -> None:
    server = serve(app.script)
    durable = DurableAgent(app.make_agent(server))
    launch()
    results: list[Any] = []

    async def run() -> None:
        results.append(
            await durable.run(
                "Record a and b.",
                run_id="cancel-4",
                deps={"ledger": str(tmp_path / "ledger.jsonl")},
                external_tools=[app.EXTERNAL],
                wait_for_external=timedelta(hours=1),
            )
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            assert await durable.waiting("cancel-4", wait_seconds=20) is not None
            await durable.cancel("cancel-4")
    (result,) = results
    assert result.stop_reason == "cancelled" and result.state is not None
    assert [p["id"] for p in result.pending] == ["toolu_ask"]
    assert await durable.waiting("cancel-4") is None
    for missing in ("no-such-run", ""):  # "" too: not this process's current run
        with pytest.raises(ConfigurationError, match="there is no run"):
            await durable.cancel(missing)


@pytest.mark.parametrize("run_id", ["", " \t", 42])
async def test_a_run_id_that_names_no_workflow_is_refused_before_anything_starts(
    serve: Callable[..., MessagesServer], launch: Callable[[], None], run_id: Any
) -> None:
    server = serve(app.script)
    durable = DurableAgent(app.make_agent(server))
    launch()
    with pytest.raises(ConfigurationError, match="run_id must be a string that is not blank"):
        await durable.run("Record a.", run_id=run_id)
    with pytest.raises(ConfigurationError, match="run_id must be a string that is not blank"):
        async with durable.run_stream("Record a.", run_id=run_id):
            pytest.fail("a stream of a run with no id")
    assert await DBOS.list_workflows_async() == [] and server.recorded == []


async def test_a_run_waiting_for_approval_goes_on_with_the_decisions(
    launch: Callable[[], None],
) -> None:
    ran: list[int] = []

    @tool(requires_approval=lambda ctx, input: input["amount"] > 100)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        ran.append(amount)
        return f"refunded {amount} on {order}"

    small = tool_call("refund", {"order": "A1", "amount": 20}, id="toolu_small")
    big = tool_call("refund", {"order": "B2", "amount": 500}, id="toolu_big")
    provider = ScriptedProvider([reply(small, big), reply("Refunded both.")])
    durable = DurableAgent(Agent(provider=provider, tools=[refund], name="refunds"))
    launch()
    results: list[Any] = []

    async def run() -> None:
        results.append(
            await durable.run(
                "Refund A1 and B2", run_id="refund-1", wait_for_external=timedelta(seconds=60)
            )
        )

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            waiting = await durable.waiting("refund-1", wait_seconds=30)
            assert waiting is not None and waiting.stop_reason == "approval_required"
            assert [a.tool_use_id for a in waiting.approvals] == ["toolu_big"]
            with pytest.raises(DecisionError):  # an answer of the wrong kind
                await durable.send_results("refund-1", {"toolu_big": "done"})
            await durable.send_results("refund-1", decisions={"toolu_big": Approve()})
    (result,) = results
    assert result.stop_reason == "end_turn" and result.text == "Refunded both."
    assert ran == [20, 500]
    assert [(r.tool_use_id, r.output) for r in result.tool_calls] == [
        ("toolu_small", "refunded 20 on A1"),
        ("toolu_big", "refunded 500 on B2"),
    ]


async def test_an_approval_inside_a_sub_agent_is_waited_for_and_goes_on_in_the_sub_run(
    launch: Callable[[], None],
) -> None:
    ran: list[str] = []

    @tool(requires_approval=True)
    def refund(ctx: RunContext, order: str) -> str:
        """Refund an order."""
        ran.append(ctx.idempotency_key)
        return f"refunded {order}"

    asked = tool_call("billing", {"prompt": "Refund B2"}, id="toolu_ask")
    big = tool_call("refund", {"order": "B2"}, id="toolu_big")
    billing = Agent(
        provider=ScriptedProvider([reply(big), reply("Refunded B2.")]),
        tools=[refund],
        name="billing",
    )
    parent = Agent(
        provider=ScriptedProvider([reply(asked), reply("Done.")]),
        tools=[billing.as_tool()],
        name="boss",
    )
    durable = DurableAgent(parent)
    launch()
    results: list[Any] = []

    async def run() -> None:
        wait = timedelta(seconds=60)
        results.append(await durable.run("Refund B2", run_id="boss-1", wait_for_external=wait))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            waiting = await durable.waiting("boss-1", wait_seconds=30)
            assert waiting is not None and waiting.stop_reason == "approval_required"
            [approval] = waiting.approvals
            assert (approval.tool_use_id, approval.via) == (
                "toolu_big",
                (("billing", "toolu_ask"),),
            )
            await durable.send_results("boss-1", decisions={"toolu_big": Approve()})
    (result,) = results
    assert result.stop_reason == "end_turn" and result.text == "Done."
    assert ran == ["boss-1:toolu_ask:toolu_big"]
    assert [(r.tool_use_id, r.output) for r in result.tool_calls] == [("toolu_ask", "Refunded B2.")]
    assert result.usage.requests == 4


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
async def test_a_run_s_error_is_recorded_and_raised_to_whoever_attaches(
    launch: Callable[[], None],
) -> None:
    call = tool_call("note", {"fact": "x"}, id="toolu_1")

    @tool
    def note(fact: str) -> str:
        """Note a fact."""
        return "noted"

    provider = ScriptedProvider([reply("Noting.", call), reply("More.", call)])
    agent = Agent(provider=provider, tools=[note], name="limited")
    durable = DurableAgent(agent)
    launch()
    limits = UsageLimits(requests=1)
    with pytest.raises(UsageLimitExceeded) as first:
        await durable.run("Note it.", run_id="limited-1", usage_limits=limits)
    assert first.value.result is not None and first.value.result.rounds == 1
    with pytest.raises(UsageLimitExceeded) as again:
        await durable.result("limited-1")
    assert again.value.result is not None
    assert again.value.result.messages == first.value.result.messages
    assert len(provider.model.requests) == 1


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(
            UsageLimitExceeded(
                "over",
                limit="requests",
                bound=1,
                value=2,
                sent=False,
                result=RunResult("t", "usage_limit", []),
            ),
            id="usage-limit",
        ),
        pytest.param(
            RateLimitError("429", status_code=429, headers={"retry-after": "2"}), id="rate-limit"
        ),
        pytest.param(
            SessionConflict("changed", session_id="s", expected=1, actual=2), id="session-conflict"
        ),
    ],
)
def test_errors_a_workflow_records_are_read_back_whole(error: Exception) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert vars(again) == vars(error)


async def test_parallel_calls_are_steps_in_tool_use_order_whatever_finishes_first(
    launch: Callable[[], None],
) -> None:
    second_done = anyio.Event()

    @tool
    async def step(item: str) -> str:
        """Finish in reverse order."""
        if item == "first":
            await second_done.wait()
        else:
            second_done.set()
        return f"done {item}"

    calls = [tool_call("step", {"item": i}, id=f"toolu_{i}") for i in ("first", "second")]
    provider = ScriptedProvider([reply("Both.", *calls), reply("Done.")])
    durable = DurableAgent(Agent(provider=provider, tools=[step], name="order"))
    launch()
    with anyio.fail_after(30):
        result = await durable.run("Go.", run_id="order-1")
    steps = await DBOS.list_workflow_steps_async("order-1")
    assert [
        s["output"]["tool_use_id"] for s in steps if s["function_name"] == "agentloop.order.tool"
    ] == [
        "toolu_first",
        "toolu_second",
    ]
    finished = [s["completed_at_epoch_ms"] for s in steps[1:3]]
    assert finished[0] >= finished[1]  # the first call's step was recorded last
    replayed = await durable.cancelled_result("order-1")
    assert replayed.messages == result.messages and replayed.tool_calls == result.tool_calls


@UNSENDABLE
async def test_a_tool_value_that_cannot_be_sent_is_recorded_as_a_result_not_a_failed_run(
    launch: Callable[[], None], value: Any, error: bool, says: str
) -> None:
    give, model = giving(value)
    durable = DurableAgent(Agent(provider=model, tools=[give], name="giver"))
    launch()
    result = await durable.run("Go.", run_id="give-1")
    check_recorded(result, error, says)
    status = await DBOS.get_workflow_status_async("give-1")
    assert status is not None and status.status == "SUCCESS"
