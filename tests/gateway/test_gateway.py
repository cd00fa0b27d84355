"""The gateway end to end: the real `anthropic` SDK talks to `python -m agentloop.gateway`,
which talks to a scripted Messages server that lints every history it receives.

The gateway's tools (`lookup`, `rendezvous`) come from a real plugin distribution; the
client declares its own tool, `client_tool`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import pytest
from _gateway import (
    CLIENT_TOOL,
    GatewayProcess,
    Upstream,
    dump,
    install_plugin,
    start_gateway,
    tool_result_text,
    wait_until_healthy,
)
from support import free_port

from agentloop.gateway.errors import HIDDEN_ERROR
from agentloop.testing import Fault, Paced, RawResponse, reply, sse_events, tool_call
from agentloop.testing.scripted import cache_markers
from agentloop.testing.server import count_tokens

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("gateway-site") / "site")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway-logs")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, site: Path, logs: Path) -> Iterator[GatewayProcess]:
    process = start_gateway(upstream.url, site, logs)
    yield process
    assert process.stop() == 0, process.output()


def names(body: dict[str, Any]) -> list[str]:
    return [t["name"] for t in body.get("tools") or []]


def tool_uses(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [b for b in content if isinstance(b, dict) and b["type"] == "tool_use"]


def texts(blocks: Any) -> list[str]:
    return [b["text"] for b in dump(blocks) if b["type"] == "text"]


# --------------------------------------------------------------------------- plain requests


async def test_plain_request_goes_upstream_unchanged(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    answer = reply("Hello there.", usage={"input_tokens": 12, "output_tokens": 3})
    upstream.script(answer)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    async with gateway.client() as client:
        message = await client.messages.create(
            model="claude-test",
            max_tokens=2048,
            system=system,
            messages=messages,
            tools=[CLIENT_TOOL],
            tool_choice={"type": "auto"},
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata={"user_id": "u-1"},
            extra_body={"temperature": 0.25},
            extra_headers={
                "anthropic-beta": "some-beta-2025-01-01",
                "anthropic-version": "2023-06-01",
            },
        )
    (seen,) = upstream.recorded
    assert seen.body["messages"] == messages
    assert seen.body["system"] == system
    assert seen.body["tool_choice"] == {"type": "auto"}
    assert seen.body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert seen.body["metadata"] == {"user_id": "u-1"}
    assert seen.body["temperature"] == 0.25
    assert seen.body["max_tokens"] == 2048 and seen.body["model"] == "claude-test"
    assert "stream" not in seen.body
    # The gateway's tools are announced with the client's, the client's as sent.
    assert names(seen.body) == ["lookup", "rendezvous", "client_tool"]
    assert seen.body["tools"][-1] == CLIENT_TOOL
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == "some-beta-2025-01-01"
    assert seen.headers["authorization"] == "Bearer sk-client-a"
    # A passthrough answer is the upstream's message as it was.
    assert message.to_dict() == answer


async def test_gateway_tools_run_hidden(gateway: GatewayProcess, upstream: Upstream) -> None:
    call = tool_call("lookup", {"key": "a"})
    upstream.script(
        reply("Let me look.", call, usage={"input_tokens": 11, "output_tokens": 2}),
        reply("It is value-of-a.", usage={"input_tokens": 20, "output_tokens": 4}),
    )
    async with gateway.client() as client:
        message = await client.messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "Look a up."}]
        )
    assert texts(message.content) == ["Let me look.", "It is value-of-a."]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (31, 6)
    assert "lookup" not in message.to_json()
    first, second = upstream.bodies
    assert names(first) == ["lookup", "rendezvous"]
    assert second["messages"][1]["content"][1] == call
    assert second["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "value-of-a"}],
    }


async def test_client_tools_are_handed_back(gateway: GatewayProcess, upstream: Upstream) -> None:
    call = tool_call("client_tool", {"x": 1})
    upstream.script(reply("Asking you.", call), reply("Thanks, 42 it is."))
    messages: list[Any] = [{"role": "user", "content": "Use your tool."}]
    async with gateway.client() as client:
        first = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[CLIENT_TOOL]
        )
        assert first.stop_reason == "tool_use"
        assert dump(first.content) == [{"type": "text", "text": "Asking you."}, call]
        messages += [
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "42"}],
            },
        ]
        second = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[CLIENT_TOOL]
        )
    assert texts(second.content) == ["Thanks, 42 it is."]
    # Nothing was hidden: the upstream got the client's history as the client sent it.
    assert upstream.bodies[1]["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Asking you."}, call]},
        messages[2],
    ]


async def test_mixed_turn_answers_every_call_in_the_models_order(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    theirs = tool_call("client_tool", {"x": 7})
    ours = tool_call("lookup", {"key": "b"})
    mixed = reply("Both at once.", theirs, ours, usage={"input_tokens": 9, "output_tokens": 9})
    upstream.script(mixed, reply("Done: 7 and value-of-b."))
    messages: list[Any] = [{"role": "user", "content": "Both, please."}]
    async with gateway.client() as client:
        first = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[CLIENT_TOOL]
        )
        assert first.stop_reason == "tool_use"
        assert dump(first.content) == [{"type": "text", "text": "Both at once."}, theirs]
        assert first.usage.input_tokens == 9
        result = {"type": "tool_result", "tool_use_id": theirs["id"], "content": "seven"}
        messages += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result, {"type": "text", "text": "Thanks."}]},
        ]
        second = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[CLIENT_TOOL]
        )
    assert texts(second.content) == ["Done: 7 and value-of-b."]
    sent = upstream.bodies[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": mixed["content"]}
    assert sent[2] == {
        "role": "user",
        "content": [
            result,
            {"type": "tool_result", "tool_use_id": ours["id"], "content": "value-of-b"},
            {"type": "text", "text": "Thanks."},
        ],
    }
    assert len(sent) == 3


async def test_follow_up_question_after_a_hidden_turn(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    call = tool_call("lookup", {"key": "c"})
    upstream.script(reply(call), reply("value-of-c."), reply("Yes, c."))
    messages: list[Any] = [{"role": "user", "content": "What is c?"}]
    async with gateway.client() as client:
        first = await client.messages.create(model="m", max_tokens=100, messages=messages)
        messages += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": "Sure?"},
        ]
        await client.messages.create(model="m", max_tokens=100, messages=messages)
    assert [m["role"] for m in upstream.bodies[2]["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    hidden = upstream.bodies[2]["messages"]
    assert hidden[1]["content"] == [call]
    assert hidden[2]["content"][0]["tool_use_id"] == call["id"]
    assert hidden[3]["content"] == [{"type": "text", "text": "value-of-c."}]
    assert hidden[4] == {"role": "user", "content": "Sure?"}


async def test_retried_and_regenerated_answers_both_find_the_hidden_turn(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    call = tool_call("lookup", {"key": "d"})
    upstream.script(
        reply(call),
        reply("d is value-of-d."),
        reply("First try."),
        reply("Second try."),
        reply("Onwards from the first."),
        reply("Onwards from the second."),
    )
    start: list[Any] = [{"role": "user", "content": "d?"}]
    async with gateway.client() as client:
        first = await client.messages.create(model="m", max_tokens=100, messages=start)
        asked = [*start, {"role": "assistant", "content": first.content}]
        asked.append({"role": "user", "content": "Again?"})
        one = await client.messages.create(model="m", max_tokens=100, messages=asked)
        two = await client.messages.create(model="m", max_tokens=100, messages=asked)
        for answer in (one, two):
            follow = [*asked, {"role": "assistant", "content": answer.content}]
            follow.append({"role": "user", "content": "And then?"})
            await client.messages.create(model="m", max_tokens=100, messages=follow)
    bodies = upstream.bodies
    for body in bodies[2:]:
        assert body["messages"][1]["content"] == [call], "the hidden turn was restored"
    assert bodies[4]["messages"][5]["content"] == [{"type": "text", "text": "First try."}]
    assert bodies[5]["messages"][5]["content"] == [{"type": "text", "text": "Second try."}]


# --------------------------------------------------------------------------- errors


async def test_a_client_tool_named_like_a_gateway_tool_is_refused(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script()
    clash = {**CLIENT_TOOL, "name": "lookup"}
    async with gateway.client() as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="m",
                max_tokens=10,
                messages=[{"role": "user", "content": "hi"}],
                tools=[clash],
            )
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "lookup" in caught.value.body["error"]["message"]
    assert upstream.recorded == []


MCP_SERVER = {"type": "url", "url": "https://mcp.example.com/sse", "name": "docs"}
MCP_TOOLSET = {"type": "mcp_toolset", "mcp_server_name": "docs"}
"""A tool kind without a `name`: the MCP connector's tools of one server."""


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_nameless_client_tool_goes_upstream_as_sent(
    gateway: GatewayProcess, upstream: Upstream, stream: bool
) -> None:
    upstream.script(reply(tool_call("lookup", {"key": "m"})), reply("Read the docs."))
    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "What do the docs say?"}],
        "tools": [MCP_TOOLSET, CLIENT_TOOL],
        "mcp_servers": [MCP_SERVER],
        "betas": ["mcp-client-2025-11-20"],
    }
    async with gateway.client() as client:
        if stream:
            async with client.beta.messages.stream(**request) as events:
                message = await events.get_final_message()
        else:
            message = await client.beta.messages.create(**request)
    assert texts(message.content) == ["Read the docs."]
    assert len(upstream.recorded) == 2  # the gateway's own round, then the answer
    for seen in upstream.recorded:
        # Announced beside the gateway's tools, in the client's order, as sent.
        assert seen.body["tools"][2:] == [MCP_TOOLSET, CLIENT_TOOL]
        assert [t["name"] for t in seen.body["tools"][:2]] == ["lookup", "rendezvous"]
        assert seen.body["mcp_servers"] == [MCP_SERVER]
        assert "mcp-client-2025-11-20" in seen.headers["anthropic-beta"]


async def test_count_tokens_passes_a_nameless_client_tool_on(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script()
    async with gateway.client() as client:
        counted = await client.beta.messages.count_tokens(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            tools=[CLIENT_TOOL, MCP_TOOLSET],  # type: ignore[list-item]
            mcp_servers=[MCP_SERVER],  # type: ignore[list-item]
            betas=["mcp-client-2025-11-20"],
        )
    (seen,) = upstream.recorded
    assert seen.body["tools"][2:] == [CLIENT_TOOL, MCP_TOOLSET]
    assert counted.input_tokens == count_tokens(seen.body)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize(
    ("tools", "refused"),
    [
        pytest.param({"name": "x"}, "tools: Input should be a valid list", id="an-object"),
        pytest.param([CLIENT_TOOL, "x"], "tools.1: Input should be a valid dict", id="a-string"),
        pytest.param([{"description": "no name"}], "tools.0: a tool needs a name", id="untyped"),
        pytest.param([{**CLIENT_TOOL, "name": ""}], "tools.0: a tool needs a name", id="empty"),
    ],
)
async def test_tools_that_are_no_tools_are_refused(
    gateway: GatewayProcess, upstream: Upstream, path: str, tools: Any, refused: str
) -> None:
    upstream.script()
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 5
    async with httpx2.AsyncClient() as http:
        response = await http.post(
            gateway.url + path, json={**body, "tools": tools}, headers={"x-api-key": "sk-a"}
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert refused in response.json()["error"]["message"]
    assert upstream.recorded == []


async def test_a_broken_history_is_refused_before_the_upstream(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script()
    orphan = {"type": "tool_result", "tool_use_id": "toolu_missing", "content": "x"}
    async with gateway.client() as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": [orphan]}]
            )
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert upstream.recorded == []


async def test_missing_credentials_get_401(gateway: GatewayProcess, upstream: Upstream) -> None:
    upstream.script()
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx2.AsyncClient() as http:
        response = await http.post(gateway.url + "/v1/messages", json=body)
    assert response.status_code == 401
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "authentication_error"
    assert upstream.recorded == []


async def test_x_api_key_is_forwarded_too(gateway: GatewayProcess, upstream: Upstream) -> None:
    upstream.script(reply("ok"))
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": "sk-raw-key", "anthropic-version": "2023-06-01"}
    async with httpx2.AsyncClient() as http:
        response = await http.post(
            gateway.url + "/v1/messages?beta=true", json=body, headers=headers
        )
    assert response.status_code == 200
    (seen,) = upstream.recorded
    assert seen.headers["authorization"] == "Bearer sk-raw-key"
    assert seen.query == {"beta": "true"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_upstream_overload_comes_back_unchanged(
    gateway: GatewayProcess, upstream: Upstream, stream: bool
) -> None:
    upstream.script(Fault.overloaded(retry_after=0))
    async with gateway.client() as client:
        with pytest.raises(anthropic.APIStatusError) as caught:
            if stream:
                async with client.messages.stream(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
                ) as events:
                    await events.get_final_message()
            else:
                await client.messages.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
                )
    assert caught.value.status_code == 529
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": "req_local",
    }
    assert caught.value.response.headers["retry-after"] == "0"
    assert len(upstream.recorded) == 1, "the gateway left the retry to the client"


async def test_the_clients_retry_gets_through(gateway: GatewayProcess, upstream: Upstream) -> None:
    upstream.script(Fault.overloaded(retry_after=0), reply("second time lucky"))
    async with gateway.client(max_retries=1) as client:
        message = await client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert texts(message.content) == ["second time lucky"]
    assert len(upstream.recorded) == 2


# --------------------------------------------------------------------------- streaming


SCENARIOS = {
    "plain": lambda: [reply("Just text, streamed in several deltas.")],
    "internal": lambda: [
        reply("Looking.", tool_call("lookup", {"key": "e"})),
        reply("Found value-of-e."),
    ],
    "client": lambda: [reply("Over to you.", tool_call("client_tool", {"x": 3}))],
    "mixed": lambda: [
        reply("Both.", tool_call("lookup", {"key": "f"}), tool_call("client_tool", {"x": 4}))
    ],
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_streaming_gives_the_json_answer(
    gateway: GatewayProcess, upstream: Upstream, scenario: str
) -> None:
    script = SCENARIOS[scenario]()
    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Go."}],
        "tools": [CLIENT_TOOL],
    }
    upstream.script(*script, *script)
    async with gateway.client() as client:
        whole = await client.messages.create(**request)
        async with client.messages.stream(**request) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_message()
    assert streamed.to_dict(exclude_none=True) == whole.to_dict(exclude_none=True)
    assert kinds.count("message_start") == 1 and kinds[0] == "message_start"
    assert kinds.count("message_delta") == 1 and kinds[-1] == "message_stop"
    assert "lookup" not in streamed.to_json()
    assert upstream.bodies[-1].get("stream") is True


async def test_the_answer_names_the_upstreams_stop_sequence(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    container = {"id": "container_7", "expires_at": "2026-01-01T00:00:00Z"}
    stopped = {
        **reply("a, b, c", stop_reason="stop_sequence"),
        "stop_sequence": "d",
        "container": container,
    }
    hidden = reply(tool_call("lookup", {"key": "h"}))
    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Spell it."}],
        "stop_sequences": ["d", "z"],
    }
    upstream.script(hidden, stopped, hidden, stopped)
    async with gateway.client() as client:
        whole = await client.messages.create(**request)
        async with client.messages.stream(**request) as stream:
            streamed = await stream.get_final_message()
    for message in (whole, streamed):
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "d")
        assert message.container is not None and message.container.id == "container_7"
        assert texts(message.content) == ["a, b, c"]
    assert [body["stop_sequences"] for body in upstream.bodies] == [["d", "z"]] * 4


async def read_sse(response: Any) -> list[tuple[str, dict[str, Any]]]:
    events = []
    async for chunk in response.aiter_text():
        events.append(chunk)
    out = []
    for frame in "".join(events).split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_one_sse_message_across_hidden_rounds(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script(
        reply(
            "One.", tool_call("lookup", {"key": "g"}), usage={"input_tokens": 5, "output_tokens": 1}
        ),
        reply(
            "Two.",
            tool_call("client_tool", {"x": 5}),
            usage={"input_tokens": 7, "output_tokens": 2},
        ),
    )
    body = {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "Go."}],
        "tools": [CLIENT_TOOL],
    }
    headers = {"x-api-key": "sk-client-a", "anthropic-version": "2023-06-01"}
    async with httpx2.AsyncClient() as http:
        async with http.stream(
            "POST", gateway.url + "/v1/messages", json=body, headers=headers
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = await read_sse(r)
    names_ = [name for name, _ in events]
    assert names_[0] == "message_start" and names_.count("message_start") == 1
    assert names_[-2:] == ["message_delta", "message_stop"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert [s["content_block"]["type"] for s in starts] == ["text", "text", "tool_use"]
    assert starts[2]["content_block"]["name"] == "client_tool"
    indices = {data["index"] for name, data in events if name.startswith("content_block")}
    assert indices == {0, 1, 2}
    # A ping marks the gateway's own call, between the two rounds' blocks.
    first_two = names_.index("content_block_start", names_.index("content_block_stop") + 1)
    assert "ping" in names_[:first_two]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert (delta["usage"]["input_tokens"], delta["usage"]["output_tokens"]) == (12, 3)


async def test_upstream_error_mid_stream_is_an_error_event(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script(
        reply("Looking.", tool_call("lookup", {"key": "h"})),
        Fault.stream_error("Partial", after_blocks=1),
    )
    async with gateway.client() as client:
        with pytest.raises(anthropic.APIStatusError) as caught:
            async with client.messages.stream(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "Go."}]
            ) as stream:
                async for _ in stream:
                    pass
    # The failed round carried the hidden lookup: its type is kept, not its message.
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": HIDDEN_ERROR},
    }


async def test_a_silent_upstream_stream_ends_with_an_error_event(
    upstream: Upstream, site: Path, logs: Path
) -> None:
    upstream.script(Paced(reply("Never finished."), block_delay=50))
    gateway = start_gateway(upstream.url, site, logs, args=["--upstream-timeout", "1"])
    body = {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "Go."}],
    }
    try:
        started = time.monotonic()
        async with httpx2.AsyncClient(timeout=30) as http:
            async with http.stream(
                "POST", gateway.url + "/v1/messages", json=body, headers={"x-api-key": "sk-a"}
            ) as r:
                events = await read_sse(r)
        waited = time.monotonic() - started
    finally:
        assert gateway.stop() == 0, gateway.output()
    assert events[0][0] == "message_start"
    assert events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"
    assert waited < 15


# --------------------------------------------------------------------------- sessions


async def test_another_key_never_gets_the_hidden_turn(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script(reply(tool_call("lookup", {"key": "i"})), reply("value-of-i"), reply("Hm?"))
    messages: list[Any] = [{"role": "user", "content": "i?"}]
    async with gateway.client("sk-client-a") as client:
        first = await client.messages.create(model="m", max_tokens=100, messages=messages)
    messages += [
        {"role": "assistant", "content": dump(first.content)},
        {"role": "user", "content": "More?"},
    ]
    async with gateway.client("sk-client-b") as other:
        await other.messages.create(model="m", max_tokens=100, messages=messages)
    assert upstream.bodies[2]["messages"] == messages, "forwarded as the other client sent it"
    assert upstream.recorded[2].headers["authorization"] == "Bearer sk-client-b"


async def test_cache_markers_a_client_moves_never_pile_up_upstream(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    """A client that marks its system prompt and its last two user messages on every
    request, as coding agents do, over turns that each had a hidden round."""
    mark = {"type": "ephemeral", "ttl": "5m"}
    system = [{"type": "text", "text": "You are terse.", "cache_control": mark}]

    def marked(text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": text, "cache_control": mark}]}

    def unmarked(message: dict[str, Any]) -> dict[str, Any]:
        content = message["content"]
        if isinstance(content, list):
            content = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
        return {**message, "content": content}

    messages: list[Any] = []
    async with gateway.client() as client:
        for turn in range(1, 6):
            upstream.script(reply(tool_call("lookup", {"key": f"k{turn}"})), reply(f"Turn {turn}."))
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            messages = [unmarked(m) if i in users[:-1] else m for i, m in enumerate(messages)]
            messages.append(marked(f"question {turn}"))
            answer = await client.messages.create(
                model="m", max_tokens=50, system=system, messages=messages
            )
            assert texts(answer.content) == [f"Turn {turn}."]
            messages.append({"role": "assistant", "content": dump(answer.content)})
    bodies = upstream.bodies
    assert len(bodies) == 2, "the last turn's hidden round and answer"
    for body in bodies:
        assert cache_markers(body) <= 3
    history = bodies[0]["messages"]
    assert len(history) == 1 + 4 * 4, "every turn's hidden round was restored"
    where = [
        (i, b["cache_control"])
        for i, m in enumerate(history)
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if "cache_control" in b
    ]
    # One marker where the stored conversation ends, one on the client's new message.
    assert where == [(len(history) - 2, mark), (len(history) - 1, mark)]


# --------------------------------------------------------------------------- message threads


async def test_tool_runner_over_a_thread(gateway: GatewayProcess, upstream: Upstream) -> None:
    await _run_tool_runner(gateway, upstream, threaded=True)


async def test_tool_runner_with_the_full_history(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    await _run_tool_runner(gateway, upstream, threaded=False)


async def _run_tool_runner(gateway: GatewayProcess, upstream: Upstream, *, threaded: bool) -> None:
    hidden = tool_call("lookup", {"key": "clock"})
    clock = tool_call("read_clock", {})
    upstream.script(
        reply("Checking the table.", hidden),
        reply("Now your clock.", clock),
        reply("It is noon, and the table says value-of-clock."),
    )
    sent: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        sent.append({"headers": dict(request.headers), "body": json.loads(request.content)})

    @anthropic.beta_async_tool
    async def read_clock() -> str:
        """Read the client's clock."""
        return "12:00"

    http = httpx2.AsyncClient(event_hooks={"request": [record]})
    async with gateway.client(http_client=http) as client:
        options: dict[str, Any] = {} if threaded else {"thread": False}
        runner = client.beta.messages.tool_runner(
            model="m",
            max_tokens=200,
            system="You have a clock.",
            tools=[read_clock],
            messages=[{"role": "user", "content": "What time is it?"}],
            **options,
        )
        replies = [message async for message in runner]
    assert [texts(r.content) for r in replies] == [
        ["Checking the table.", "Now your clock."],
        ["It is noon, and the table says value-of-clock."],
    ]
    assert len({r.id for r in replies}) == 2
    assert "lookup" not in replies[0].to_json()
    # What the client sent: a thread (create, then continue with the result only) or not.
    assert len(sent) == 2
    if threaded:
        assert sent[0]["body"]["thread"] == {"type": "create"}
        assert "message-threads-" in sent[0]["headers"]["anthropic-beta"]
        second = sent[1]["body"]
        assert second["thread"] == {"type": "continue", "previous_message_id": replies[0].id}
        assert len(second["messages"]) == 1
        assert second["messages"][0]["content"][0]["type"] == "tool_result"
        assert "system" not in second and "tools" not in second
    else:
        assert all("thread" not in s["body"] for s in sent)
        assert len(sent[1]["body"]["messages"]) == 3
    # What the upstream got: whole histories, the hidden turn included, never a thread.
    last = upstream.bodies[-1]
    assert all("thread" not in b for b in upstream.bodies)
    assert all(
        "message-threads" not in r.headers.get("anthropic-beta", "") for r in upstream.recorded
    )
    assert last["system"] == "You have a clock."
    assert names(last) == ["lookup", "rendezvous", "read_clock"]
    assert [m["role"] for m in last["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert last["messages"][1]["content"][1] == hidden
    (answered,) = last["messages"][4]["content"]
    assert answered["type"] == "tool_result" and answered["tool_use_id"] == clock["id"]
    assert "12:00" in json.dumps(answered["content"])


async def test_continuing_an_unknown_thread_is_refused_as_the_api_does(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script()
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
        "thread": {"type": "continue", "previous_message_id": "msg_unknown"},
    }
    headers = {"x-api-key": "sk-client-a", "anthropic-beta": "message-threads-2026-08-12"}
    async with httpx2.AsyncClient() as http:
        response = await http.post(gateway.url + "/v1/messages", json=body, headers=headers)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "not_found_error"
    assert error["details"] == {"error_code": "thread_not_found"}
    assert upstream.recorded == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_upstreams_rate_limit_headers_reach_the_client(
    gateway: GatewayProcess, upstream: Upstream, stream: bool
) -> None:
    def answer(message: dict[str, Any], remaining: str) -> RawResponse:
        headers = {"anthropic-ratelimit-requests-remaining": remaining, "x-internal": "no"}
        if stream:
            return RawResponse(200, sse=sse_events(message), headers=headers)
        return RawResponse(200, json=message, headers=headers)

    upstream.script(
        answer(reply(tool_call("lookup", {"key": "r"})), "42"), answer(reply("r is 1."), "41")
    )
    hi = [{"role": "user", "content": "What is r?"}]
    async with gateway.client() as client:
        if stream:
            async with client.messages.with_streaming_response.create(
                model="m", max_tokens=50, messages=hi, stream=True
            ) as response:
                headers = response.headers
                await response.read()
        else:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=50, messages=hi
            )
            headers = raw.headers
            assert (await raw.parse()).content[0].text == "r is 1."
    assert len(upstream.recorded) == 2
    # JSON: the last round's; SSE: those of the round whose stream opened the answer.
    assert headers["anthropic-ratelimit-requests-remaining"] == ("42" if stream else "41")
    assert "x-internal" not in headers
    assert headers["request-id"].startswith("req_") and headers["request-id"] != "req_local"


# --------------------------------------------------------------------------- token counts, models


async def test_count_tokens_counts_what_the_upstream_would_receive(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    call = tool_call("lookup", {"key": "t"})
    upstream.script(reply(call), reply("value-of-t."))
    messages: list[Any] = [{"role": "user", "content": "What is t?"}]
    async with gateway.client() as client:
        first = await client.messages.create(
            model="m", max_tokens=100, messages=messages, tools=[CLIENT_TOOL]
        )
        messages += [
            {"role": "assistant", "content": dump(first.content)},
            {"role": "user", "content": "And twice?"},
        ]
        upstream.script()
        counted = await client.messages.count_tokens(
            model="m", messages=messages, tools=[CLIENT_TOOL], system="Be brief."
        )
    (seen,) = upstream.recorded
    assert seen.path == "/v1/messages/count_tokens"
    # The hidden turn is restored and the gateway's tools announced, as for a request.
    assert [m["role"] for m in seen.body["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert seen.body["messages"][1]["content"] == [call]
    assert seen.body["messages"][-1] == {"role": "user", "content": "And twice?"}
    assert names(seen.body) == ["lookup", "rendezvous", "client_tool"]
    assert seen.body["system"] == "Be brief." and seen.body["model"] == "m"
    assert "max_tokens" not in seen.body
    assert seen.headers["authorization"] == "Bearer sk-client-a"
    # The answer is the upstream's count of that body, which the client's alone is below.
    assert counted.input_tokens == count_tokens(seen.body)
    visible = {"model": "m", "messages": messages, "tools": [CLIENT_TOOL], "system": "Be brief."}
    assert counted.input_tokens > count_tokens(visible)


async def test_count_tokens_refusals_and_upstream_errors(
    gateway: GatewayProcess, upstream: Upstream
) -> None:
    upstream.script()
    hi = [{"role": "user", "content": "hi"}]
    async with gateway.client() as client:
        with pytest.raises(anthropic.BadRequestError) as clash:
            await client.messages.count_tokens(
                model="m", messages=hi, tools=[{**CLIENT_TOOL, "name": "lookup"}]
            )
        assert upstream.recorded == []
        # A history the upstream refuses comes back with its status and error unchanged.
        orphan = {"type": "tool_result", "tool_use_id": "toolu_missing", "content": "x"}
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.count_tokens(
                model="m", messages=[{"role": "user", "content": [orphan]}]
            )
    assert "lookup" in clash.value.body["error"]["message"]
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "toolu_missing" in refused.value.body["error"]["message"]
    assert refused.value.response.headers["request-id"] == "req_local"
    assert [r.path for r in upstream.recorded] == ["/v1/messages/count_tokens"]
    async with httpx2.AsyncClient() as http:
        bare = await http.post(
            gateway.url + "/v1/messages/count_tokens", json={"model": "m", "messages": hi}
        )
        not_json = await http.post(
            gateway.url + "/v1/messages/count_tokens",
            content=b"[1, 2",
            headers={"x-api-key": "sk-client-a"},
        )
    assert bare.status_code == 401
    assert bare.json()["error"]["type"] == "authentication_error"
    assert not_json.status_code == 400
    assert not_json.json()["error"]["type"] == "invalid_request_error"
    assert len(upstream.recorded) == 1


async def test_models_come_from_the_upstream(gateway: GatewayProcess, upstream: Upstream) -> None:
    upstream.script()
    async with gateway.client() as client:
        listed = await client.models.list(limit=5)
        one = await client.models.retrieve("claude-scripted")
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.models.retrieve("claude-missing")
    assert [m.id for m in listed.data] == ["claude-scripted"]
    assert one.id == "claude-scripted" and one.type == "model"
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert [(r.path, r.query) for r in upstream.recorded] == [
        ("/v1/models", {"limit": "5"}),
        ("/v1/models/claude-scripted", {}),
        ("/v1/models/claude-missing", {}),
    ]
    assert all(r.headers["authorization"] == "Bearer sk-client-a" for r in upstream.recorded)
    async with httpx2.AsyncClient() as http:
        anonymous = await http.get(gateway.url + "/v1/models")
        # Only the model routes are reachable: no path climbs out of /v1/models upstream.
        escapes = [
            await http.get(gateway.url + path, headers={"x-api-key": "sk-client-a"})
            for path in ("/v1/models/%2E%2E", "/v1/models/a%2F..%2F..%2Fv1%2Fmessages")
        ]
    assert anonymous.status_code == 401
    assert [e.status_code for e in escapes] == [404, 404]
    assert len(upstream.recorded) == 3


# --------------------------------------------------------------------------- shutdown


async def test_sigterm_lets_the_request_in_flight_finish(
    upstream: Upstream, site: Path, logs: Path
) -> None:
    process = start_gateway(upstream.url, site, logs)
    started = anyio.Event()
    release = anyio.Event()
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        upstream.script(reply(tool_call("rendezvous", {"port": port})), reply("After the wait."))

        async def serve_once() -> None:
            async def handle(stream: Any) -> None:
                async with stream:
                    await stream.receive()
                    started.set()
                    await release.wait()
                    await stream.send(b"go\n")

            await listener.serve(handle)

        result: dict[str, Any] = {}
        finished = anyio.Event()

        async def ask() -> None:
            async with process.client() as client:
                result["message"] = await client.messages.create(
                    model="m", max_tokens=50, messages=[{"role": "user", "content": "Wait."}]
                )
            finished.set()

        async with anyio.create_task_group() as group:
            group.start_soon(serve_once)
            group.start_soon(ask)
            await started.wait()
            process.process.send_signal(signal.SIGTERM)
            # The gateway stops accepting connections at once...
            with anyio.fail_after(30):
                await anyio.to_thread.run_sync(_wait_until_refused, process.url)
            # ...and the request in flight still finishes.
            release.set()
            with anyio.fail_after(30):
                await finished.wait()
            group.cancel_scope.cancel()
    assert texts(result["message"].content) == ["After the wait."]
    assert process.stop() == 0, process.output()


async def test_verbose_shows_the_librarys_events_and_the_default_only_warnings(
    gateway: GatewayProcess, upstream: Upstream, site: Path, logs: Path
) -> None:
    """`python -m agentloop.gateway -v` logs the gateway's and the runs' events."""
    verbose = start_gateway(upstream.url, site, logs, args=["-v"])
    hi = [{"role": "user", "content": "Hi."}]
    try:
        upstream.script(reply("Hello."), reply("Hello."))
        for served in (verbose, gateway):
            async with served.client() as client:
                await client.messages.create(model="m", max_tokens=50, messages=hi)
        quiet = gateway.output()  # the reply was logged (or not) before it was answered
    finally:
        assert verbose.stop() == 0, verbose.output()
    shown = verbose.output()
    assert "gateway.reply" in shown and "model.request" in shown and "run.start" in shown
    assert "gateway.reply" not in quiet and "model.request" not in quiet


def _wait_until_refused(url: str) -> None:
    """Poll until the gateway's port refuses connections (a process's state, from outside)."""
    host, port = url.removeprefix("http://").split(":")
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
        except OSError:
            return
        time.sleep(0.02)


def serve_cortex(upstream: Upstream, logs: Path, root: Path) -> GatewayProcess:
    """`agentloop serve --plugin cortex --cortex-root ROOT --persona ada`, healthy."""
    port = free_port()
    command = [sys.executable, "-m", "agentloop", "serve", "--upstream", upstream.url]
    command += ["--port", str(port), "--store", "memory://", "--plugin", "cortex"]
    command += ["--cortex-root", str(root), "--persona", "ada"]
    log = logs / f"serve-{port}.log"
    dropped = ("ANTHROPIC_API_KEY", "AGENTLOOP_PLUGINS")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    served = GatewayProcess(f"http://127.0.0.1:{port}", process, log)
    wait_until_healthy(served)
    return served


async def test_the_agentloop_command_serves_a_plugin_with_its_options(
    upstream: Upstream, logs: Path, tmp_path: Path
) -> None:
    """`agentloop serve --plugin cortex`: the plugin's options reach its tools as `deps`."""
    root = tmp_path / "cortex-root"
    served = serve_cortex(upstream, logs, root)
    try:
        upstream.script(
            reply(tool_call("write_file", {"filename": "memory.md", "content": "# Notes\n"})),
            reply("Written."),
        )
        client = served.client()
        message = await client.messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "Note it."}]
        )
        await client.close()
        assert message.content[0].text == "Written."  # type: ignore[union-attr]
        assert (root / "ada" / "memory.md").read_text() == "# Notes\n"
    finally:
        assert served.stop() == 0, served.output()


async def test_serve_capability_wraps_the_gateway_tools_calls(
    upstream: Upstream, site: Path, logs: Path
) -> None:
    """`--capability gwmask`: the plugin's capability masks what the gateway's tool returns."""
    served = start_gateway(upstream.url, site, logs, args=["--capability", "gwmask"])
    try:
        upstream.script(reply(tool_call("lookup", {"key": "k"})), reply("Done."))
        async with served.client() as client:
            message = await client.messages.create(
                model="m", max_tokens=50, messages=[{"role": "user", "content": "What is k?"}]
            )
        _, second = upstream.bodies
    finally:
        assert served.stop() == 0, served.output()
    assert tool_result_text(second) == "[masked]-of-k"
    assert texts(message.content) == ["Done."]
