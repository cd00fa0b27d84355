"""Requests the API refuses are refused the same way, never answered 500 or accepted.

The gateway served in this process; the upstream is the scripted Messages server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anthropic
import anyio
import httpx2
import pytest
from _gateway import gateway_on

from agentloop import tool
from agentloop.gateway.app import GatewayConfig
from agentloop.testing import MessagesServer, RawResponse, reply, sse_events, tool_call

pytestmark = pytest.mark.timeout(60)

HEADERS = {"x-api-key": "sk-a", "content-type": "application/json"}
MESSAGES = ("/v1/messages",)
BOTH = ("/v1/messages", "/v1/messages/count_tokens")


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@asynccontextmanager
async def served(*script: Any) -> AsyncIterator[tuple[str, MessagesServer]]:
    """The gateway (in this task: a fixture would cross tasks) and its upstream."""
    upstream = MessagesServer(list(script)).start()
    config = GatewayConfig(upstream=upstream.base_url, store="memory://", tools=[lookup])
    try:
        async with gateway_on(config) as url:
            yield url, upstream
    finally:
        upstream.stop()


def ask(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def deep_tool_input(depth: int) -> bytes:
    """A history whose tool input nests `depth` objects (written as text: too deep for
    `json.dumps`)."""
    call = tool_call("lookup", {"key": "DEEP"})
    body = ask(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [call]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "x"}],
            },
        ]
    )
    deep = '{"x":' * depth + "1" + "}" * depth
    return json.dumps(body).replace('"DEEP"', deep).encode()


@pytest.mark.parametrize(
    ("body", "headers", "paths"),
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, {}, BOTH, id="json-100000-deep"),
        pytest.param(deep_tool_input(900), {}, BOTH, id="tool-input-900-deep"),
        pytest.param(deep_tool_input(3000), {}, BOTH, id="tool-input-3000-deep"),
        pytest.param(json.dumps(ask(thinking="on")).encode(), {}, MESSAGES, id="thinking-on"),
        pytest.param(
            json.dumps(ask(stream="true")).encode(), {}, MESSAGES, id="stream-as-a-string"
        ),
        pytest.param(
            json.dumps({**ask(), "max_tokens": True}).encode(), {}, MESSAGES, id="max-tokens-bool"
        ),
        pytest.param(b'"text"', {}, BOTH, id="a-json-string"),
        pytest.param(b"null", {}, BOTH, id="json-null"),
        pytest.param(
            json.dumps(ask()).encode(), {"anthropic-beta": "bêta-é"}, BOTH, id="non-ascii-beta"
        ),
    ],
)
async def test_what_the_api_refuses_is_a_400(
    body: bytes, headers: dict[str, str], paths: tuple[str, ...]
) -> None:
    raw_headers = [(k.encode(), v.encode()) for k, v in {**HEADERS, **headers}.items()]
    async with served() as (url, upstream), httpx2.AsyncClient(timeout=30) as http:
        for path in paths:
            answer = await http.post(url + path, content=body, headers=raw_headers)
            assert answer.status_code == 400, answer.text
            error = answer.json()
            assert error["type"] == "error"
            assert error["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []


async def test_a_body_over_32_mb_is_refused_before_it_is_read() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "'
        for _ in range(50):
            yield b"x" * 2**20
        yield b'"}]}'

    async with served() as (url, upstream):
        # Declared too large: answered from the headers, while the body is still unsent.
        where = urlsplit(url)
        assert where.hostname is not None and where.port is not None
        async with await anyio.connect_tcp(where.hostname, where.port) as sock:
            await sock.send(
                b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: sk-a\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n{" % (50 * 2**20)
            )
            head = await sock.receive()
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert b'"request_too_large"' in head
        # Sent without a length (chunked): refused once 32 MB have arrived.
        async with httpx2.AsyncClient(timeout=30) as http:
            streamed = await http.post(url + "/v1/messages", content=body(), headers=HEADERS)
        assert streamed.status_code == 413, streamed.text
        assert streamed.json()["error"]["type"] == "request_too_large"
    assert upstream.requests == []


async def test_request_ids_agree_between_header_and_body() -> None:
    refused = RawResponse(
        429,
        {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "Slow down"},
            "request_id": "req_upstream",
        },
        headers={"request-id": "req_upstream", "retry-after": "1"},
    )
    async with served(refused) as (url, _), httpx2.AsyncClient(timeout=30) as http:
        missing = await http.get(url + "/v2/nothing", headers=HEADERS)
        health = await http.get(url + "/healthz")
        limited = await http.post(url + "/v1/messages", json=ask(), headers=HEADERS)
    assert missing.status_code == 404
    assert missing.headers["request-id"] == missing.json()["request_id"]
    assert health.headers["request-id"].startswith("req_")
    assert limited.status_code == 429
    assert limited.headers["request-id"] == limited.json()["request_id"] == "req_upstream"


async def test_a_block_streamed_before_message_start_still_reaches_the_client_in_order() -> None:
    events = [
        (name, data)
        for frame in sse_events(reply("Out of order.")).split("\n\n")
        if frame
        for name, data in [_frame(frame)]
    ]
    start = events.pop(0)
    events.insert(1, start)  # content_block_start, then message_start
    disordered = "".join(f"event: {n}\ndata: {json.dumps(d)}\n\n" for n, d in events)
    upstream = MessagesServer([RawResponse(200, sse=disordered)]).start()
    config = GatewayConfig(upstream=upstream.base_url, store="memory://")
    try:
        async with gateway_on(config) as url:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
            async with (
                client,
                client.messages.stream(
                    model="m", max_tokens=10, messages=ask()["messages"]
                ) as stream,
            ):
                message = await stream.get_final_message()
    finally:
        upstream.stop()
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Out of order."  # type: ignore[union-attr]


def _frame(frame: str) -> tuple[str, Any]:
    lines = dict(line.split(": ", 1) for line in frame.splitlines())
    return lines["event"], json.loads(lines["data"])
