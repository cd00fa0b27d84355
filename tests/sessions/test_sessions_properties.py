"""Random runs in one session: what is stored always reads, turn by turn, as what was sent.

The store here is a plain list in memory that meets the `Session` protocol, as a third
party's store would; the stores themselves are tested in test_sessions.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentloop import Agent, Session, lint_history, tool
from agentloop.messages import parse_history
from agentloop.sessions import UNCHANGED, SessionSnapshot
from agentloop.sessions.base import Unchanged, conflict
from agentloop.testing import ScriptedProvider, reply, tool_call


class ListSession:
    """A session in a list: enough for one process and a test."""

    def __init__(self) -> None:
        self.session_id = "memory"
        self.messages: list[dict[str, Any]] = []
        self.version = 0
        self.state: dict[str, Any] | None = None

    async def load(self) -> SessionSnapshot:
        return SessionSnapshot(copy.deepcopy(self.messages), self.version, self.state)

    async def append(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        version: int | None = None,
        state: Mapping[str, Any] | Unchanged | None = UNCHANGED,
    ) -> int:
        if version is not None and version != self.version:
            raise conflict(self.session_id, version, self.version)
        self.messages = [*self.messages, *(copy.deepcopy(dict(m)) for m in messages)]
        if state is not UNCHANGED:
            self.state = None if state is None else dict(state)
        self.version += 1
        return self.version

    async def clear(self) -> None:
        self.messages, self.state, self.version = [], None, self.version + 1

    async def save_state(self, state: Mapping[str, Any]) -> None:
        self.state = dict(state)

    async def load_state(self) -> dict[str, Any] | None:
        return self.state

    async def clear_state(self) -> None:
        self.state = None


@tool
def ok(n: int) -> str:
    """Say ok."""
    return f"ok {n}"


def turns(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Any]]]:
    """The history as the API reads it: consecutive messages of one role are one turn."""
    merged: list[tuple[str, list[Any]]] = []
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if merged and merged[-1][0] == message["role"]:
            merged[-1][1].extend(blocks)
        else:
            merged.append((message["role"], list(blocks)))
    return merged


answers = st.sampled_from(["text", "call", "calls", "pause"])
runs = st.lists(
    st.tuples(st.booleans(), st.integers(1, 3), st.lists(answers, min_size=3, max_size=3)),
    min_size=1,
    max_size=6,
)


def response(kind: str, n: int) -> dict[str, Any]:
    if kind == "call":
        return reply("Checking.", tool_call("ok", {"n": n}))
    if kind == "calls":
        return reply(tool_call("ok", {"n": n}), tool_call("ok", {"n": n + 1}))
    if kind == "pause":
        return reply(f"paused {n}", stop_reason="pause_turn")
    return reply(f"answer {n}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs)
# A prompt joining the tool results of a run that hit max_rounds (a user turn) ...
@example([(True, 1, ["call", "text", "text"]), (True, 2, ["text", "text", "text"])])
# ... and a continuation joining a paused assistant turn.
@example([(True, 1, ["pause", "text", "text"]), (False, 1, ["text", "text", "text"])])
def test_a_session_holds_the_conversation_as_it_was_sent(
    steps: list[tuple[bool, int, list[str]]],
) -> None:
    async def main() -> None:
        session = ListSession()
        assert isinstance(session, Session)
        stopped = None
        for i, (with_prompt, rounds, kinds) in enumerate(steps):
            # No prompt continues a run that hit max_rounds: after its tool results (a
            # user turn), or in a paused turn (the continuation joins that turn).
            prompt = f"prompt {i}" if with_prompt or stopped != "max_rounds" else None
            script = [response(kind, 10 * i + k) for k, kind in enumerate(kinds)]
            provider = ScriptedProvider(script)
            agent = Agent(provider=provider, tools=[ok], max_rounds=rounds)
            before = copy.deepcopy(session.messages)
            result = await agent.run(prompt, session=session)

            sent = provider.requests[0]["messages"]
            expected = [*before, *([{"role": "user", "content": prompt}] if prompt else [])]
            assert turns(sent) == turns(expected)
            assert turns(session.messages) == turns(result.messages)
            assert session.messages[: len(before)] == before  # appended, never rewritten
            lint_history(parse_history(session.messages))
            stopped = result.stop_reason

    anyio.run(main)
