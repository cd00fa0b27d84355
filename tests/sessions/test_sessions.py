"""Sessions: conversations kept in a SQLite file or on a real Redis, across runs and processes.

Every store test runs on both stores; the model is the real SDK talking to `MessagesServer`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from support import redis_server

from agentloop import Agent, AnthropicProvider, ConfigurationError, lint_history, tool
from agentloop.errors import ProviderError
from agentloop.events import RunStarted, ToolCallStarted
from agentloop.messages import parse_history
from agentloop.sessions import (
    RedisSession,
    Session,
    SessionConflict,
    SessionError,
    SQLiteSession,
)
from agentloop.sessions.base import added_messages
from agentloop.testing import Fault, MessagesServer, ScriptedProvider, reply, tool_call

CHILD = Path(__file__).with_name("_sessions_child.py")
STORES = ["sqlite", "redis"]

MakeSession = Callable[[str], Any]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(kind, target): a SQLite file not yet made, or a real Redis server's URL."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "made-on-first-use" / "sessions.db")
    return "redis", request.getfixturevalue("redis_url")


@pytest.fixture
def make(store: tuple[str, str], request: pytest.FixtureRequest) -> MakeSession:
    """A session of the store by id (ids are unique to the test, as Redis is shared)."""
    kind, target = store
    prefix = request.node.name

    def session(session_id: str) -> Any:
        cls = SQLiteSession if kind == "sqlite" else RedisSession
        return cls(target, f"{prefix}/{session_id}")

    return session


def said(message: dict[str, Any]) -> str:
    """The text of a message."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return " ".join(b["text"] for b in content if b.get("type") == "text")


def echo(body: dict[str, Any]) -> dict[str, Any]:
    """A model that answers with the last user text and how many messages it was sent."""
    return reply(f"echo {said(body['messages'][-1])} #{len(body['messages'])}")


def agent_on(server: MessagesServer, **options: Any) -> Agent:
    # The tests compare what is sent with the session: no cache breakpoints on the wire.
    options.setdefault("cache", "off")
    return Agent(provider=AnthropicProvider(server.client()), **options)


def as_read(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as the API reads them: string content as one text block, and no cache
    breakpoints (the agent adds those to what it sends, never to the history)."""

    def block(b: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in b.items() if k != "cache_control"}

    def content(c: Any) -> list[dict[str, Any]]:
        return [{"type": "text", "text": c}] if isinstance(c, str) else [block(b) for b in c]

    return [{**m, "content": content(m["content"])} for m in messages]


def check_valid(messages: list[dict[str, Any]]) -> None:
    lint_history(parse_history(messages))


# -- runs in a session


async def test_a_session_continues_a_conversation(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    server = serve(echo)
    agent = agent_on(server)
    session = make("chat")
    assert isinstance(session, Session)
    assert (await session.load()).messages == []

    first = await agent.run("one", session=session)
    async with agent.run_stream("two", session=session) as stream:
        async for _ in stream:
            pass
        assert len((await session.load()).messages) == 4  # stored when the events end
    assert first.text == "echo one #1"
    assert stream.result is not None and stream.result.text == "echo two #3"

    snapshot = await session.load()
    assert [said(m) for m in snapshot.messages] == ["one", "echo one #1", "two", "echo two #3"]
    assert snapshot.version == 2
    # The second request carried the first exchange.
    assert as_read(server.model.requests[1]["messages"][:2]) == as_read(snapshot.messages[:2])
    check_valid(snapshot.messages)


def test_run_sync_continues_a_session(store: tuple[str, str]) -> None:
    """Each `run_sync` is a new event loop: the session holds no connection between runs."""
    kind, target = store
    cls = SQLiteSession if kind == "sqlite" else RedisSession
    session = cls(target, "run-sync")
    agent = Agent(provider=ScriptedProvider(echo))
    assert agent.run_sync("one", session=session).text == "echo one #1"
    assert agent.run_sync("two", session=session).text == "echo two #3"
    snapshot = anyio.run(session.load)
    assert [said(m) for m in snapshot.messages] == ["one", "echo one #1", "two", "echo two #3"]


async def test_history_and_session_together_are_refused(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    server = serve([])
    agent = agent_on(server)
    history = [{"role": "user", "content": "hi"}]
    with pytest.raises(ConfigurationError, match="history= or session=, not both"):
        await agent.run("x", history=history, session=make("s"))
    with pytest.raises(ConfigurationError, match="not both"):
        async with agent.run_stream("x", history=history, session=make("s")):
            pass
    with pytest.raises(ConfigurationError, match="must be a Session"):
        await agent.run("x", session="s")  # type: ignore[arg-type]
    assert server.model.requests == []


calls: list[str] = []


@tool
def note(text: str) -> str:
    """Write a note."""
    calls.append(text)
    return f"noted {text}"


async def test_a_prompt_after_a_user_turn_joins_that_turn(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    """max_rounds ends after the tool results (a user turn); the next prompt joins it."""
    server = serve([reply(tool_call("note", {"text": "a"})), reply("done")])
    agent = agent_on(server, tools=[note], max_rounds=1)
    session = make("joined")
    first = await agent.run("start", session=session)
    assert first.stop_reason == "max_rounds"
    second = await agent.run("and finish", session=session)
    assert second.text == "done"

    sent = server.model.requests[1]["messages"]
    assert sent[-1]["role"] == "user"
    assert [b.get("type") for b in sent[-1]["content"]] == ["tool_result", "text"]
    stored = (await session.load()).messages
    # Stored as two user messages, which the API reads as the one turn that was sent.
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "user", "assistant"]
    assert stored[3]["content"] == [{"type": "text", "text": "and finish"}]
    check_valid(stored)
    third = await agent_on(serve([reply("still here")]), tools=[note]).run("more", session=session)
    assert third.text == "still here"


async def test_a_failed_run_keeps_what_the_model_answered(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    calls.clear()
    server = serve([reply(tool_call("note", {"text": "sent"})), Fault.server_error(500)])
    session = make("failed")
    with pytest.raises(ProviderError) as failed:
        await agent_on(server, tools=[note]).run("go", session=session)
    assert calls == ["sent"]
    snapshot = await session.load()
    # The tool ran (its effect happened), so the model's call and its result are kept.
    assert failed.value.result is not None
    assert snapshot.messages == failed.value.result.messages
    assert [m["role"] for m in snapshot.messages] == ["user", "assistant", "user"]
    check_valid(snapshot.messages)


async def test_a_run_that_fails_before_any_answer_stores_nothing(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    session = make("unanswered")
    with pytest.raises(ProviderError):
        await agent_on(serve([Fault.server_error(500)])).run("hello", session=session)
    assert await session.load() == type(await session.load())([], 0)
    # The same prompt can simply be sent again.
    again = await agent_on(serve([reply("hi")])).run("hello", session=session)
    assert again.text == "hi"
    assert [said(m) for m in (await session.load()).messages] == ["hello", "hi"]


async def test_a_cancelled_run_keeps_its_partial_history(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    started = anyio.Event()

    @tool
    async def wait_forever() -> str:
        """Never finishes."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    call = tool_call("wait_forever", {})
    server = serve([reply("Waiting.", call)])
    session = make("cancelled")
    agent = agent_on(server, tools=[wait_forever])
    async with agent.run_stream("go", session=session) as stream:
        async for event in stream:
            if isinstance(event, ToolCallStarted):
                await started.wait()
                stream.cancel()
    assert stream.result is not None and stream.result.stop_reason == "cancelled"
    snapshot = await session.load()
    assert snapshot.messages == stream.result.messages
    assert snapshot.messages[-1]["content"][0]["tool_use_id"] == call["id"]
    assert snapshot.messages[-1]["content"][0]["is_error"] is True
    check_valid(snapshot.messages)


CLIENT_TOOL = {
    "name": "client_search",
    "description": "Search the client's files.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}


async def test_calls_handed_back_are_answered_by_the_next_run(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    own, theirs = tool_call("note", {"text": "n"}), tool_call("client_search", {"q": "x"})
    server = serve([reply("Checking.", theirs, own), reply("Found and noted.")])
    agent = agent_on(server, tools=[note])
    session = make("external")
    first = await agent.run("go", session=session, external_tools=[CLIENT_TOOL])
    assert first.stop_reason == "tool_use"
    assert (await session.load()).messages == first.messages  # ends with the calls

    answer = {"type": "tool_result", "tool_use_id": theirs["id"], "content": "found"}
    second = await agent.run([answer, *first.held], session=session, external_tools=[CLIENT_TOOL])
    assert second.text == "Found and noted."
    stored = (await session.load()).messages
    assert [b["tool_use_id"] for b in stored[2]["content"]] == [theirs["id"], own["id"]]
    check_valid(stored)


# -- concurrency


async def test_twenty_runs_on_twenty_sessions_at_once(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    agent = agent_on(serve(echo))
    sessions = [make(f"many-{i}") for i in range(20)]

    async def talk(i: int, word: str) -> None:
        await agent.run(f"{word} {i}", session=sessions[i])

    for word in ("first", "second"):
        async with anyio.create_task_group() as group:
            for i in range(20):
                group.start_soon(talk, i, word)
    for i, session in enumerate(sessions):
        snapshot = await session.load()
        assert [said(m) for m in snapshot.messages] == [
            f"first {i}",
            f"echo first {i} #1",
            f"second {i}",
            f"echo second {i} #3",
        ]
        assert snapshot.version == 2


async def test_five_runs_on_one_session_never_interleave(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    """All five load the empty session, then answer: one appends, four get a typed conflict.

    Each conflicting run is run again on the session as it now stands; in the end every
    exchange is there once, whole and in commit order.
    """
    rendezvous = threading.Barrier(5, timeout=30)
    first_requests = threading.Semaphore(5)

    def held_echo(body: dict[str, Any]) -> dict[str, Any]:
        if first_requests.acquire(blocking=False):
            rendezvous.wait()  # every run has loaded (and sent) before any answers
        return echo(body)

    agent = agent_on(serve(held_echo))
    session = make("shared")
    conflicts: list[SessionConflict] = []
    committed: list[str] = []

    async def talk(i: int) -> None:
        while True:
            try:
                result = await agent.run(f"run {i}", session=session)
            except SessionConflict as exc:
                conflicts.append(exc)
                continue
            committed.append(result.text)
            return

    async with anyio.create_task_group() as group:
        for i in range(5):
            group.start_soon(talk, i)

    # Every run loaded the empty session, so four of them were refused at version 0;
    # a retry can be refused again, each time by a newer version.
    assert len([exc for exc in conflicts if exc.expected == 0]) == 4
    for exc in conflicts:
        assert exc.actual > exc.expected
        assert exc.result is not None and exc.result.text.startswith("echo run")
    snapshot = await session.load()
    assert snapshot.version == 5
    texts = [said(m) for m in snapshot.messages]
    # Prompt, answer; prompt, answer: never two runs' messages mixed.
    assert texts[1::2] == committed
    assert sorted(texts[0::2]) == [f"run {i}" for i in range(5)]
    for prompt, answer in zip(texts[0::2], texts[1::2], strict=True):
        assert answer.startswith(f"echo {prompt} #")
    check_valid(snapshot.messages)


async def test_a_streamed_run_whose_session_changed_is_refused_with_its_result(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    agent = agent_on(serve(echo))
    session, other = make("raced"), make("raced")
    theirs = [{"role": "user", "content": "theirs"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(SessionConflict) as conflict:
        async with agent.run_stream("mine", session=session) as stream:
            async for event in stream:
                if isinstance(event, RunStarted):  # loaded, not yet appended
                    await other.append(theirs, version=0)
    assert (conflict.value.expected, conflict.value.actual) == (0, 1)
    assert conflict.value.result is not None and conflict.value.result.text == "echo mine #1"
    assert stream.result is conflict.value.result
    assert (await session.load()).messages == theirs


async def test_an_append_at_a_stale_version_changes_nothing(make: MakeSession) -> None:
    session = make("stale")
    one = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert await session.append(one, version=0) == 1
    with pytest.raises(SessionConflict) as conflict:
        await session.append(one, version=0)
    assert (conflict.value.expected, conflict.value.actual) == (0, 1)
    assert (await session.load()).messages == one
    await session.clear()
    # A cleared session is not the session that was loaded, even if now empty again.
    with pytest.raises(SessionConflict):
        await session.append(one, version=1)
    snapshot = await session.load()
    assert (snapshot.messages, snapshot.version) == ([], 2)


async def test_the_state_of_a_paused_run_is_kept_apart_from_the_messages(
    make: MakeSession,
) -> None:
    session = make("state")
    assert await session.load_state() is None
    state = {"version": 1, "messages": [{"role": "user", "content": "x"}], "pending": ["id"]}
    await session.save_state(state)
    assert await session.load_state() == state
    assert json.dumps(await session.load_state())
    snapshot = await session.load()
    assert (snapshot.state, snapshot.messages, snapshot.version) == (state, [], 0)
    await session.save_state({"version": 1, "replaced": True})
    assert await session.load_state() == {"version": 1, "replaced": True}
    await session.clear_state()
    assert await session.load_state() is None
    await session.save_state(state)
    await session.clear()
    assert await session.load_state() is None


async def test_an_append_sets_the_state_in_the_same_transaction(make: MakeSession) -> None:
    """A paused run's messages and its state go in together, and a resumed run's
    messages go in with the state cleared: never one without the other."""
    session = make("atomic-state")
    paused = [{"role": "user", "content": "pay"}, {"role": "assistant", "content": "ok?"}]
    state = {"version": 1, "pending": ["toolu_1"]}
    assert await session.append(paused, version=0, state=state) == 1
    assert (await session.load()).state == state
    with pytest.raises(SessionConflict):
        await session.append([{"role": "user", "content": "late"}], version=0, state=None)
    assert (await session.load()).state == state  # the refused append changed nothing
    resumed = [{"role": "user", "content": "yes"}]
    assert await session.append(resumed, version=1) == 2  # UNCHANGED by default
    assert await session.load_state() == state
    assert await session.append([], version=2, state=None) == 3
    snapshot = await session.load()
    assert (snapshot.state, len(snapshot.messages)) == (None, 3)


async def test_what_a_store_cannot_keep_is_a_typed_error(make: MakeSession) -> None:
    session = make("bad")
    with pytest.raises(SessionError, match="JSON"):
        await session.append([{"role": "user", "content": object()}])
    with pytest.raises(SessionError, match="JSON"):
        await session.save_state({"when": object()})
    assert await session.load() == type(await session.load())([], 0)
    for cls in (SQLiteSession, RedisSession):
        with pytest.raises(ConfigurationError, match="session id"):
            cls("unused", "")


def test_added_messages_keeps_a_joined_turn_as_its_own_message() -> None:
    before = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert added_messages(before, [*before, {"role": "user", "content": "c"}]) == [
        {"role": "user", "content": "c"}
    ]
    joined = [{"role": "user", "content": "a"}]
    after = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "c"}]}
    ]
    assert added_messages(joined, after) == [
        {"role": "user", "content": [{"type": "text", "text": "c"}]}
    ]
    with pytest.raises(SessionError, match="does not continue"):
        added_messages(before, [{"role": "user", "content": "other"}])


# -- other processes


async def child(
    store: tuple[str, str], session_id: str, server: MessagesServer, prompt: str
) -> str:
    kind, target = store
    done = await anyio.run_process(
        [sys.executable, str(CHILD), kind, target, session_id, server.base_url, prompt],
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_a_conversation_continues_in_another_process(
    store: tuple[str, str], serve: Callable[..., MessagesServer]
) -> None:
    server = serve(echo)
    assert await child(store, "procs", server, "one") == "done: echo one #1\n"
    assert await child(store, "procs", server, "two") == "done: echo two #3\n"
    snapshot = await session_of(store, "procs").load()
    assert [said(m) for m in snapshot.messages] == ["one", "echo one #1", "two", "echo two #3"]
    assert as_read(server.model.requests[1]["messages"][:2]) == as_read(snapshot.messages[:2])


def session_of(store: tuple[str, str], session_id: str) -> Any:
    kind, target = store
    return (SQLiteSession if kind == "sqlite" else RedisSession)(target, session_id)


async def test_a_process_killed_during_an_append_leaves_the_last_good_state(
    store: tuple[str, str], serve: Callable[..., MessagesServer]
) -> None:
    server = serve(echo)
    kind, target = store
    await child(store, "killed", server, "kept")
    session = session_of(store, "killed")
    good = await session.load()

    command = [
        sys.executable,
        str(CHILD),
        kind,
        target,
        "killed",
        server.base_url,
        "lost",
        "--block",
    ]
    async with await anyio.open_process(command) as process:
        assert process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)
        assert await lines.receive_until(b"\n", 1000) == b"at-commit"
        os.kill(process.pid, signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL

    after = await session.load()
    assert (after.messages, after.version) == (good.messages, good.version)
    assert len(server.model.requests) == 2  # the killed run had its answer
    # The store is not left locked or half-written: the next run goes on from the good state.
    assert await child(store, "killed", server, "next") == "done: echo next #3\n"
    assert [said(m) for m in (await session.load()).messages][-2:] == ["next", "echo next #3"]


# -- the command line


async def agentloop_command(*args: str, **env: str) -> tuple[int, str, str]:
    """`python -m agentloop ARGS` with no plugins and `env` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTLOOP_"))}
    done = await anyio.run_process(
        [sys.executable, "-m", "agentloop", *args],
        env={**clean, "AGENTLOOP_PLUGINS": "", **env},
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_the_command_line_continues_a_named_conversation(
    store: tuple[str, str], serve: Callable[..., MessagesServer], tmp_path: Path
) -> None:
    """SQLite: the default file under $XDG_DATA_HOME; Redis: named with --session-db."""
    server = serve(echo)
    kind, target = store
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": server.base_url,
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    where = [] if kind == "sqlite" else ["--session-db", target]
    for prompt in ("one", "two"):
        code, out, err = await agentloop_command(
            "run", prompt, "--session", "cli-chat", "--json", *where, **env
        )
        assert code == 0, err
        assert json.loads(out)["text"] == f"echo {prompt} #{1 if prompt == 'one' else 3}"
    stored = tmp_path / "data" / "agentloop" / "sessions.db"
    session = session_of(("sqlite", str(stored)) if kind == "sqlite" else store, "cli-chat")
    texts = [said(m) for m in (await session.load()).messages]
    assert texts == ["one", "echo one #1", "two", "echo two #3"]
    sent = server.model.requests[1]["messages"][:2]
    assert as_read(sent) == as_read((await session.load()).messages[:2])


async def test_the_sessions_environment_variable_names_the_store(
    serve: Callable[..., MessagesServer], tmp_path: Path
) -> None:
    server = serve(echo)
    named = tmp_path / "elsewhere.db"
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": server.base_url,
        "AGENTLOOP_SESSIONS": str(named),
    }
    code, _, err = await agentloop_command("run", "hello", "--session", "env", **env)
    assert code == 0, err
    snapshot = await SQLiteSession(named, "env").load()
    assert [said(m) for m in snapshot.messages] == ["hello", "echo hello #1"]


async def test_a_session_store_without_a_session_is_a_usage_error() -> None:
    code, out, err = await agentloop_command("run", "hi", "--session-db", "x.db")
    assert (code, out) == (2, "")
    assert err == "agentloop: error: --session-db needs --session NAME\n"


async def test_a_session_store_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    where = tmp_path / "typo" / "sessions.db"
    code, out, err = await agentloop_command(
        "run", "hi", "--session", "s", "--session-db", f"sqlite:///{where}"
    )
    assert (code, out) == (2, "")
    assert (
        err == f"agentloop: error: --session-db: no such folder: {where.parent} (create it first)\n"
    )
    assert not where.parent.exists()


def test_a_sqlite_session_works_under_trio(tmp_path: Path) -> None:
    async def main() -> list[str]:
        session = SQLiteSession(tmp_path / "trio.db", "trio")
        agent = Agent(provider=ScriptedProvider(echo))
        await agent.run("one", session=session)
        await agent.run("two", session=session)
        return [said(m) for m in (await session.load()).messages]

    assert anyio.run(main, backend="trio") == ["one", "echo one #1", "two", "echo two #3"]


# -- a paused run in a session


async def test_a_paused_run_keeps_its_state_in_the_session_and_resumes_from_it(
    make: MakeSession, serve: Callable[..., MessagesServer]
) -> None:
    from _approval import make_agent, ran

    from agentloop import Approve

    call = tool_call("refund", {"order": "A1", "amount": 500})
    server = serve([reply(call), reply("Refunded.")])
    agent = make_agent(server.client())
    session = make("refunds")

    paused = await agent.run("Refund A1", session=session)
    assert paused.stop_reason == "approval_required"
    stored = await session.load()
    assert stored.messages == paused.messages
    assert stored.state is not None and json.loads(json.dumps(stored.state)) == paused.state

    # Another agent object, as after a restart: the session holds what it needs.
    ran.clear()
    done = await make_agent(server.client()).resume(
        session=session, decisions={call["id"]: Approve()}
    )
    assert done.stop_reason == "end_turn" and done.text == "Refunded."
    assert ran == [("refund", {"order": "A1", "amount": 500})]
    after = await session.load()
    assert after.messages == done.messages and after.state is None
    check_valid(after.messages)

    with pytest.raises(ConfigurationError, match="holds no paused run"):
        await agent.resume(session=session, decisions={call["id"]: Approve()})
    with pytest.raises(ConfigurationError, match="needs the paused run's state"):
        await agent.resume(decisions={call["id"]: Approve()})
