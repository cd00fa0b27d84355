"""The local Messages-API server: SSE the SDK parses, paced streams, and faults on the wire."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anthropic
import anyio
import httpx2
import pytest

from agentloop import AnthropicProvider, ProviderError
from agentloop.errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    CreditBalanceError,
    InvalidResponseError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import Message
from agentloop.providers.base import ModelRequest
from agentloop.testing import (
    Fault,
    MessagesServer,
    Paced,
    RawResponse,
    ScriptedProvider,
    reply,
    text,
    tool_call,
)
from agentloop.testing.server import count_tokens

Serve = Callable[[Any], MessagesServer]  # the `serve` fixture of conftest.py
ASK: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi"}],
}

THINKING = {"type": "thinking", "thinking": "Let me think " * 5, "signature": "EqQBCkYIBxgCKkA0=="}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5"}
SEARCH = {
    "type": "server_tool_use",
    "id": "srvtoolu_01abc",
    "name": "web_search",
    "input": {"query": "weather in Paris"},
}
FOUND = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01abc",
    "content": [
        {
            "type": "web_search_result",
            "url": "https://example.com",
            "title": "Example",
            "encrypted_content": "abc",
            "page_age": None,
        }
    ],
}
EVERY_BLOCK = reply(
    THINKING,
    REDACTED,
    text("A fairly long text block that spans several deltas of sixteen characters."),
    SEARCH,
    FOUND,
    tool_call("lookup", {"key": "a", "nested": {"list": [1, 2, {"deep": 'é\n"q"'}]}}),
    tool_call("noargs"),
)


async def stream_timed(client: Any) -> tuple[list[tuple[float, Any]], Any]:
    """Stream ASK; return each SDK event with its arrival time (from the request), and the message."""
    started = time.monotonic()
    events: list[tuple[float, Any]] = []
    async with client.messages.stream(**ASK) as stream:
        async for event in stream:
            events.append((time.monotonic() - started, event))
        final = await stream.get_final_message()
    return events, final


def content(message: Any) -> list[dict[str, Any]]:
    return [block.to_dict(mode="json") for block in message.content]


# -- SSE that the SDK parses


@pytest.mark.parametrize("paced", [False, True], ids=["content-length", "chunked"])
async def test_every_block_kind_streams_to_the_same_content(serve: Serve, paced: bool) -> None:
    item: Any = Paced(EVERY_BLOCK) if paced else EVERY_BLOCK
    server = serve([item, item])
    client = server.client()
    _, streamed = await stream_timed(client)
    whole = await client.messages.create(**ASK)
    assert content(streamed) == EVERY_BLOCK["content"]
    assert content(whole) == EVERY_BLOCK["content"]
    assert streamed.stop_reason == "tool_use" and streamed.usage.output_tokens == 5


async def test_stream_text_arrives_in_deltas_with_the_stop_reason(serve: Serve) -> None:
    server = serve([reply("x" * 40, stop_reason="max_tokens")])
    events, final = await stream_timed(server.client())
    deltas = [e for _, e in events if e.type == "content_block_delta"]
    assert [d.delta.text for d in deltas] == ["x" * 16, "x" * 16, "x" * 8]
    assert final.stop_reason == "max_tokens"


# -- Paced


async def test_paced_stream_closes_each_tool_use_block_as_it_is_written(serve: Serve) -> None:
    calls = [tool_call("work", {"k": k}) for k in range(3)]
    server = serve([Paced(reply(*calls), first_delay=0.1, block_delay=0.2)])
    events, final = await stream_timed(server.client())
    start = next(t for t, e in events if e.type == "message_start")
    stops = [t for t, e in events if e.type == "content_block_stop"]
    end = next(t for t, e in events if e.type == "message_stop")
    assert 0.08 <= start < 0.6
    assert len(stops) == 3
    assert 0.16 <= stops[0] - start < 0.6
    assert end - stops[0] >= 0.35  # two more blocks of 0.2 s still to come
    assert 0.55 <= end - start < 2.0
    assert all(b - a >= 0.16 for a, b in itertools.pairwise(stops))
    assert [b.id for b in final.content] == [c["id"] for c in calls]


async def test_paced_chunk_delay_paces_every_delta(serve: Serve) -> None:
    paced = Paced(reply("y" * 64), chunk_delay=0.05)  # four deltas
    assert paced.total_delay == pytest.approx(0.2)
    server = serve([paced])
    events, _ = await stream_timed(server.client())
    times = [t for t, e in events if e.type == "content_block_delta"]
    assert len(times) == 4 and times[-1] - times[0] >= 0.12


async def test_paced_without_streaming_answers_after_the_whole_delay(serve: Serve) -> None:
    message = reply(tool_call("a"), tool_call("b"))
    server = serve([Paced(message, first_delay=0.1, block_delay=0.15)])
    started = time.monotonic()
    answer = await server.client().messages.create(**ASK)
    assert 0.35 <= time.monotonic() - started < 2.0
    assert content(answer) == message["content"]


def test_paced_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Paced(reply("x"), block_delay=-1)
    with pytest.raises(TypeError, match="expected a message"):
        Paced(RawResponse(500))


async def test_scripted_provider_waits_for_a_paced_answer() -> None:
    provider = ScriptedProvider([Paced(reply("late"), first_delay=0.2)])
    request = ModelRequest(model="m", messages=[Message.user("hi")], max_tokens=10)
    started = time.monotonic()
    response = await provider.complete(request)
    assert response.text == "late" and time.monotonic() - started >= 0.18


# -- Faults, as the SDK sees them (no retries)

SDK_FAULTS = [
    pytest.param(Fault.rate_limited(retry_after=0.2), anthropic.RateLimitError, id="429"),
    pytest.param(Fault.server_error(), anthropic.InternalServerError, id="500"),
    pytest.param(Fault.overloaded(), anthropic.OverloadedError, id="529"),
    pytest.param(Fault.http_error(400), anthropic.BadRequestError, id="400"),
    pytest.param(Fault.http_error(401), anthropic.AuthenticationError, id="401"),
    pytest.param(Fault.http_error(403), anthropic.PermissionDeniedError, id="403"),
    pytest.param(Fault.http_error(404), anthropic.NotFoundError, id="404"),
    pytest.param(Fault.http_error(413), anthropic.ContentTooLargeError, id="413"),
    pytest.param(Fault.dropped(), anthropic.APIConnectionError, id="dropped"),
    pytest.param(Fault.slow(2.0), anthropic.APITimeoutError, id="slow"),
    pytest.param(Fault.malformed_json(), json.JSONDecodeError, id="malformed-json"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("fault", "expected"), SDK_FAULTS)
async def test_each_fault_is_the_sdk_exception(
    serve: Serve, fault: Fault, expected: type[Exception], stream: bool
) -> None:
    server = serve([fault])
    client = server.client(timeout=0.3)
    with pytest.raises(expected) as info:
        if stream:
            await stream_timed(client)
        else:
            await client.messages.create(**ASK)
    assert type(info.value) is expected
    if isinstance(info.value, anthropic.APIStatusError):
        assert info.value.status_code == fault.status
        assert info.value.body == fault.error_body
    assert len(server.requests) == 1


async def test_retry_after_header_is_sent(serve: Serve) -> None:
    server = serve([Fault.rate_limited(retry_after=0.25)])
    with pytest.raises(anthropic.RateLimitError) as info:
        await server.client().messages.create(**ASK)
    assert info.value.response.headers["retry-after"] == "0.25"


MIDWAY = reply("Working on it.", tool_call("lookup", {"key": "a"}), tool_call("lookup"))


async def test_stream_ending_early_drops_the_connection_mid_body(serve: Serve) -> None:
    server = serve([Fault.stream_ends_early(MIDWAY, after_blocks=2)])
    events: list[Any] = []
    with pytest.raises(httpx2.RemoteProtocolError):  # the SDK does not wrap it
        async with server.client().messages.stream(**ASK) as stream:
            async for event in stream:
                events.append(event)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds.count("content_block_stop") == 2
    assert "message_stop" not in kinds and "message_delta" not in kinds


async def test_stream_ending_cleanly_without_message_stop(serve: Serve) -> None:
    server = serve([Fault.stream_ends_early(MIDWAY, after_blocks=1, clean_end=True)])
    events, final = await stream_timed(server.client())
    assert [e.type for _, e in events][-1] == "content_block_stop"
    assert final.stop_reason is None and content(final) == MIDWAY["content"][:1]


@pytest.mark.parametrize("after_blocks", [0, 2])
async def test_stream_error_event_mid_stream(serve: Serve, after_blocks: int) -> None:
    server = serve([Fault.stream_error(MIDWAY, after_blocks=after_blocks)])
    events: list[Any] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        async with server.client().messages.stream(**ASK) as stream:
            async for event in stream:
                events.append(event)
    # The error arrives on a 200 response, so the SDK cannot pick a status class.
    assert type(info.value) is anthropic.APIStatusError and info.value.status_code == 200
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert [e.type for e in events].count("content_block_stop") == after_blocks


async def test_stream_faults_asked_without_streaming(serve: Serve) -> None:
    server = serve([Fault.stream_error(MIDWAY), Fault.stream_ends_early(MIDWAY)])
    client = server.client()
    with pytest.raises(anthropic.OverloadedError):
        await client.messages.create(**ASK)
    with pytest.raises(anthropic.APIConnectionError):
        await client.messages.create(**ASK)


async def test_slow_answer_arrives_late_but_whole(serve: Serve) -> None:
    server = serve([Fault.slow(0.3, reply("finally"))])
    started = time.monotonic()
    answer = await server.client().messages.create(**ASK)
    assert answer.content[0].text == "finally" and time.monotonic() - started >= 0.28


async def test_request_times_are_recorded(serve: Serve) -> None:
    server = serve([Fault.rate_limited(retry_after=0.2), reply("ok")])
    answer = await server.client(max_retries=1).messages.create(**ASK)
    assert answer.content[0].text == "ok"
    first, second = server.request_times
    assert second - first >= 0.18


async def test_stopping_cuts_a_slow_answer_short() -> None:
    arrived = threading.Event()

    def script(body: dict[str, Any]) -> Fault:
        arrived.set()
        return Fault.slow(30.0)

    server = MessagesServer(script).start()
    client = server.client()
    failures: list[Exception] = []

    async def ask() -> None:
        try:
            await client.messages.create(**ASK)
        except anthropic.APIConnectionError as exc:
            failures.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            assert await anyio.to_thread.run_sync(arrived.wait, 5)
            started = time.monotonic()
            server.stop()
            stopped = time.monotonic() - started
    await client.close()
    assert stopped < 2 and len(failures) == 1


# -- Faults in process


FAULTS = [
    (Fault.rate_limited(retry_after=None), RateLimitError),
    (Fault.server_error(), ServerError),
    (Fault.overloaded(), OverloadedError),
    (Fault.stream_error(), OverloadedError),
    (Fault.http_error(400), BadRequestError),
    (Fault.http_error(401), AuthenticationError),
    (Fault.http_error(402, "billing_error"), CreditBalanceError),
    (Fault.http_error(404), BadRequestError),
    (Fault.dropped(), APIConnectionError),
    (Fault.stream_ends_early(), APIConnectionError),
    (Fault.malformed_json(), InvalidResponseError),
]


def _fault_id(value: Any) -> Any:
    return getattr(value, "kind", None) and f"{value.kind}-{value.status}"


@pytest.mark.parametrize(("fault", "expected"), FAULTS, ids=_fault_id)
async def test_scripted_provider_raises_the_error_a_fault_stands_for(
    fault: Fault, expected: type[ProviderError]
) -> None:
    request = ModelRequest(model="m", messages=[Message.user("hi")], max_tokens=10)
    with pytest.raises(expected) as info:
        await ScriptedProvider([fault]).complete(request)
    assert type(info.value) is expected


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("fault", "expected"), FAULTS, ids=_fault_id)
async def test_the_real_provider_over_http_raises_the_same_error_as_the_double(
    fault: Fault, expected: type[ProviderError], stream: bool, serve: Any
) -> None:
    server = serve([fault])
    request = ModelRequest(model="m", messages=[Message.user("hi")], max_tokens=10)
    provider = AnthropicProvider(server.client(), stream=stream)
    with pytest.raises(ProviderError) as info:
        await provider.complete(request)
    if fault.kind == "stream_error" and not stream:
        assert type(info.value) is OverloadedError  # asked without streaming: a 529
    elif fault.kind == "stream_ends_early" and not stream:
        assert type(info.value) is APIConnectionError  # a dropped connection
    else:
        assert type(info.value) is expected


async def test_scripted_provider_answers_a_slow_fault_late() -> None:
    request = ModelRequest(model="m", messages=[Message.user("hi")], max_tokens=10)
    started = time.monotonic()
    response = await ScriptedProvider([Fault.slow(0.1, "late")]).complete(request)
    assert response.text == "late" and time.monotonic() - started >= 0.09


async def test_models_are_listed_and_paged_as_the_api_pages_them() -> None:
    async with MessagesServer([], models=["claude-a", "claude-b", "claude-c"]) as server:
        client = server.client()
        first = await client.models.list(limit=2)
        rest = await client.models.list(limit=2, after_id="claude-b")
        every = [m.id async for m in await client.models.list(limit=1)]
        with pytest.raises(anthropic.NotFoundError):
            await client.models.retrieve("claude-z")
    assert [m.id for m in first.data] == ["claude-a", "claude-b"] and first.has_more
    assert [m.id for m in rest.data] == ["claude-c"] and not rest.has_more
    assert every == ["claude-a", "claude-b", "claude-c"]
    assert server.requests == [], "only message requests are model requests"


async def test_count_tokens_lints_and_counts_without_using_the_script() -> None:
    hi = [{"role": "user", "content": "hi"}]
    async with MessagesServer([reply("ok")]) as server:
        client = server.client()
        counted = await client.messages.count_tokens(model="m", messages=hi, system="Be brief.")
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.count_tokens(
                model="m", messages=[{"role": "assistant", "content": "first?"}, *hi]
            )
        answered = await client.messages.create(model="m", max_tokens=5, messages=hi)
    body = {"model": "m", "messages": hi, "system": "Be brief."}
    assert counted.input_tokens == count_tokens(body)
    assert count_tokens(body) == -(
        -len('{"messages":[{"content":"hi","role":"user"}],"system":"Be brief."}') // 4
    )
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert answered.content[0].text == "ok"
    assert [r.path for r in server.recorded] == [
        "/v1/messages/count_tokens",
        "/v1/messages/count_tokens",
        "/v1/messages",
    ]
