"""Prompt caching by default: breakpoints on the wire that move with the history.

Runs go through the real SDK to `MessagesServer`, which refuses what the API refuses (more
than four breakpoints, TTLs out of order) and, with `prompt_cache=True`, bills each request
as the API's caching would.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from agentloop import Agent, AnthropicProvider, OpenAIChatProvider, tool
from agentloop.errors import ConfigurationError
from agentloop.events import RoundFinished
from agentloop.messages import Message, parse_history
from agentloop.providers.base import ModelRequest
from agentloop.providers.caching import with_breakpoints
from agentloop.testing import ChatCompletionsServer, MessagesServer, reply, tool_call
from agentloop.testing.scripted import cache_markers

MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
SYSTEM = "You answer with the tools you have. " * 150  # ~1350 tokens: cacheable


@tool
def echo(value: str) -> str:
    """Say a value back."""
    return value


@tool
def shout(value: str) -> str:
    """Say a value back, loudly."""
    return value.upper()


def loop_script(rounds: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A model that calls `echo` until it has made `rounds` requests, then answers."""
    seen = {"n": 0}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        seen["n"] += 1
        if seen["n"] < rounds:
            return reply("Looking.", tool_call("echo", {"value": f"v{seen['n']}" * 40}))
        return reply("done")

    return answer


def markers_at(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Where a request body's cache_control markers are: ("system", i), ("message", m, b), ..."""
    found: list[tuple[Any, ...]] = []
    for i, t in enumerate(body.get("tools") or []):
        if "cache_control" in t:
            found.append(("tool", i, t["cache_control"]))
    system = body.get("system")
    for i, b in enumerate(system if isinstance(system, list) else []):
        if "cache_control" in b:
            found.append(("system", i, b["cache_control"]))
    for m, message in enumerate(body["messages"]):
        content = message["content"]
        for b, block in enumerate(content if isinstance(content, list) else []):
            if "cache_control" in block:
                found.append(("message", m, b, block["cache_control"]))
    return found


def last_block(body: dict[str, Any], m: int) -> tuple[str, int, int, dict[str, Any]]:
    return ("message", m, len(body["messages"][m]["content"]) - 1, MARK)


def has_marker(value: Any) -> bool:
    return "cache_control" in json.dumps(value)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_tool_loop_sends_breakpoints_that_move_with_the_history(stream: bool) -> None:
    async with MessagesServer(loop_script(4)) as server:
        provider = AnthropicProvider(server.client(), stream=stream)
        agent = Agent(provider=provider, system=SYSTEM, tools=[echo, shout])
        result = await agent.run("Echo things.")
    assert result.text == "done" and len(server.requests) == 4
    first, *later = server.requests
    assert markers_at(first) == [("system", 0, MARK), last_block(first, 0)]
    for body in later:
        n = len(body["messages"])
        # the newest message, the system prompt, and where the previous round's tail was
        assert markers_at(body) == [
            ("system", 0, MARK),
            last_block(body, n - 3),
            last_block(body, n - 1),
        ]
    # what the user gets back is the history as it was: no marker anywhere
    assert not has_marker(result.messages)
    assert result.messages[0] == {"role": "user", "content": "Echo things."}


async def test_without_a_system_prompt_the_tools_are_marked() -> None:
    async with MessagesServer(loop_script(2)) as server:
        await Agent(client=server.client(), tools=[echo, shout]).run("go")
    body = server.requests[0]
    assert [m[:2] for m in markers_at(body)] == [("tool", 1), ("message", 0)]
    assert "cache_control" not in body["tools"][0]


async def test_the_users_markers_are_kept_and_count_against_the_four() -> None:
    system = [
        {"type": "text", "text": "Rules, part one.", "cache_control": MARK},
        {"type": "text", "text": "Rules, part two."},
    ]
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Earlier", "cache_control": MARK}]},
        {"role": "assistant", "content": "Noted."},
    ]
    marked_tool = {
        "name": "lookup",
        "description": "Look up.",
        "input_schema": {"type": "object"},
        "cache_control": MARK,
    }
    async with MessagesServer(loop_script(2)) as server:
        agent = Agent(client=server.client(), system=system, tools=[echo])
        result = await agent.run("go", history=history, external_tools=[marked_tool])
    assert result.text == "done"
    for body in server.requests:
        assert cache_markers(body) <= 4
        found = markers_at(body)
        assert ("tool", 1, MARK) in found and ("system", 0, MARK) in found
        assert ("message", 0, 0, MARK) in found
        assert found[-1] == last_block(body, len(body["messages"]) - 1)
        assert len(found) == 4
    assert result.messages[: len(history)] == history  # the user's markers, as given


async def test_four_markers_of_the_users_leave_no_room() -> None:
    system = [{"type": "text", "text": f"part {i}", "cache_control": MARK} for i in range(4)]
    async with MessagesServer([reply("ok")]) as server:
        await Agent(client=server.client(), system=system).run("go")
    (body,) = server.requests
    assert cache_markers(body) == 4
    assert body["messages"] == [{"role": "user", "content": "go"}]


async def test_a_top_level_cache_control_of_the_users_is_counted_and_not_doubled() -> None:
    system = [{"type": "text", "text": f"part {i}", "cache_control": MARK} for i in range(2)]
    async with MessagesServer(loop_script(2)) as server:
        agent = Agent(
            client=server.client(), system=system, tools=[echo], params={"cache_control": MARK}
        )
        assert (await agent.run("go")).text == "done"  # the server counts five as a 400
    second = server.requests[1]
    assert second["cache_control"] == MARK
    # the automatic breakpoint marks the tail; ours goes where the previous tail was
    assert markers_at(second) == [("system", 0, MARK), ("system", 1, MARK), last_block(second, 0)]


async def test_one_hour_breakpoints_keep_the_apis_ttl_order() -> None:
    async with MessagesServer(loop_script(2)) as server:
        agent = Agent(client=server.client(), system=SYSTEM, tools=[echo], cache="1h")
        await agent.run("go")
    assert {m[-1]["ttl"] for m in markers_at(server.requests[1])} == {"1h"}
    # A user's 5-minute marker first: a 1-hour one after it would be refused, so none is.
    system = [{"type": "text", "text": "Rules.", "cache_control": MARK}]
    async with MessagesServer([reply("ok")]) as server:
        await Agent(client=server.client(), system=system, cache="1h").run("go")
    assert markers_at(server.requests[0]) == [("system", 0, MARK)]


async def test_cache_off_sends_no_marker() -> None:
    async with MessagesServer(loop_script(3)) as server:
        await Agent(client=server.client(), system=SYSTEM, tools=[echo], cache="off").run("go")
    assert not any(has_marker(body) for body in server.requests)


def test_an_unknown_cache_setting_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="cache must be"):
        Agent(cache="forever")  # type: ignore[arg-type]


def test_blocks_that_cannot_carry_a_marker_are_stepped_over() -> None:
    thinking = {"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"}
    redacted = {"type": "redacted_thinking", "data": "ZGF0YQ=="}
    messages = parse_history(
        [
            {"role": "user", "content": [{"type": "text", "text": "Question"}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}, thinking, redacted]},
        ]
    )
    request = ModelRequest("m", messages, 100, cache=MARK)
    body = with_breakpoints(request).to_wire()
    assert markers_at(body) == [("message", 0, 0, MARK)]
    assert request.messages[0] is messages[0] and not has_marker(request.to_wire())


def test_a_history_with_nothing_markable_is_sent_as_it_is() -> None:
    messages = [Message(role="user", content="")]
    request = ModelRequest("m", messages, 100, cache=MARK)
    assert with_breakpoints(request) is request


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_cached_loop_reads_the_history_back_and_usage_sums_it(stream: bool) -> None:
    async with MessagesServer(loop_script(5), prompt_cache=True) as server:
        provider = AnthropicProvider(server.client(), stream=stream)
        agent = Agent(provider=provider, system=SYSTEM, tools=[echo])
        async with agent.run_stream("go") as stream:
            rounds = [e.usage async for e in stream if isinstance(e, RoundFinished)]
    usage = stream.result.usage
    assert usage.requests == len(rounds) == 5
    first, *later = rounds
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 1024
    for before, now in zip(rounds, later, strict=False):
        # each round reads everything the round before had cached, and writes only the rest
        assert now.cache_read_input_tokens == (
            before.cache_read_input_tokens + before.cache_creation_input_tokens
        )
        assert 0 < now.cache_creation_input_tokens < 200 and now.input_tokens == 0
    for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        assert getattr(usage, field) == sum(getattr(r, field) for r in rounds)


async def test_chat_completions_get_no_marker_and_a_stable_prefix() -> None:
    async with ChatCompletionsServer(loop_script(4), strict=True) as server:
        provider = OpenAIChatProvider(server.client())
        agent = Agent(provider=provider, system=SYSTEM, tools=[echo, shout])
        await agent.run("go")
    bodies = server.requests
    assert len(bodies) == 4 and not any(has_marker(b) for b in bodies)
    for before, after in itertools.pairwise(bodies):
        assert after["tools"] == before["tools"]
        assert after["messages"][: len(before["messages"])] == before["messages"]


async def test_spans_carry_the_cache_tokens_and_one_hour_writes_are_counted_apart() -> None:
    pytest.importorskip(
        "opentelemetry.sdk", reason="opentelemetry-sdk is not installed (the dev extra)"
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    async with MessagesServer(loop_script(3), prompt_cache=True) as server:
        agent = Agent(
            client=server.client(), system=SYSTEM, tools=[echo], cache="1h", tracer_provider=tracer
        )
        result = await agent.run("go")
    tracer.shutdown()
    usage = result.usage
    assert usage.cache_creation_1h_input_tokens == usage.cache_creation_input_tokens > 0
    spans = {s.name: s for s in exporter.get_finished_spans()}
    run = spans["invoke_agent agentloop"].attributes
    assert run is not None
    assert run["gen_ai.usage.cache_read.input_tokens"] == usage.cache_read_input_tokens > 0
    assert run["gen_ai.usage.cache_creation.input_tokens"] == usage.cache_creation_input_tokens
    # the conventions count cached tokens in the input tokens too
    assert run["gen_ai.usage.input_tokens"] == (
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    )
    chats = [s.attributes for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert sum(c["gen_ai.usage.cache_read.input_tokens"] for c in chats if c) == (
        usage.cache_read_input_tokens
    )
