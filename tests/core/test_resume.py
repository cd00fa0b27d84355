"""Resuming a paused run from its JSON state: decisions, external results, bad answers.

Every run talks to `MessagesServer` through the real SDK. A resumed run is driven by a
fresh `Agent`, as a service's other replica would (a fresh process resumes one such run
in test_subagent_resume.py, together with a team's).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from _approval import CLIENT_TOOL, forged, make_agent, ran
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import (
    Agent,
    Approve,
    Deny,
    RunFinished,
    RunResult,
    ToolCallReady,
    ToolError,
    ToolResultEvent,
    lint_history,
    tool,
)
from agentloop.errors import (
    ConfigurationError,
    DecisionError,
    InvalidStateError,
    ResumeError,
    StateVersionError,
    TamperedStateError,
)
from agentloop.messages import parse_history
from agentloop.runstate import CANCELLED_MESSAGE
from agentloop.state import STATE_VERSION
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

FORMATS = [pytest.param(False, id="json"), pytest.param(True, id="sse")]


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def as_stored(state: Any) -> Any:
    """The state as it comes back from a store: through JSON text."""
    return json.loads(json.dumps(state))


def sent_results(server: MessagesServer, request: int = -1) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message of a request the server got."""
    return list(server.requests[request]["messages"][-1]["content"])


def check_paused(result: RunResult) -> None:
    """A paused run's history is valid once the waiting calls are answered: its results
    plus one answer per waiting call, in the model's order, pass the linter."""
    assert result.state is not None
    finished = {b["tool_use_id"]: b for b in result.state["finished"]}
    answers = [
        finished.get(use["id"]) or {"type": "tool_result", "tool_use_id": use["id"]}
        for use in result.messages[-1]["content"]
        if use["type"] == "tool_use"
    ]
    lint_history(parse_history([*result.messages, {"role": "user", "content": answers}]))
    lint_history(parse_history(result.messages[:-1]))


@pytest.mark.parametrize("stream", FORMATS)
async def test_approving_gives_the_run_that_never_stopped(
    serve: Callable[..., MessagesServer], stream: bool
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    small = tool_call("refund", {"order": "A1", "amount": 20})
    script = [
        reply("Refunding.", small, big, usage={"input_tokens": 10, "output_tokens": 5}),
        reply(tool_call("lookup", {"order": "B2"}), usage={"input_tokens": 20, "output_tokens": 3}),
        reply("All refunded.", usage={"input_tokens": 30, "output_tokens": 2}),
    ]
    # The same script, with nobody asked: the run an approval must reproduce.
    plain = serve(copy.deepcopy(script))
    never = await make_agent(plain.client(), stream=stream, asks=False).run("Refund", deps="d")
    never_ran = list(ran)
    ran.clear()

    server = serve(script)
    paused = await make_agent(server.client(), stream=stream).run("Refund", deps="d")
    assert paused.stop_reason == "approval_required"
    check_paused(paused)

    final = await make_agent(server.client(), stream=stream).resume(
        as_stored(paused.state), decisions={big["id"]: Approve()}, deps="d"
    )
    assert final.stop_reason == "end_turn" and final.text == "All refunded."
    assert final.messages == never.messages
    assert final.run_id == paused.run_id and final.rounds == 3
    assert final.usage == never.usage and final.usage.input_tokens == 60
    assert [(r.round, r.name, r.tool_use_id, r.is_error, r.output) for r in final.tool_calls] == [
        (r.round, r.name, r.tool_use_id, r.is_error, r.output) for r in never.tool_calls
    ]
    assert [r.tool_use_id for r in final.tool_calls[:2]] == [small["id"], big["id"]]
    assert sorted(ran, key=str) == sorted(never_ran, key=str)  # the same calls, once each
    # The model got the turn's results in its own order, in one user message.
    assert [b["tool_use_id"] for b in sent_results(server, 1)] == [small["id"], big["id"]]
    lint_history(parse_history(final.messages))


async def test_a_denied_call_is_answered_as_an_error_the_model_can_act_on(
    serve: Callable[..., MessagesServer],
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big), reply("I could not refund B2.")])
    paused = await make_agent(server.client()).run("Refund B2")
    final = await make_agent(server.client()).resume(
        as_stored(paused.state), decisions={big["id"]: Deny("over the monthly budget")}
    )
    assert ran == [] and final.text == "I could not refund B2."
    assert sent_results(server) == [
        {
            "type": "tool_result",
            "tool_use_id": big["id"],
            "content": "Denied: over the monthly budget",
            "is_error": True,
        }
    ]
    assert final.tool_calls[-1].is_error and final.tool_calls[-1].tool_use_id == big["id"]
    lint_history(parse_history(final.messages))


async def test_an_edited_input_is_run_and_the_model_told(
    serve: Callable[..., MessagesServer],
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big), reply("Refunded 90.")])
    paused = await make_agent(server.client()).run("Refund B2")
    final = await make_agent(server.client()).resume(
        as_stored(paused.state), decisions={big["id"]: Approve(input={"order": "B2", "amount": 90})}
    )
    assert ran == [("refund", {"order": "B2", "amount": 90})]
    [result] = sent_results(server)
    assert result["content"] == (
        'Note: before this call ran, a person approved it with edited input: {"order": "B2", '
        '"amount": 90}\nrefunded 90 on B2'
    )
    # The model's own call stays as it sent it; the log shows what ran.
    assert final.messages[1]["content"][0]["input"] == {"order": "B2", "amount": 500}
    assert final.tool_calls[-1].input == {"order": "B2", "amount": 90}


@pytest.mark.parametrize("stream", FORMATS)
async def test_a_mixed_turn_is_answered_in_the_models_order(
    serve: Callable[..., MessagesServer], stream: bool
) -> None:
    mine = tool_call("lookup", {"order": "B2"})
    big = tool_call("refund", {"order": "B2", "amount": 500})
    theirs = tool_call("client_search", {"q": "B2"})
    server = serve([reply(mine, big, theirs), reply("Done.")])
    paused = await make_agent(server.client(), stream=stream).run(
        "B2", external_tools=[CLIENT_TOOL]
    )
    assert paused.stop_reason == "approval_required" and paused.pending == [theirs]
    check_paused(paused)
    final = await make_agent(server.client(), stream=stream).resume(
        as_stored(paused.state),
        decisions={big["id"]: Approve()},
        results={theirs["id"]: "3 files mention B2"},
    )
    assert final.stop_reason == "end_turn"
    assert sent_results(server) == [
        {"type": "tool_result", "tool_use_id": mine["id"], "content": "order B2: shipped"},
        {"type": "tool_result", "tool_use_id": big["id"], "content": "refunded 500 on B2"},
        {"type": "tool_result", "tool_use_id": theirs["id"], "content": "3 files mention B2"},
    ]
    # The external tool is still announced after resuming.
    assert [t["name"] for t in server.requests[-1]["tools"]][-1] == "client_search"
    assert ran == [("lookup", {"order": "B2"}), ("refund", {"order": "B2", "amount": 500})]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(ToolError("no such folder"), ("no such folder", True), id="tool-error"),
        pytest.param({"hits": 3}, ('{"hits":3}', False), id="json-value"),
        pytest.param(
            {"type": "tool_result", "tool_use_id": "ID", "content": "x", "is_error": True},
            ("x", True),
            id="tool-result-block",
        ),
    ],
)
async def test_external_results_take_the_forms_a_tool_returns(
    serve: Callable[..., MessagesServer], given: Any, expected: tuple[str, bool]
) -> None:
    theirs = tool_call("client_search", {"q": "B2"})
    server = serve([reply(theirs), reply("ok")])
    paused = await make_agent(server.client()).run("B2", external_tools=[CLIENT_TOOL])
    assert paused.stop_reason == "tool_use" and paused.approvals == []
    if isinstance(given, dict) and given.get("tool_use_id") == "ID":
        given = {**given, "tool_use_id": theirs["id"]}
    await make_agent(server.client()).resume(paused.state, results={theirs["id"]: given})
    [sent] = sent_results(server)
    assert (sent["content"], sent.get("is_error", False)) == expected


@pytest.mark.parametrize("stream", FORMATS)
async def test_resume_stream_reports_the_answered_calls_then_the_loop(
    serve: Callable[..., MessagesServer], stream: bool
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big), reply("Refunded.")])
    paused = await make_agent(server.client(), stream=stream).run("Refund B2")
    agent = make_agent(server.client(), stream=stream)
    async with agent.resume_stream(
        as_stored(paused.state), decisions={big["id"]: Approve()}
    ) as events:
        seen = [e async for e in events]
    kinds = [type(e).__name__ for e in seen]
    assert kinds[:3] == ["RunStarted", "ToolCallReady", "ToolResultEvent"]
    assert seen[1] == ToolCallReady(1, big["id"], "refund", {"order": "B2", "amount": 500}, False)
    assert isinstance(seen[2], ToolResultEvent) and seen[2].output == "refunded 500 on B2"
    assert "RequestStarted" in kinds[3:] and isinstance(seen[-1], RunFinished)
    assert seen[-1].result.text == "Refunded." and events.result is seen[-1].result


async def test_a_run_paused_twice_resumes_twice(serve: Callable[..., MessagesServer]) -> None:
    first = tool_call("refund", {"order": "B2", "amount": 500})
    second = tool_call("delete_user", {"user": "root"})
    server = serve([reply(first), reply(second), reply("Done.")])
    result = await make_agent(server.client()).run("Go")
    seen = []
    while result.stop_reason == "approval_required":
        check_paused(result)
        seen.append(result.approvals[0].name)
        decisions = {a.tool_use_id: Approve() for a in result.approvals}
        result = await make_agent(server.client()).resume(
            as_stored(result.state), decisions=decisions
        )
    assert seen == ["refund", "delete_user"] and result.rounds == 3
    lint_history(parse_history(result.messages))


async def test_max_rounds_reached_at_the_paused_turn_ends_as_it_would_have(
    serve: Callable[..., MessagesServer],
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big)])
    paused = await make_agent(server.client(), max_rounds=1).run("Refund")
    final = await make_agent(server.client(), max_rounds=1).resume(
        paused.state, decisions={big["id"]: Approve()}
    )
    assert final.stop_reason == "max_rounds" and ran == [("refund", {"order": "B2", "amount": 500})]
    assert len(server.requests) == 1
    lint_history(parse_history(final.messages))


async def test_a_state_of_version_1_still_resumes(serve: Callable[..., MessagesServer]) -> None:
    """Written before sub-runs could pause: no `run` in its waiting calls."""
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big), reply("Refunded.")])
    paused = await make_agent(server.client()).run("Refund B2")
    assert paused.state is not None and paused.state["version"] == STATE_VERSION == 3
    pending = [{k: v for k, v in p.items() if k != "run"} for p in paused.state["pending"]]
    calls = [{k: v for k, v in c.items() if k != "ran"} for c in paused.state["tool_calls"]]
    old = forged(paused.state, version=1, pending=pending, tool_calls=calls)
    final = await make_agent(server.client()).resume(old, decisions={big["id"]: Approve()})
    assert final.text == "Refunded." and ran == [("refund", {"order": "B2", "amount": 500})]


# --------------------------------------------------------------------------- bad answers


def bad_cases() -> list[Any]:
    def p(make: Callable[..., Any], error: type[Exception], match: str, id: str) -> Any:
        return pytest.param(make, error, match, id=id)

    def approve(ids: dict[str, str]) -> dict[str, Any]:
        return {"decisions": {ids["big"]: Approve()}, "results": {ids["theirs"]: "found"}}

    return [
        p(
            lambda s, i: (s, {**approve(i), "decisions": {}}),
            DecisionError,
            "no answer for the waiting call",
            "missing-decision",
        ),
        p(
            lambda s, i: (s, {**approve(i), "results": {}}),
            DecisionError,
            "no answer for the waiting call",
            "missing-result",
        ),
        p(
            lambda s, i: (s, {**approve(i), "decisions": {i["big"]: Approve(), "toolu_x": Deny()}}),
            DecisionError,
            "no call of this paused run waits with id 'toolu_x'",
            "unknown-id",
        ),
        p(
            lambda s, i: (
                s,
                {**approve(i), "decisions": {i["big"]: Approve(), i["theirs"]: Approve()}},
            ),
            DecisionError,
            "waits for external; answer it in results",
            "decision-for-external",
        ),
        p(
            lambda s, i: (s, {**approve(i), "results": {i["theirs"]: "x", i["big"]: "x"}}),
            DecisionError,
            "waits for approval; answer it in decisions",
            "result-for-approval",
        ),
        p(
            lambda s, i: (s, {**approve(i), "results": {i["theirs"]: "x", i["mine"]: "x"}}),
            DecisionError,
            "no call of this paused run waits",
            "result-for-a-finished-call",
        ),
        p(
            lambda s, i: (s, {**approve(i), "decisions": {i["big"]: True}}),
            DecisionError,
            r"must be Approve\(\) or Deny\(reason\)",
            "not-a-decision",
        ),
        p(
            lambda s, i: (s, {**approve(i), "decisions": {i["big"]: Deny("")}}),
            DecisionError,
            "the reason must be some text",
            "empty-reason",
        ),
        p(
            lambda s, i: (s, {**approve(i), "decisions": {i["big"]: Approve(input="B2")}}),
            DecisionError,
            "must be a dict of arguments",
            "edited-not-a-dict",
        ),
        p(
            lambda s, i: (
                s,
                {
                    **approve(i),
                    "decisions": {i["big"]: Approve(input={"order": "B2", "amount": "lots"})},
                },
            ),
            DecisionError,
            "amount: Input should be a valid integer",
            "edited-invalid",
        ),
        p(
            lambda s, i: (s, {**approve(i), "results": {i["theirs"]: object()}}),
            DecisionError,
            "cannot be sent to the model",
            "result-not-json",
        ),
        p(
            lambda s, i: (
                s,
                {
                    **approve(i),
                    "results": {i["theirs"]: {"type": "tool_result", "tool_use_id": "toolu_other"}},
                },
            ),
            DecisionError,
            "is a tool_result for 'toolu_other'",
            "result-block-for-another-call",
        ),
        p(
            lambda s, i: (
                s,
                {
                    **approve(i),
                    "results": {
                        i["theirs"]: {
                            "type": "tool_result",
                            "tool_use_id": i["theirs"],
                            "content": [{"type": "image", "source": {"type": "base64"}}],
                        }
                    },
                },
            ),
            DecisionError,
            r"content\.0\.image\.source\.base64\.media_type: Field required",
            "result-block-the-api-refuses",
        ),
        p(
            lambda s, i: (s, {**approve(i), "results": {i["theirs"]: {"bytes": b"\xff"}}}),
            DecisionError,
            "cannot be sent to the model",
            "result-with-bytes-not-utf8",
        ),
        p(
            lambda s, i: (s, {**approve(i), "decisions": [Approve()]}),
            DecisionError,
            "must be a dict by tool_use id",
            "decisions-not-a-dict",
        ),
        p(lambda s, i: (json.dumps(s), approve(i)), InvalidStateError, "not str", "state-as-text"),
        p(
            lambda s, i: ({**s, "format": "other"}, approve(i)),
            InvalidStateError,
            "not a run state",
            "wrong-format",
        ),
        p(
            lambda s, i: ({**s, "version": STATE_VERSION + 1}, approve(i)),
            StateVersionError,
            "version 4; this agentloop reads versions 1, 2, 3",
            "newer-version",
        ),
        p(
            lambda s, i: ({k: v for k, v in s.items() if k != "version"}, approve(i)),
            StateVersionError,
            "version None",
            "no-version",
        ),
        p(
            lambda s, i: ({**s, "rounds": 5}, approve(i)),
            TamperedStateError,
            "checksum does not match",
            "tampered-rounds",
        ),
        p(
            lambda s, i: (
                {
                    **s,
                    "pending": [
                        {**s["pending"][0], "input": {"order": "B2", "amount": 5}},
                        *s["pending"][1:],
                    ],
                },
                approve(i),
            ),
            TamperedStateError,
            "checksum does not match",
            "tampered-input",
        ),
        p(
            lambda s, i: ({k: v for k, v in s.items() if k != "checksum"}, approve(i)),
            TamperedStateError,
            "checksum",
            "no-checksum",
        ),
        p(
            lambda s, i: ({**s, "messages": s["messages"][:-1]}, approve(i)),
            TamperedStateError,
            "checksum",
            "cut-short",
        ),
        p(
            lambda s, i: (forged(s, messages=s["messages"][:-1]), approve(i)),
            InvalidStateError,
            "does not end with the paused turn",
            "forged-history",
        ),
        p(
            lambda s, i: (forged(s, finished=[]), approve(i)),
            InvalidStateError,
            "do not match the paused turn",
            "forged-results",
        ),
        p(
            lambda s, i: (forged(s, rounds="2"), approve(i)),
            InvalidStateError,
            "malformed",
            "forged-shape",
        ),
    ]


@pytest.mark.parametrize(("make", "error", "match"), bad_cases())
async def test_bad_answers_and_bad_states_change_nothing(
    serve: Callable[..., MessagesServer],
    make: Callable[..., Any],
    error: type[Exception],
    match: str,
) -> None:
    mine = tool_call("lookup", {"order": "B2"})
    big = tool_call("refund", {"order": "B2", "amount": 500})
    theirs = tool_call("client_search", {"q": "B2"})
    server = serve([reply(mine, big, theirs), reply("Done.")])
    paused = await make_agent(server.client()).run("B2", external_tools=[CLIENT_TOOL])
    ids = {"mine": mine["id"], "big": big["id"], "theirs": theirs["id"]}
    state, answers = make(as_stored(paused.state), ids)
    kept = copy.deepcopy(state)
    ran.clear()
    agent = make_agent(server.client())
    with pytest.raises(error, match=match) as raised:
        await agent.resume(state, **answers)
    assert isinstance(raised.value, ResumeError)
    assert state == kept and ran == [] and len(server.requests) == 1
    # The same state, answered properly, still resumes.
    final = await agent.resume(paused.state, **bad_cases_ok(ids))
    assert final.text == "Done."


def bad_cases_ok(ids: dict[str, str]) -> dict[str, Any]:
    return {"decisions": {ids["big"]: Approve()}, "results": {ids["theirs"]: "found"}}


async def test_an_agent_without_the_waiting_tool_cannot_resume(
    serve: Callable[..., MessagesServer],
) -> None:
    big = tool_call("refund", {"order": "B2", "amount": 500})
    server = serve([reply(big)])
    paused = await make_agent(server.client()).run("Refund")
    other = Agent(client=server.client())
    with pytest.raises(ConfigurationError, match="which this agent does not have"):
        await other.resume(paused.state, decisions={big["id"]: Approve()})
    assert len(server.requests) == 1


async def test_external_definitions_must_be_json_as_they_go_into_the_state() -> None:
    agent = make_agent(None)
    with pytest.raises(ConfigurationError, match="must be JSON values"):
        await agent.run("B2", external_tools=[{**CLIENT_TOOL, "cache_control": object()}])


async def test_a_resumed_run_cancelled_while_its_approved_call_runs_stays_valid(
    serve: Callable[..., MessagesServer],
) -> None:
    started = anyio.Event()

    @tool(requires_approval=True)
    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await anyio.Event().wait()
        return "unreachable"

    call = tool_call("wait_forever", {})
    server = serve([reply(call)])
    paused = await Agent(client=server.client(), tools=[wait_forever]).run("Wait")
    agent = Agent(client=server.client(), tools=[wait_forever])
    async with agent.resume_stream(paused.state, decisions={call["id"]: Approve()}) as events:
        async for event in events:
            if isinstance(event, ToolCallReady):
                await started.wait()
                events.cancel()
    result = events.result
    assert result is not None and result.stop_reason == "cancelled"
    assert result.messages[-1]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": CANCELLED_MESSAGE,
            "is_error": True,
        }
    ]
    lint_history(parse_history(result.messages))
    assert len(server.requests) == 1


# --------------------------------------------------------------------------- property


@tool(requires_approval=lambda ctx, input: input.get("n", 0) % 2 == 1)
def guarded(n: int) -> str:
    """Odd numbers need approval."""
    return f"guarded {n}"


@tool
def free(n: int) -> str:
    """Never needs approval."""
    return f"free {n}"


KINDS = st.sampled_from(["text", "guarded", "free", "external", "bad_input"])
STOPS = st.sampled_from(["tool_use", "tool_use", "end_turn", "max_tokens", "refusal"])
ANSWERS = st.sampled_from(["approve", "deny", "edit"])


def scripted(turns: list[tuple[list[str], str]]) -> Any:
    ids = itertools.count()
    served = iter(turns)

    def block(kind: str) -> dict[str, Any]:
        n = next(ids)
        if kind == "text":
            return {"type": "text", "text": f"text {n}"}
        name = {"guarded": "guarded", "free": "free", "external": "client_search"}.get(
            kind, "guarded"
        )
        input: dict[str, Any] = {"q": str(n)} if kind == "external" else {"n": n}
        if kind == "bad_input":
            input = {"n": "not a number"}
        return {"type": "tool_use", "id": f"toolu_{n:04d}", "name": name, "input": input}

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        try:
            kinds, stop = next(served)
        except StopIteration:
            return reply("final answer")
        return reply(*[block(kind) for kind in kinds], stop_reason=stop)

    return respond


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.tuples(st.lists(KINDS, max_size=5), STOPS), min_size=1, max_size=5),
    max_rounds=st.integers(min_value=1, max_value=6),
    data=st.data(),
)
def test_random_pauses_and_answers_keep_every_history_valid(
    turns: list[tuple[list[str], str]], max_rounds: int, data: st.DataObject
) -> None:
    provider = ScriptedProvider(scripted(turns))  # lints every request it receives

    def agent() -> Agent:
        return Agent(provider=provider, tools=[guarded, free], max_rounds=max_rounds)

    async def drive() -> RunResult:
        result = await agent().run("start", external_tools=[CLIENT_TOOL])
        while result.state is not None:
            check_paused(result)
            decisions: dict[str, Any] = {}
            for waiting in result.approvals:
                answer = data.draw(ANSWERS)
                decisions[waiting.tool_use_id] = (
                    Deny("no")
                    if answer == "deny"
                    else Approve(input={"n": 0})
                    if answer == "edit"
                    else Approve()
                )
            results = {call["id"]: "found" for call in result.pending}
            result = await agent().resume(
                as_stored(result.state), decisions=decisions, results=results
            )
        return result

    result = anyio.run(drive)
    lint_history(parse_history(result.messages))
    uses = [
        b["id"]
        for m in result.messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert [c.tool_use_id for c in result.tool_calls] == uses
    assert result.rounds == len(provider.requests) <= max_rounds
