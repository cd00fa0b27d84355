"""run_stream: typed events, eager tool calls, cut-off and failed streams, cancellation."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import Agent, AnthropicProvider, lint_history, tool
from agentloop.errors import ServerError
from agentloop.events import (
    ModelResponded,
    ModelStreamEvent,
    RequestStarted,
    RoundFinished,
    RunFinished,
    RunStarted,
    TextDelta,
    ToolCallReady,
    ToolInputDelta,
    ToolResultEvent,
)
from agentloop.history import TRUNCATED_MESSAGE
from agentloop.messages import parse_history
from agentloop.providers.base import BlockDelta, BlockStop
from agentloop.runstate import CANCELLED_MESSAGE
from agentloop.testing import (
    MessagesServer,
    RawResponse,
    ScriptedModel,
    ScriptedProvider,
    SteppedProvider,
    reply,
    text,
    tool_call,
)

STREAMING = ["stepped", "anthropic-sse", "openai-sse"]  # the `streaming_provider` kinds (conftest)

BACKENDS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]


@tool
def echo(value: str) -> str:
    """Echo the value back."""
    return value


def run_on(backend: str, function: Any, *args: Any) -> Any:
    return anyio.run(function, *args, backend=backend)


def kinds(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_arrive_in_the_documented_order_over_sse(backend: str) -> None:
    script = [
        reply(
            text("Let me check."),
            tool_call("echo", {"value": "a"}),
            tool_call("echo", {"value": "b"}),
        ),
        reply("Done."),
    ]

    async def main() -> tuple[list[Any], Any, Any]:
        async with MessagesServer(script) as server, MessagesServer(script) as plain:
            agent = Agent(provider=AnthropicProvider(server.client(), stream=True), tools=[echo])
            async with agent.run_stream("go") as stream:
                events = [e async for e in stream]
            expected = await Agent(client=plain.client(), tools=[echo]).run("go")
        return events, stream.result, expected

    events, result, expected = run_on(backend, main)
    assert isinstance(events[0], RunStarted) and events[1] == RequestStarted(1)
    assert isinstance(events[-1], RunFinished) and events[-1].result is result
    assert result.messages == expected.messages and result.text == "Done."
    assert (
        "".join(e.text for e in events if isinstance(e, TextDelta) and e.round == 1)
        == "Let me check."
    )
    for call in script[0]["content"][1:]:
        mine = [e for e in events if getattr(e, "tool_use_id", None) == call["id"]]
        assert kinds(mine)[0] == "ToolCallStarted" and kinds(mine)[-1] == "ToolResultEvent"
        assert "ToolInputDelta" in kinds(mine)
        ready = next(e for e in mine if isinstance(e, ToolCallReady))
        assert ready.input == call["input"] and ready.eager
        assert (
            json.loads("".join(e.partial_json for e in mine if isinstance(e, ToolInputDelta)))
            == call["input"]
        )
    rounds = [e for e in events if isinstance(e, RoundFinished)]
    assert [(r.round, r.stop_reason) for r in rounds] == [(1, "tool_use"), (2, "end_turn")]
    assert events.index(rounds[0]) < events.index(RequestStarted(2))
    assert all(
        events.index(e) < events.index(rounds[0]) for e in events if isinstance(e, ToolResultEvent)
    )


@pytest.mark.parametrize("kind", STREAMING)
async def test_the_model_stream_and_the_whole_response_are_events(
    kind: str, streaming_provider: Any
) -> None:
    script = [reply(text("Let me check."), tool_call("echo", {"value": "a"})), reply("Done.")]
    async with streaming_provider(kind, script) as provider:
        agent = Agent(provider=provider, tools=[echo])
        async with agent.run_stream("go") as stream:
            events = [e async for e in stream]
    model = [e for e in events if isinstance(e, ModelStreamEvent)]
    responded = [e for e in events if isinstance(e, ModelResponded)]
    assert [e.round for e in responded] == [1, 2]
    assert [e.response.stop_reason for e in responded] == ["tool_use", "end_turn"]
    for round_, whole in ((1, responded[0]), (2, responded[1])):
        stops = [
            e.event.block for e in model if e.round == round_ and isinstance(e.event, BlockStop)
        ]
        assert stops == list(whole.response.content)  # the blocks verbatim, in order
        # Each round's stream comes before its whole response, the first delta before the
        # `TextDelta` derived from it.
        mine = [e for e in model if e.round == round_]
        assert events.index(mine[-1]) < events.index(whole)
    first_delta = next(e for e in model if isinstance(e.event, BlockDelta))
    assert events.index(first_delta) < events.index(
        next(e for e in events if isinstance(e, TextDelta))
    )
    # The whole response comes before the round's results are in.
    rounds = [e for e in events if isinstance(e, RoundFinished)]
    assert events.index(responded[0]) < events.index(rounds[0])


async def test_a_response_that_is_not_streamed_is_an_event_too() -> None:
    agent = Agent(provider=ScriptedProvider([reply("hello")]))
    async with agent.run_stream("hi") as stream:
        events = [e async for e in stream]
    (responded,) = [e for e in events if isinstance(e, ModelResponded)]
    assert responded.response.content[0].text == "hello"
    assert not any(isinstance(e, ModelStreamEvent) for e in events)


@pytest.mark.parametrize("kind", STREAMING)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tool_starts_while_the_message_is_still_streaming(
    backend: str, kind: str, streaming_provider: Any
) -> None:
    order: list[str] = []

    async def main() -> Any:
        first_started = anyio.Event()

        @tool
        async def first() -> str:
            order.append("first started")
            first_started.set()
            return "one"

        @tool(eager=False)
        async def waits() -> str:
            order.append("waits started")
            return "two"

        async def hook(n: int, event: Any) -> None:
            if isinstance(event, BlockStop) and getattr(event.block, "name", None) == "first":
                # Hold the stream until the tool has started: deadlocks unless eager.
                with anyio.fail_after(5):
                    await first_started.wait()
                order.append("stream resumed")

        script = [reply(tool_call("first"), tool_call("waits"), text("tail")), reply("done")]
        async with streaming_provider(kind, script, hook) as provider:
            agent = Agent(provider=provider, tools=[first, waits])
            async with agent.run_stream("go") as stream:
                events = [e async for e in stream]
        return events, stream.result

    events, result = run_on(backend, main)
    assert order == ["first started", "stream resumed", "waits started"]
    ready = {e.name: e.eager for e in events if isinstance(e, ToolCallReady)}
    assert ready == {"first": True, "waits": False}
    assert [c.output for c in result.tool_calls] == ["one", "two"]


# Over HTTP in the Messages format the scripted server sends whole input even for a
# max_tokens reply, so only the in-process double can show a cut-off block there; a Chat
# Completions call is cut off by the `length` finish chunk itself.
@pytest.mark.parametrize("kind", ["stepped", "openai-sse"])
async def test_cut_off_tool_use_is_never_run_while_streaming(
    kind: str, streaming_provider: Any
) -> None:
    ran: list[str] = []

    @tool
    def record(value: str) -> str:
        ran.append(value)
        return "ok"

    script = [
        reply(
            tool_call("record", {"value": "whole"}),
            tool_call("record", {"value": "cut"}),
            stop_reason="max_tokens",
        ),
        reply("again"),
    ]
    async with streaming_provider(kind, script, truncate_last_input=True) as provider:
        agent = Agent(provider=provider, tools=[record])
        async with agent.run_stream("go") as stream:
            events = [e async for e in stream]
    assert ran == ["whole"]
    result = stream.result
    assert result is not None
    assert [(c.is_error, c.output) for c in result.tool_calls] == [
        (False, "ok"),
        (True, TRUNCATED_MESSAGE),
    ]
    assert sum(isinstance(e, ToolCallReady) for e in events) == 1
    lint_history(parse_history(result.messages))


@pytest.mark.parametrize("kind", STREAMING)
async def test_a_failing_stream_cancels_eager_calls_and_answers_them(
    kind: str, streaming_provider: Any
) -> None:
    tool_started = anyio.Event()
    cancelled = False

    @tool
    async def forever() -> str:
        nonlocal cancelled
        tool_started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled = True
        return "never"

    async def hook(n: int, event: Any) -> None:
        if isinstance(event, BlockStop):
            with anyio.fail_after(5):
                await tool_started.wait()
            raise ServerError("500 api_error: stream broke", status_code=500)

    script = [reply(tool_call("forever"), text("more"))]
    async with streaming_provider(kind, script, hook) as provider:
        agent = Agent(provider=provider, tools=[forever])
        with pytest.raises(ServerError) as info:
            await _consume(agent)
    assert cancelled
    partial = info.value.result
    assert partial is not None and partial.stop_reason == "error"
    (record,) = partial.tool_calls
    assert record.is_error and "model request failed" in record.output
    lint_history(parse_history(partial.messages))


async def _consume(agent: Agent, prompt: str = "go") -> Any:
    async with agent.run_stream(prompt) as stream:
        async for _ in stream:
            pass
    return stream.result


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancel_stops_tools_and_the_request_quickly(backend: str) -> None:
    async def main() -> tuple[Any, list[str], int]:
        in_tool = anyio.Event()
        stopped: list[str] = []

        @tool
        async def slow(n: int) -> str:
            in_tool.set()
            try:
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                stopped.append(f"slow {n}")
                raise
            return "late"

        @tool
        def quick() -> str:
            return "fast"

        async def hold(n: int, event: Any) -> None:
            # The response stops after the first `slow` block: the cancel lands mid-response.
            if isinstance(event, BlockStop) and getattr(event.block, "name", None) == "slow":
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    stopped.append("request")
                    raise

        script = [
            reply(tool_call("quick"), tool_call("slow", {"n": 1}), tool_call("slow", {"n": 2})),
            reply("never"),
        ]
        agent = Agent(provider=SteppedProvider(script, hold), tools=[slow, quick])
        before = len(anyio.get_running_tasks())
        async with agent.run_stream("go") as stream:
            async for event in stream:
                if isinstance(event, ToolCallReady) and event.name == "slow":
                    await in_tool.wait()
                    stream.cancel()
        return stream.result, stopped, len(anyio.get_running_tasks()) - before

    result, stopped, leftover = run_on(backend, main)
    # Both were cancelled at once, not left to finish (the tool sleeps 30 s, the response
    # never ends on its own).
    assert sorted(stopped) == ["request", "slow 1"]
    assert leftover == 0
    assert result.stop_reason == "cancelled" and result.rounds == 1
    assert result.usage.requests == 0  # the response never completed
    for record in result.tool_calls:
        if record.name == "slow":
            assert (record.is_error, record.output) == (True, CANCELLED_MESSAGE)
        else:  # the quick call may or may not have finished before the cancel
            assert record.output in ("fast", CANCELLED_MESSAGE)
    lint_history(parse_history(result.messages))


@pytest.mark.parametrize("kind", STREAMING)
async def test_cancel_after_turn_lets_the_turn_finish(kind: str, streaming_provider: Any) -> None:
    script = [reply(tool_call("echo", {"value": "a"})), reply("never")]
    model = ScriptedModel(script)
    async with streaming_provider(kind, model) as provider:
        agent = Agent(provider=provider, tools=[echo])
        async with agent.run_stream("go") as stream:
            async for event in stream:
                if isinstance(event, ToolCallReady):
                    stream.cancel(after_turn=True)
    result = stream.result
    assert result is not None and result.stop_reason == "cancelled"
    assert [c.output for c in result.tool_calls] == ["a"] and not result.tool_calls[0].is_error
    assert len(model.requests) == 1 and result.usage.requests == 1
    lint_history(parse_history(result.messages))


@pytest.mark.parametrize("kind", STREAMING)
async def test_an_outer_cancel_scope_hands_over_the_partial_result(
    kind: str, streaming_provider: Any
) -> None:
    in_tool = anyio.Event()

    @tool
    async def hang() -> str:
        in_tool.set()
        await anyio.sleep_forever()
        return "never"

    streams: list[Any] = []
    async with streaming_provider(kind, [reply(text("working"), tool_call("hang"))]) as provider:
        agent = Agent(provider=provider, tools=[hang])

        async def guarded() -> None:
            async with agent.run_stream("go") as stream:
                streams.append(stream)
                async for _ in stream:
                    pass

        async with anyio.create_task_group() as group:
            group.start_soon(guarded)
            with anyio.fail_after(5):
                await in_tool.wait()
            group.cancel_scope.cancel()
    (stream,) = streams
    result = stream.result
    assert result.stop_reason == "cancelled" and result.usage.requests == 1
    assert result.tool_calls[0].output == CANCELLED_MESSAGE
    lint_history(parse_history(result.messages))


POINTS = st.integers(min_value=0, max_value=40)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(cancel_at=POINTS, backend=st.sampled_from(["asyncio", "trio"]), after_turn=st.booleans())
def test_cancelling_anywhere_leaves_a_valid_history(
    cancel_at: int, backend: str, after_turn: bool
) -> None:
    """Cancel after the n-th event: before the request, mid-stream, mid-tool, between rounds."""

    @tool
    async def work(n: int) -> str:
        await anyio.sleep(0.001 * n)
        return f"w{n}"

    script = [
        reply(text("thinking aloud"), tool_call("work", {"n": 1}), tool_call("work", {"n": 3})),
        reply(tool_call("work", {"n": 2}), text("and")),
        reply("end"),
    ]

    async def main() -> tuple[Any, int, list[Any]]:
        model = ScriptedModel(script)
        agent = Agent(provider=SteppedProvider(model), tools=[work])
        tasks_before = len(anyio.get_running_tasks())
        seen: list[Any] = []
        async with agent.run_stream("go") as stream:
            async for event in stream:
                seen.append(event)
                if len(seen) == cancel_at:
                    stream.cancel(after_turn=after_turn)
        assert len(anyio.get_running_tasks()) == tasks_before
        return stream.result, len(model.requests), seen

    threads_before = threading.active_count()
    result, requests, seen = run_on(backend, main)
    assert threading.active_count() <= threads_before
    assert result is not None and isinstance(seen[-1], RunFinished) and seen[-1].result is result
    lint_history(parse_history(result.messages))
    completed = sum(isinstance(e, RoundFinished) for e in seen)
    answered = sum(m["role"] == "assistant" for m in result.messages)
    assert completed <= result.usage.requests <= min(requests, answered)
    uses = [
        b["id"]
        for m in result.messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert [c.tool_use_id for c in result.tool_calls] == uses
    if cancel_at == 0 or cancel_at > len(seen):
        assert result.stop_reason == "end_turn"


CORPUS = Path(__file__).resolve().parent / "corpus" / "anthropic"
if not any(CORPUS.glob("*.json")):  # an error at collection, never a silent skip
    raise FileNotFoundError(f"the recorded corpus is missing: no *.json in {CORPUS}")
STREAMED = sorted(
    (path.stem, n)
    for path in CORPUS.glob("*.json")
    for n, exchange in enumerate(json.loads(path.read_text())["exchanges"])
    if exchange["response_sse"] and exchange["status"] == 200
)


def test_the_corpus_has_streamed_exchanges() -> None:
    assert len(STREAMED) == 14, f"streamed exchanges missing from {CORPUS}"


@pytest.mark.parametrize(("name", "n"), STREAMED, ids=[f"{s}-{n}" for s, n in STREAMED])
async def test_streamed_corpus_gives_the_same_content_through_run_and_run_stream(
    name: str, n: int
) -> None:
    exchange = json.loads((CORPUS / f"{name}.json").read_text())["exchanges"][n]
    request = exchange["request"]
    answer = RawResponse(sse=exchange["response_sse"])
    options = {
        "thinking": request.get("thinking"),
        "tool_choice": request.get("tool_choice"),
        "max_rounds": 1,
        "max_tokens": request["max_tokens"],
    }
    contents = []
    for streamed in (False, True):
        async with MessagesServer(ScriptedModel([answer], lint=False)) as server:
            agent = Agent(provider=AnthropicProvider(server.client(), stream=True), **options)
            if streamed:
                async with agent.run_stream(history=request["messages"]) as stream:
                    events = [e async for e in stream]
                result = stream.result
                assert isinstance(events[-1], RunFinished)
            else:
                result = await agent.run(history=request["messages"])
        assert result is not None
        contents.append(result.messages[len(request["messages"])])
    assert contents[0] == contents[1]
    assert contents[0]["role"] == "assistant"


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_with_parallel_tools_on_both_backends(backend: str) -> None:
    @tool
    async def pause(n: int) -> int:
        await anyio.sleep(0.01)
        return n

    script = [reply(*[tool_call("pause", {"n": i}) for i in range(5)]), reply("done")]

    async def main() -> Any:
        async with MessagesServer(script) as server:
            return await Agent(client=server.client(), tools=[pause]).run("go")

    result = run_on(backend, main)
    assert [c.output for c in result.tool_calls] == [str(i) for i in range(5)]
    assert result.text == "done"


async def test_pause_turn_is_continued_while_streaming() -> None:
    search = {
        "type": "server_tool_use",
        "id": "srvtoolu_01",
        "name": "web_search",
        "input": {"query": "x"},
    }
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": []}
    model = ScriptedModel(
        [reply(text("Searching."), search, stop_reason="pause_turn"), reply(found, text("Found."))]
    )
    agent = Agent(provider=SteppedProvider(model))
    async with agent.run_stream("search") as stream:
        events = [e async for e in stream]
    result = stream.result
    assert (
        result is not None
        and result.stop_reason == "end_turn"
        and result.text == "Searching.Found."
    )
    assert [(e.round, e.stop_reason) for e in events if isinstance(e, RoundFinished)] == [
        (1, "pause_turn"),
        (2, "end_turn"),
    ]
    assert model.requests[1]["messages"][-1]["role"] == "assistant"
