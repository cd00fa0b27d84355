"""The gateway served in this process (uvicorn on a real socket), for what needs a
rendezvous with the gateway's own tool (keep-alive pings while it runs, a client that
goes away mid-run) or a look at the gateway's parts (its upstream transport).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import anyio
import httpx2
import pytest
from _gateway import NOTE, Confidential, echo_lookup, gateway_on, tool_result_text
from support import free_port

from agentloop import tool
from agentloop.errors import ConfigurationError
from agentloop.gateway.app import Gateway, GatewayConfig
from agentloop.gateway.upstream import Transport, Upstream
from agentloop.testing import MessagesServer, RawResponse, reply, tool_call

pytestmark = pytest.mark.timeout(60)


@dataclass
class Served:
    url: str
    upstream: MessagesServer
    started: anyio.Event
    release: anyio.Event
    cancelled: anyio.Event


@asynccontextmanager
async def serve_gateway() -> AsyncIterator[Served]:
    """The gateway on uvicorn in this task's task group (a fixture would cross tasks)."""
    started, release, cancelled = anyio.Event(), anyio.Event(), anyio.Event()

    @tool
    async def wait_here() -> str:
        """Wait until the test lets the call go."""
        started.set()
        try:
            await release.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return "released"

    upstream = MessagesServer([reply("Waiting.", tool_call("wait_here")), reply("Done waiting.")])
    upstream.start()
    config = GatewayConfig(
        upstream=upstream.base_url, store="memory://", tools=[wait_here], ping_interval=0.05
    )
    try:
        async with gateway_on(config) as url:
            try:
                yield Served(url, upstream, started, release, cancelled)
            finally:
                release.set()
    finally:
        upstream.stop()


BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 50,
    "stream": True,
    "messages": [{"role": "user", "content": "Wait for it."}],
}
HEADERS = {"x-api-key": "sk-test"}


async def test_pings_keep_the_stream_alive_while_a_gateway_tool_runs() -> None:
    events: list[str] = []
    async with serve_gateway() as served, httpx2.AsyncClient(timeout=30) as http:
        async with http.stream(
            "POST", served.url + "/v1/messages", json=BODY, headers=HEADERS
        ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("event: "):
                    continue
                events.append(line.removeprefix("event: "))
                if served.started.is_set() and events.count("ping") >= 4:
                    served.release.set()
    before_release = events[: events.index("content_block_start", 3)]
    assert before_release.count("ping") >= 4
    assert events[-2:] == ["message_delta", "message_stop"]
    assert events.count("message_start") == 1


async def test_a_client_that_goes_away_cancels_the_run() -> None:
    async with serve_gateway() as served:
        async with httpx2.AsyncClient(timeout=30) as http:
            async with http.stream(
                "POST", served.url + "/v1/messages", json=BODY, headers=HEADERS
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and served.started.is_set():
                        json.loads(line.removeprefix("data: "))
                        break
        # The connection is closed; the gateway cancels the run and its tool call.
        with anyio.fail_after(10):
            await served.cancelled.wait()
        assert len(served.upstream.requests) == 1, "no further round was asked for"


async def test_a_json_client_that_goes_away_cancels_the_run() -> None:
    async with serve_gateway() as served:
        async with anyio.create_task_group() as group:

            async def ask() -> None:
                async with httpx2.AsyncClient(timeout=30) as http:
                    await http.post(
                        served.url + "/v1/messages", json={**BODY, "stream": False}, headers=HEADERS
                    )

            group.start_soon(ask)
            await served.started.wait()
            group.cancel_scope.cancel()  # the client closes its connection mid-run
        with anyio.fail_after(10):
            await served.cancelled.wait()
        assert len(served.upstream.requests) == 1, "no further round was asked for"


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@pytest.mark.parametrize("recording", [False, True], ids=["no-sdk", "sdk"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_clients_trace_context_reaches_the_run_and_the_upstream(
    recording: bool, stream: bool
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    upstream = MessagesServer([reply(tool_call("lookup", {"key": "k"})), reply("Found it.")])
    upstream.start()
    config = GatewayConfig(
        upstream=upstream.base_url,
        store="memory://",
        tools=[lookup],
        tracer_provider=provider if recording else None,
    )
    headers = {**HEADERS, "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    body = {**BODY, "stream": stream, "messages": [{"role": "user", "content": "Look k up."}]}
    try:
        async with gateway_on(config) as url, httpx2.AsyncClient(timeout=30) as http:
            response = await http.post(url + "/v1/messages", json=body, headers=headers)
            assert response.status_code == 200, response.text
    finally:
        upstream.stop()
    sent = [r.headers.get("traceparent", "") for r in upstream.recorded]
    assert len(sent) == 2 and all(h.split("-")[1] == TRACE_ID for h in sent), sent
    spans = exporter.get_finished_spans()
    if not recording:
        assert spans == ()
        assert all(h.split("-")[2] == CLIENT_SPAN for h in sent)
        return
    (run,) = [s for s in spans if s.name.startswith("invoke_agent")]
    assert format(run.context.trace_id, "032x") == TRACE_ID
    assert run.parent is not None and format(run.parent.span_id, "016x") == CLIENT_SPAN
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert {h.split("-")[2] for h in sent} == {format(c.context.span_id, "016x") for c in chats}
    assert [s.name for s in spans if s.name.startswith("execute_tool")] == ["execute_tool lookup"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_capability_wraps_each_upstream_request_and_gateway_tool_call(
    stream: bool,
) -> None:
    upstream = MessagesServer(echo_lookup).start()
    config = GatewayConfig(
        upstream=upstream.base_url, store="memory://", tools=[lookup], capabilities=[Confidential()]
    )
    try:
        async with gateway_on(config) as url:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-test", max_retries=0)
            request: dict[str, Any] = {
                "model": "m",
                "max_tokens": 50,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "What is k?"}],
            }
            if stream:
                async with client.messages.stream(**request) as streamed:
                    message = await streamed.get_final_message()
            else:
                message = await client.messages.create(**request)
            await client.close()
    finally:
        upstream.stop()
    # The upstream got the capability's request and the tool's result as it left it ...
    first, second = upstream.requests
    assert first["system"] == f"Be brief. {NOTE}"
    assert tool_result_text(second) == "[masked] of k"
    # ... and the client the answer to that: its text says what the upstream was given.
    assert [b.text for b in message.content if b.type == "text"][-1] == (
        "The table says: [masked] of k"
    )


def test_capabilities_must_be_capabilities() -> None:
    with pytest.raises(ConfigurationError, match="capabilities: str is not a Capability"):
        Gateway(GatewayConfig(upstream="http://127.0.0.1:9", capabilities=["redact"]))  # type: ignore[list-item]


async def test_an_unreachable_upstream_is_a_502_for_every_route() -> None:
    config = GatewayConfig(upstream=f"http://127.0.0.1:{free_port()}", store="memory://")
    headers = {"x-api-key": "sk-client-a", "anthropic-version": "2023-06-01"}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with gateway_on(config) as url, httpx2.AsyncClient(timeout=30) as http:
        answers = [
            await http.post(url + "/v1/messages", json=body, headers=headers),
            await http.post(url + "/v1/messages/count_tokens", json=body, headers=headers),
            await http.get(url + "/v1/models", headers=headers),
        ]
    for answer in answers:
        assert answer.status_code == 502, answer.text
        assert answer.json()["type"] == "error"
        assert answer.json()["error"]["type"] == "api_error"
        assert answer.headers["request-id"].startswith("req_")


def test_the_upstream_transport_is_aiohttp_on_asyncio_and_httpx_elsewhere() -> None:
    async def pool(transport: Transport) -> httpx2.AsyncClient:
        upstream = Upstream("http://127.0.0.1:9", transport=transport)
        await upstream.aclose()
        return upstream.http

    assert isinstance(anyio.run(pool, "auto"), anthropic.DefaultAioHttpClient)
    assert isinstance(anyio.run(pool, "aiohttp"), anthropic.DefaultAioHttpClient)
    assert isinstance(anyio.run(pool, "httpx"), anthropic.DefaultAsyncHttpxClient)
    assert isinstance(anyio.run(pool, "auto", backend="trio"), anthropic.DefaultAsyncHttpxClient)
    with pytest.raises(ConfigurationError, match="asyncio only"):
        anyio.run(pool, "aiohttp", backend="trio")


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_either_upstream_transport_carries_errors_hidden_rounds_and_streams(
    transport: Transport,
) -> None:
    refused = RawResponse(
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        headers={"retry-after": "0", "anthropic-ratelimit-requests-remaining": "0"},
    )
    upstream = MessagesServer(
        [
            refused,
            reply(tool_call("lookup", {"key": "k"})),
            reply("Found it."),
            reply(tool_call("lookup", {"key": "s"})),
            reply("Streamed it."),
        ]
    ).start()
    gateway = Gateway(
        GatewayConfig(
            upstream=upstream.base_url,
            store="memory://",
            tools=[lookup],
            upstream_transport=transport,
        )
    )
    ask: dict[str, Any] = {
        "model": "m",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "Look it up."}],
    }
    try:
        async with gateway_on(gateway) as url:
            kind = (
                anthropic.DefaultAioHttpClient
                if transport == "aiohttp"
                else anthropic.DefaultAsyncHttpxClient
            )
            assert gateway.upstream is not None and isinstance(gateway.upstream.http, kind)
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-test", max_retries=0)
            async with client:
                with pytest.raises(anthropic.APIStatusError) as caught:
                    await client.messages.create(**ask)
                answer = await client.messages.create(**ask)
                async with client.messages.stream(**ask) as stream:
                    streamed = await stream.get_final_message()
    finally:
        upstream.stop()
    assert caught.value.status_code == 529
    assert caught.value.response.headers["retry-after"] == "0"
    assert caught.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text == "Found it."
    assert streamed.content[-1].type == "text" and streamed.content[-1].text == "Streamed it."
    assert answer.usage.output_tokens > 0 and streamed.stop_reason == "end_turn"
    # Each client request's hidden round reached the upstream answered, in a valid history.
    last = upstream.recorded[-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert last[-1]["content"][0]["content"] == "value of s"


def test_a_tool_that_requires_approval_is_refused_by_the_gateway() -> None:
    @tool(requires_approval=True)
    def pay(to: str) -> str:
        """Pay someone."""
        return "paid"

    config = GatewayConfig(
        upstream=f"http://127.0.0.1:{free_port()}", store="memory://", tools=[pay]
    )
    with pytest.raises(ConfigurationError, match="pay require approval, and the gateway"):
        Gateway(config)
