"""Sub-agents that pause: calls inside an `as_tool` sub-run that wait, resumed through the parent.

Every agent talks to a `MessagesServer` of its own through the real SDK. The paused state
goes through JSON text, and the resumed run is driven by new `Agent`s (once by a fresh
process), as a service's other replica would.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from _approval import CLIENT_TOOL, forged, make_agent, make_team, ran

from agentloop import (
    Agent,
    AnthropicProvider,
    ApprovalRequest,
    ApprovalRequested,
    Approve,
    ConfigurationError,
    Deny,
    RunContext,
    RunFinished,
    SQLiteSession,
    ToolCallReady,
    ToolResultEvent,
    UsageLimits,
    lint_history,
    tool,
)
from agentloop.errors import DecisionError, TamperedStateError
from agentloop.messages import parse_history
from agentloop.result import SubAgentCall
from agentloop.testing import MessagesServer, reply, tool_call

FORMATS = [pytest.param(False, id="json"), pytest.param(True, id="sse")]
TESTS = Path(__file__).parent
MODEL = "claude-sonnet-4-5"  # priced, so that cost is counted
PARENT_USAGE = {"input_tokens": 200, "output_tokens": 10}
SUB_USAGE = {"input_tokens": 1000, "output_tokens": 40}
BIG = {"order": "B2", "amount": 500}
REASON = "tool 'refund' requires approval: amount 500 is over the limit of 100"

Serve = Callable[..., MessagesServer]


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def as_stored(state: Any) -> Any:
    """The state as it comes back from a store: through JSON text."""
    return json.loads(json.dumps(state))


def sent_results(server: MessagesServer, request: int = -1) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message of a request the server got."""
    return list(server.requests[request]["messages"][-1]["content"])


def ask(agent: str = "researcher", prompt: str = "refund B2 and A1") -> dict[str, Any]:
    return tool_call(agent, {"prompt": prompt})


@dataclass(frozen=True)
class Scripts:
    """A parent turn calling the researcher and `lookup`; the researcher's turn refunds
    A1 (it runs) and B2 (it waits for approval), then each answers."""

    asked: dict[str, Any] = field(default_factory=ask)
    look: dict[str, Any] = field(default_factory=lambda: tool_call("lookup", {"order": "B2"}))
    small: dict[str, Any] = field(
        default_factory=lambda: tool_call("refund", {"order": "A1", "amount": 20})
    )
    big: dict[str, Any] = field(default_factory=lambda: tool_call("refund", BIG))

    def parent(self) -> list[Any]:
        return [
            reply("Asking.", self.asked, self.look, usage=PARENT_USAGE),
            reply("All done.", usage=PARENT_USAGE),
        ]

    def sub(self) -> list[Any]:
        return [
            reply(self.small, self.big, usage=SUB_USAGE),
            reply("Refunded both.", usage=SUB_USAGE),
        ]


FIRST_RAN = sorted(
    [("refund", {"order": "A1", "amount": 20}), ("lookup", {"order": "B2"})], key=str
)
"""What runs before the pause (the sub-run's call and the parent's, in either order)."""


@pytest.mark.parametrize("stream", FORMATS)
async def test_an_approval_inside_a_sub_agent_pauses_the_parent_with_the_call_listed(
    serve: Serve, stream: bool
) -> None:
    s = Scripts()
    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    team = make_team(parent_server.client(), sub_server.client(), stream=stream, model=MODEL)
    paused = await team.run("Refund B2 and A1")

    assert paused.stop_reason == "approval_required"
    inside = (SubAgentCall("researcher", s.asked["id"]),)
    assert paused.approvals == [ApprovalRequest(s.big["id"], "refund", BIG, REASON, inside)]
    # The turn's other calls ran: the parent's own (held), and the sub-run's own.
    assert sorted(ran, key=str) == FIRST_RAN
    assert [b["tool_use_id"] for b in paused.held] == [s.look["id"]]
    assert paused.pending == []
    # The researcher's call has no result yet: only `lookup` is logged.
    assert [r.tool_use_id for r in paused.tool_calls] == [s.look["id"]]
    assert paused.messages[-1]["content"][1:] == [s.asked, s.look]
    # The sub-run's spending is in the parent's, once.
    assert paused.usage.requests == 2
    assert paused.usage.input_tokens == 200 + 1000
    assert json.loads(json.dumps(paused.state)) == paused.state
    assert len(parent_server.requests) == 1 and len(sub_server.requests) == 1


@pytest.mark.parametrize("stream", FORMATS)
async def test_resuming_goes_on_in_the_sub_run_then_in_the_parent_as_if_never_paused(
    serve: Serve, stream: bool
) -> None:
    s = Scripts()
    # The same scripts with nobody asked: the runs an approval must reproduce.
    plain_parent, plain_sub = serve(s.parent()), serve(s.sub())
    never = await make_team(
        plain_parent.client(), plain_sub.client(), stream=stream, asks=False, model=MODEL
    ).run("Refund B2 and A1")
    never_ran = sorted(ran, key=str)
    ran.clear()

    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    clients = (parent_server.client(), sub_server.client())
    paused = await make_team(*clients, stream=stream, model=MODEL).run("Refund B2 and A1")
    final = await make_team(*clients, stream=stream, model=MODEL).resume(
        as_stored(paused.state), decisions={s.big["id"]: Approve()}
    )

    assert final.stop_reason == "end_turn" and final.text == "All done."
    assert final.messages == never.messages
    assert sub_server.requests == plain_sub.requests  # the sub-run went on as it would have
    assert sent_results(parent_server)[0]["content"] == "Refunded both."
    assert final.usage == never.usage and final.usage.requests == 4
    assert final.cost is not None and final.cost == pytest.approx(never.cost)
    assert [(r.name, r.tool_use_id, r.output) for r in final.tool_calls] == [
        (r.name, r.tool_use_id, r.output) for r in never.tool_calls
    ]
    assert final.run_id == paused.run_id and final.rounds == 2
    assert sorted(ran, key=str) == never_ran  # each call once
    lint_history(parse_history(final.messages))


async def test_a_denied_call_inside_a_sub_agent_is_the_sub_models_to_act_on(
    serve: Serve,
) -> None:
    s = Scripts()
    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    clients = (parent_server.client(), sub_server.client())
    paused = await make_team(*clients).run("Refund B2 and A1")
    final = await make_team(*clients).resume(
        as_stored(paused.state), decisions={s.big["id"]: Deny("over budget")}
    )
    assert final.text == "All done."
    assert sent_results(sub_server)[1] == {
        "type": "tool_result",
        "tool_use_id": s.big["id"],
        "content": "Denied: over budget",
        "is_error": True,
    }
    assert ("refund", BIG) not in ran


async def test_a_run_and_a_team_resume_in_a_fresh_process_from_json(
    serve: Serve, tmp_path: Path
) -> None:
    """Another replica resumes from the JSON text alone: one interpreter (the SDK's import is
    most of its cost) resumes both a single agent's paused run and a team's."""
    big = tool_call("refund", BIG)
    theirs = tool_call("client_search", {"q": "B2"})
    single = serve([reply(big, theirs), reply("Refunded B2.")])
    single_paused = await make_agent(single.client()).run("Refund B2", external_tools=[CLIENT_TOOL])
    s = Scripts()
    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    team_paused = await make_team(parent_server.client(), sub_server.client()).run("Refund")
    assert sorted(ran, key=str) == FIRST_RAN
    saved = {"single": tmp_path / "single.json", "team": tmp_path / "team.json"}
    saved["single"].write_text(json.dumps(single_paused.state))
    saved["team"].write_text(json.dumps(team_paused.state))
    script = f"""
import json, anyio, anthropic
from _approval import make_agent, make_team, ran
from agentloop import Approve

def client(url):
    return anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)

def load(path):
    return json.loads(open(path).read())

def outcome(result, ran):
    return {{"text": result.text, "ran": list(ran), "run_id": result.run_id,
            "rounds": result.rounds, "requests": result.usage.requests,
            "messages": result.messages}}

async def main():
    single = await make_agent(client({single.base_url!r})).resume(
        load({str(saved["single"])!r}),
        decisions={{{big["id"]!r}: Approve()}}, results={{{theirs["id"]!r}: "found"}},
    )
    single_ran = list(ran)
    ran.clear()
    team = await make_team(client({parent_server.base_url!r}), client({sub_server.base_url!r})).resume(
        load({str(saved["team"])!r}), decisions={{{s.big["id"]!r}: Approve()}}
    )
    print(json.dumps({{"single": outcome(single, single_ran), "team": outcome(team, ran)}}))

anyio.run(main)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    done = await anyio.run_process([sys.executable, "-c", script], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert sorted(ran, key=str) == FIRST_RAN  # nothing more ran in this process

    one = out["single"]
    assert one["text"] == "Refunded B2." and one["ran"] == [["refund", BIG]]
    assert (one["run_id"], one["rounds"]) == (single_paused.run_id, 2)
    lint_history(parse_history(one["messages"]))
    assert [b["tool_use_id"] for b in sent_results(single)] == [big["id"], theirs["id"]]

    team = out["team"]
    assert team["text"] == "All done." and team["ran"] == [["refund", BIG]]
    assert (team["run_id"], team["requests"]) == (team_paused.run_id, 4)
    lint_history(parse_history(team["messages"]))
    assert sent_results(sub_server)[1]["content"] == "refunded 500 on B2"


async def test_an_external_call_of_a_sub_agent_is_handed_back_and_answered(
    serve: Serve,
) -> None:
    asked = ask(prompt="search the client's files")
    theirs = tool_call("client_search", {"q": "B2"})
    parent_server = serve([reply(asked), reply("They mention B2.")])
    sub_server = serve([reply(theirs), reply("3 files.")])
    clients = (parent_server.client(), sub_server.client())
    paused = await make_team(*clients, external_tools=[CLIENT_TOOL]).run("Search")

    assert paused.stop_reason == "tool_use" and paused.approvals == []
    assert paused.pending == [{**theirs, "via": [["researcher", asked["id"]]]}]
    # The sub-agent's model was told of the external tool; the parent's was not.
    assert [t["name"] for t in sub_server.requests[0]["tools"]][-1] == "client_search"
    assert "client_search" not in [t["name"] for t in parent_server.requests[0]["tools"]]

    final = await make_team(*clients, external_tools=[CLIENT_TOOL]).resume(
        as_stored(paused.state), results={theirs["id"]: "3 files mention B2"}
    )
    assert final.text == "They mention B2."
    assert sent_results(sub_server) == [
        {"type": "tool_result", "tool_use_id": theirs["id"], "content": "3 files mention B2"}
    ]
    assert sent_results(parent_server)[0]["content"] == "3 files."


@pytest.mark.parametrize("stream", FORMATS)
async def test_a_sub_agent_of_a_sub_agent_pauses_and_resumes_the_same_way(
    serve: Serve, stream: bool
) -> None:
    outer = ask()
    inner = ask("clerk", "refund B2")
    big = tool_call("refund", BIG)
    parent_server = serve([reply(outer), reply("Done.")])
    researcher_server = serve([reply(inner), reply("The clerk refunded B2.")])
    clerk_server = serve([reply(big), reply("Refunded B2.")])
    clients = (parent_server.client(), researcher_server.client(), clerk_server.client())
    paused = await make_team(*clients, stream=stream).run("Refund B2")

    assert paused.stop_reason == "approval_required"
    [approval] = paused.approvals
    assert approval.tool_use_id == big["id"]
    assert approval.via == (
        SubAgentCall("researcher", outer["id"]),
        SubAgentCall("clerk", inner["id"]),
    )
    final = await make_team(*clients, stream=stream).resume(
        as_stored(paused.state), decisions={big["id"]: Approve()}
    )
    assert final.text == "Done." and ran == [("refund", BIG)]
    assert sent_results(researcher_server)[0]["content"] == "Refunded B2."
    assert sent_results(parent_server)[0]["content"] == "The clerk refunded B2."
    assert final.usage.requests == 6


async def test_a_sub_run_that_pauses_again_pauses_the_parent_again(serve: Serve) -> None:
    asked, look, big = ask(), tool_call("lookup", {"order": "B2"}), tool_call("refund", BIG)
    root = tool_call("delete_user", {"user": "root"})
    parent_server = serve([reply(asked, look), reply("Done.")])
    sub_server = serve([reply(big), reply(root), reply("Refunded, deleted.")])
    clients = (parent_server.client(), sub_server.client())
    result = await make_team(*clients).run("Go")
    seen = []
    while result.stop_reason == "approval_required":
        assert [a.via for a in result.approvals] == [(SubAgentCall("researcher", asked["id"]),)]
        seen.append(result.approvals[0].name)
        decisions = {a.tool_use_id: Approve() for a in result.approvals}
        result = await make_team(*clients).resume(as_stored(result.state), decisions=decisions)
    assert seen == ["refund", "delete_user"] and result.text == "Done."
    # The parent's own call ran once, in the first turn, and is logged once, in order.
    assert ran == [("lookup", {"order": "B2"}), ("refund", BIG), ("delete_user", {"user": "root"})]
    assert [r.tool_use_id for r in result.tool_calls] == [asked["id"], look["id"]]
    assert [b["tool_use_id"] for b in sent_results(parent_server)] == [asked["id"], look["id"]]
    assert result.usage.requests == 5
    lint_history(parse_history(result.messages))


@pytest.mark.filterwarnings("ignore:UsageLimits\\(requests:DeprecationWarning")
async def test_a_resumed_sub_run_is_bounded_by_what_is_left_counted_once(serve: Serve) -> None:
    """Five requests in all, under a limit of five: the sub-run's two before the pause
    are not counted twice against what it may spend after it."""
    asked, big = ask(), tool_call("refund", BIG)
    parent_server = serve([reply(asked), reply("Done.")])
    sub_server = serve(
        [reply(tool_call("lookup", {"order": "B2"})), reply(big), reply("Refunded.")]
    )
    clients = (parent_server.client(), sub_server.client())
    limits = UsageLimits(requests=5)
    paused = await make_team(*clients, usage_limits=limits).run("Refund B2")
    assert paused.usage.requests == 3
    final = await make_team(*clients, usage_limits=limits).resume(
        as_stored(paused.state), decisions={big["id"]: Approve()}
    )
    assert final.text == "Done." and final.usage.requests == 5
    assert sent_results(parent_server)[0]["content"] == "Refunded."


@pytest.mark.parametrize("stream", FORMATS)
async def test_streams_report_the_waiting_call_inside_then_the_resumed_sub_agents_answer(
    serve: Serve, stream: bool
) -> None:
    s = Scripts()
    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    clients = (parent_server.client(), sub_server.client())
    async with make_team(*clients, stream=stream).run_stream("Refund") as events:
        waits = [e async for e in events if isinstance(e, ApprovalRequested)]
    inside = (SubAgentCall("researcher", s.asked["id"]),)
    assert waits == [ApprovalRequested(1, s.big["id"], "refund", BIG, REASON, inside)]
    paused = events.result
    assert paused is not None and paused.stop_reason == "approval_required"

    async with make_team(*clients, stream=stream).resume_stream(
        as_stored(paused.state), decisions={s.big["id"]: Approve()}
    ) as resumed:
        seen = [e async for e in resumed]
    ready = [e for e in seen if isinstance(e, ToolCallReady)]
    results = [e for e in seen if isinstance(e, ToolResultEvent)]
    assert ready[0] == ToolCallReady(1, s.asked["id"], "researcher", s.asked["input"], False)
    assert (results[0].tool_use_id, results[0].output) == (s.asked["id"], "Refunded both.")
    assert isinstance(seen[-1], RunFinished) and seen[-1].result.text == "All done."


async def test_a_session_keeps_the_nested_state_and_resumes_from_it(
    serve: Serve, tmp_path: Path
) -> None:
    s = Scripts()
    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    clients = (parent_server.client(), sub_server.client())
    session = SQLiteSession(tmp_path / "sessions.db", "refunds")
    paused = await make_team(*clients).run("Refund", session=session)
    assert paused.stop_reason == "approval_required"
    done = await make_team(*clients).resume(session=session, decisions={s.big["id"]: Approve()})
    assert done.text == "All done." and ("refund", BIG) in ran
    stored = await session.load()
    assert stored.messages == done.messages and stored.state is None


async def test_answers_that_do_not_fit_the_nested_calls_change_nothing(serve: Serve) -> None:
    s = Scripts()
    big = s.big
    parent_server, sub_server = serve(s.parent()), serve(s.sub())
    clients = (parent_server.client(), sub_server.client())
    paused = await make_team(*clients).run("Refund")
    state = as_stored(paused.state)
    ran.clear()
    team = make_team(*clients)
    with pytest.raises(DecisionError, match="no answer for the waiting call"):
        await team.resume(state, decisions={})
    with pytest.raises(DecisionError, match="no call of this paused run waits"):
        await team.resume(state, decisions={big["id"]: Approve(), s.asked["id"]: Approve()})
    with pytest.raises(DecisionError, match="amount"):
        await team.resume(state, decisions={big["id"]: Approve(input={"order": "B2"})})
    # The sub-run's state has a checksum of its own, checked too.
    pending = copy.deepcopy(state["pending"])
    pending[0]["run"]["pending"][0]["input"]["amount"] = 5
    with pytest.raises(TamperedStateError, match="the sub-run of call"):
        await team.resume(forged(state, pending=pending), decisions={big["id"]: Approve()})
    alone = Agent(provider=AnthropicProvider(parent_server.client()), tools=[tool(len)])
    with pytest.raises(ConfigurationError, match="not a sub-agent"):
        await alone.resume(state, decisions={big["id"]: Approve()})
    assert ran == [] and state == as_stored(paused.state)
    assert len(parent_server.requests) == 1 and len(sub_server.requests) == 1


async def test_two_calls_of_one_sub_agent_run_under_ids_derived_from_each_call(
    serve: Serve,
) -> None:
    keys: list[str] = []

    @tool
    def note(ctx: RunContext, text: str) -> str:
        """Write a note."""
        keys.append(ctx.idempotency_key)
        return "noted"

    first, second = ask("writer", "note a"), ask("writer", "note b")
    parent_server = serve([reply(first, second), reply("Done.")])

    def writer_model(body: dict[str, Any]) -> dict[str, Any]:
        # Both sub-runs' models give their call the same id: only the run ids differ.
        if body["messages"][-1]["role"] == "user" and len(body["messages"]) == 1:
            return reply(tool_call("note", {"text": "x"}, id="toolu_note"))
        return reply("ok")

    sub_server = serve(writer_model)
    writer = Agent(provider=AnthropicProvider(sub_server.client()), tools=[note], name="writer")
    parent = Agent(provider=AnthropicProvider(parent_server.client()), tools=[writer.as_tool()])
    result = await parent.run("Write two notes")
    # Each sub-run's id is its call's key: the same again for that call, and no other's.
    assert sorted(keys) == sorted(
        [f"{result.run_id}:{first['id']}:toolu_note", f"{result.run_id}:{second['id']}:toolu_note"]
    )
