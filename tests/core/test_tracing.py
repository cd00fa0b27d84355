"""OpenTelemetry spans by the GenAI conventions: the span tree of a run, with the SDK's
in-memory exporter."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="opentelemetry-sdk is not installed (the dev extra)"
)

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agentloop import Agent, AnthropicProvider, ToolError, tool
from agentloop.testing import MessagesServer, ScriptedProvider, SteppedProvider, reply, tool_call
from agentloop.tracing import CAPTURE_CONTENT_ENV


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@tool
async def echo(value: str) -> str:
    """Echo a value."""
    return value


@tool
async def broken() -> str:
    """Always fails."""
    raise ToolError("no luck")


@tool(timeout=0.05)
async def slow() -> str:
    """Never finishes in time."""
    await anyio.sleep(10)
    return "late"


async def test_a_run_with_parallel_calls_gives_the_span_tree(spans: Any) -> None:
    provider, exporter = spans
    calls = [tool_call("echo", {"value": str(i)}) for i in range(3)]
    script = [reply(*calls), reply("done")]
    agent = Agent(
        provider=ScriptedProvider(script), tools=[echo], tracer_provider=provider, name="helper"
    )
    result = await agent.run("go")
    found = by_name(exporter)
    (run,) = found["invoke_agent helper"]
    chats = found["chat claude-sonnet-5-5"]
    tools = found["execute_tool echo"]
    assert len(chats) == 2 and len(tools) == 3
    assert all(parent_of(s) == run.context.span_id for s in [*chats, *tools])
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.provider.name"] == "scripted"
    assert run.attributes["gen_ai.conversation.id"] == result.run_id
    assert run.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens
    first = chats[0].attributes
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "claude-sonnet-5-5"
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.usage.cache_read.input_tokens" in first
    ids = {s.attributes["gen_ai.tool.call.id"] for s in tools}
    assert ids == {c["id"] for c in calls}
    assert all(s.status.status_code is not StatusCode.ERROR for s in tools)
    assert not any("gen_ai.input.messages" in s.attributes for s in chats)  # opt-in only


async def test_failed_and_timed_out_calls_carry_an_error_type(spans: Any) -> None:
    provider, exporter = spans
    script = [reply(tool_call("broken", {}), tool_call("slow", {})), reply("done")]
    agent = Agent(provider=ScriptedProvider(script), tools=[broken, slow], tracer_provider=provider)
    await agent.run("go")
    found = by_name(exporter)
    for name in ("execute_tool broken", "execute_tool slow"):
        (span,) = found[name]
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "tool_error"


async def test_a_cancelled_run_ends_its_spans_as_cancelled(spans: Any) -> None:
    provider, exporter = spans
    started = anyio.Event()

    @tool
    async def hang() -> str:
        """Wait forever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    agent = Agent(
        provider=ScriptedProvider([reply(tool_call("hang", {}))]),
        tools=[hang],
        tracer_provider=provider,
    )
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run, "go")
        await started.wait()
        group.cancel_scope.cancel()
    found = by_name(exporter)
    ((run,), (call,)) = found["invoke_agent agentloop"], found["execute_tool hang"]
    assert run.attributes["error.type"] == "cancelled"
    assert call.attributes["error.type"] == "cancelled"
    assert run.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)


async def test_a_streamed_run_has_the_same_tree(spans: Any) -> None:
    provider, exporter = spans
    script = [
        reply(tool_call("echo", {"value": "a"}), tool_call("echo", {"value": "b"})),
        reply("ok"),
    ]
    agent = Agent(provider=SteppedProvider(script), tools=[echo], tracer_provider=provider)
    async with agent.run_stream("go") as stream:
        async for _ in stream:
            pass
    found = by_name(exporter)
    (run,) = found["invoke_agent agentloop"]
    assert len(found["execute_tool echo"]) == 2 and len(found["chat claude-sonnet-5-5"]) == 2
    assert all(
        parent_of(s) == run.context.span_id
        for s in found["execute_tool echo"] + found["chat claude-sonnet-5-5"]
    )


async def test_the_sdks_own_span_nests_in_the_chat_span(
    spans: Any, serve: Callable[..., MessagesServer]
) -> None:
    provider, exporter = spans
    server = serve([reply("hi")])
    client = server.client(open_telemetry={"tracer_provider": provider})
    agent = Agent(provider=AnthropicProvider(client), tracer_provider=provider)
    await agent.run("go")
    found = by_name(exporter)
    (chat,) = found["chat claude-sonnet-5-5"]
    (sdk,) = found["anthropic.messages.create"]
    assert parent_of(sdk) == chat.context.span_id
    assert chat.attributes["gen_ai.provider.name"] == "anthropic"
    # The request goes through `messages.create`, so the SDK's span reads the response as
    # the SDK does: its usage is the chat span's, and it adds the transport's view.
    for name in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        assert sdk.attributes[name] == chat.attributes[name]
    assert sdk.attributes["http.response.status_code"] == 200
    assert server.recorded[0].headers.get("traceparent", "").split("-")[1] == format(
        chat.context.trace_id, "032x"
    )


async def test_content_is_recorded_only_when_asked(
    spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    script = [reply(tool_call("echo", {"value": "secret"})), reply("done")]
    agent = Agent(provider=ScriptedProvider(script), tools=[echo], tracer_provider=provider)
    await agent.run("go")
    found = by_name(exporter)
    (call,) = found["execute_tool echo"]
    assert '"secret"' in call.attributes["gen_ai.tool.call.arguments"]
    assert call.attributes["gen_ai.tool.call.result"] == "secret"
    assert "go" in found["chat claude-sonnet-5-5"][0].attributes["gen_ai.input.messages"]


async def test_without_a_tracer_provider_nothing_is_recorded() -> None:
    agent = Agent(provider=ScriptedProvider([reply("hi")]))
    result = await agent.run("go")
    assert result.text == "hi"
