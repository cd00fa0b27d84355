"""AnthropicProvider over the real SDK: parameters through, errors typed, keys checked."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from typing import Any

import anthropic
import anyio
import pytest

from agentloop import Agent, AnthropicProvider, ProviderError, tool
from agentloop.errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    CreditBalanceError,
    MissingAPIKeyError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import Message
from agentloop.providers.base import MessageStart, ModelRequest
from agentloop.testing import Fault, RawResponse, reply, sse_events, tool_call


@tool
def noop() -> None:
    """Do nothing."""


def error(status: int, kind: str, message: str) -> RawResponse:
    return RawResponse(
        status,
        {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"},
    )


CREDIT = "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."


@pytest.mark.parametrize(
    ("answer", "expected", "sdk_error"),
    [
        pytest.param(
            error(400, "invalid_request_error", CREDIT),
            CreditBalanceError,
            anthropic.BadRequestError,
            id="credit-400",
        ),
        pytest.param(
            error(402, "billing_error", "Payment required"),
            CreditBalanceError,
            anthropic.APIStatusError,
            id="billing-402",
        ),
        pytest.param(
            error(401, "authentication_error", "invalid x-api-key"),
            AuthenticationError,
            anthropic.AuthenticationError,
            id="401",
        ),
        pytest.param(
            error(403, "permission_error", "no access"),
            AuthenticationError,
            anthropic.PermissionDeniedError,
            id="403",
        ),
        pytest.param(
            error(429, "rate_limit_error", "slow down"),
            RateLimitError,
            anthropic.RateLimitError,
            id="429",
        ),
        pytest.param(
            error(500, "api_error", "oops"), ServerError, anthropic.InternalServerError, id="500"
        ),
        pytest.param(
            error(400, "invalid_request_error", "max_tokens: too big"),
            BadRequestError,
            anthropic.BadRequestError,
            id="400",
        ),
    ],
)
async def test_api_failures_are_typed_and_keep_the_sdk_cause(
    serve: Any, answer: RawResponse, expected: type[ProviderError], sdk_error: type[Exception]
) -> None:
    server = serve([answer])
    agent = Agent(client=server.client())
    with pytest.raises(expected) as info:
        await agent.run("hi")
    assert isinstance(info.value.__cause__, sdk_error)
    assert info.value.status_code == answer.status
    assert answer.json["error"]["message"] in str(info.value)
    assert info.value.result is not None and info.value.result.rounds == 1


async def test_unreachable_api_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0
    )
    try:
        with pytest.raises(APIConnectionError) as info:
            await Agent(client=client).run("hi")
    finally:
        await client.close()
    assert isinstance(info.value.__cause__, anthropic.APIConnectionError)


async def test_missing_api_key_is_raised_before_any_request(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    server = serve([reply("never")])
    client = anthropic.AsyncAnthropic(base_url=server.base_url)
    try:
        with pytest.raises(MissingAPIKeyError, match="ANTHROPIC_API_KEY"):
            await Agent(client=client).run("hi")
    finally:
        await client.close()
    assert server.requests == []


async def test_request_fields_pass_through(serve: Any) -> None:
    server = serve([reply("ok")])
    agent = Agent(
        model="claude-haiku-4-5",
        client=server.client(),
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=[noop],
        max_tokens=321,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        metadata={"user_id": "u-1"},
        stop_sequences=["STOP"],
        params={
            "temperature": 0.2,
            "top_k": 5,
            "service_tier": "auto",
            "extra_headers": {"x-trace": "t1"},
        },
    )
    await agent.run("hi")
    (body,) = server.requests
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 321
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert body["metadata"] == {"user_id": "u-1"} and body["stop_sequences"] == ["STOP"]
    assert (body["temperature"], body["top_k"], body["service_tier"]) == (0.2, 5, "auto")
    assert body["tools"] == [
        {
            "name": "noop",
            "description": "Do nothing.",
            "input_schema": {"additionalProperties": False, "properties": {}, "type": "object"},
        }
    ]


async def test_params_win_over_fields_and_their_tools_are_added(serve: Any) -> None:
    server = serve([reply("ok")])
    web_search = {"type": "web_search_20250305", "name": "web_search"}
    agent = Agent(
        client=server.client(),
        tools=[noop],
        max_tokens=100,
        metadata={"user_id": "agent"},
        params={"max_tokens": 50, "metadata": {"user_id": "params"}, "tools": [web_search]},
    )
    await agent.run("hi")
    (body,) = server.requests
    assert body["max_tokens"] == 50 and body["metadata"] == {"user_id": "params"}
    assert [t["name"] for t in body["tools"]] == ["noop", "web_search"]
    assert body["tools"][1] == web_search


async def test_tool_choice_none_and_thinking_are_sent(serve: Any) -> None:
    server = serve([reply("ok")])
    thinking = {"type": "enabled", "budget_tokens": 1024}
    await Agent(
        client=server.client(), tools=[noop], tool_choice={"type": "none"}, thinking=thinking
    ).run("hi")
    assert server.requests[0]["tool_choice"] == {"type": "none"}
    assert server.requests[0]["thinking"] == thinking


async def test_forced_tool_choice_with_thinking_is_refused_before_sending(serve: Any) -> None:
    from agentloop import HistoryError

    server = serve([reply("never")])
    agent = Agent(
        client=server.client(),
        tools=[noop],
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    with pytest.raises(HistoryError, match="tool_choice forces tool use"):
        await agent.run("hi")
    assert server.requests == []


def test_default_provider_is_anthropic() -> None:
    client = anthropic.AsyncAnthropic(api_key="k")
    agent = Agent(client=client)
    assert isinstance(agent.provider, AnthropicProvider) and agent.provider.client is client


# ------------------------------------------------------------------ headers and retries

MODES = [pytest.param(False, id="json"), pytest.param(True, id="sse")]
REQUEST = ModelRequest(model="m", max_tokens=8, messages=[Message.user("hi")])


@pytest.mark.parametrize("stream", MODES)
async def test_a_response_carries_its_headers(serve: Any, stream: bool) -> None:
    server = serve([reply("ok")])
    response = await AnthropicProvider(server.client(), stream=stream).complete(REQUEST)
    assert response.text == "ok" and response.headers["request-id"] == "req_local"
    kind = "text/event-stream" if stream else "application/json"
    assert response.headers["content-type"].startswith(kind)


async def test_a_streams_start_carries_the_headers_before_the_response_is_whole(
    serve: Any,
) -> None:
    limits = {"anthropic-ratelimit-requests-remaining": "41"}
    server = serve([RawResponse(200, sse=sse_events(reply("ok")), headers=limits)])
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    response = await AnthropicProvider(server.client()).stream(REQUEST, record)
    start = events[0]
    assert isinstance(start, MessageStart) and start.message["role"] == "assistant"
    assert start.headers["anthropic-ratelimit-requests-remaining"] == "41"
    assert start.headers["request-id"] == "req_local"
    assert start.headers == response.headers


@pytest.mark.parametrize("stream", MODES)
async def test_an_error_answer_carries_its_headers(serve: Any, stream: bool) -> None:
    limits = {"anthropic-ratelimit-requests-remaining": "0", "retry-after": "7"}
    answer = RawResponse(429, error(429, "rate_limit_error", "slow down").json, headers=limits)
    server = serve([answer])
    with pytest.raises(RateLimitError) as info:
        await AnthropicProvider(server.client(), stream=stream).complete(REQUEST)
    assert info.value.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert info.value.headers["retry-after"] == "7"
    assert info.value.request_id == info.value.headers["request-id"] == "req_local"


@pytest.mark.parametrize("stream", MODES)
async def test_a_retry_after_over_the_ceiling_is_raised_at_once(serve: Any, stream: bool) -> None:
    server = serve([Fault.rate_limited(retry_after=3600), reply("never")])
    provider = AnthropicProvider(server.client(max_retries=3), stream=stream)
    assert provider.max_retry_wait == 60.0
    with anyio.fail_after(10), pytest.raises(RateLimitError, match="max_retry_wait") as info:
        await provider.complete(REQUEST)
    assert info.value.headers["retry-after"] == "3600" and info.value.status_code == 429
    assert len(server.recorded) == 1


async def test_a_retry_after_under_the_ceiling_is_waited_for(serve: Any) -> None:
    server = serve([Fault.rate_limited(retry_after=0.3), reply("ok")])
    provider = AnthropicProvider(server.client(max_retries=1), max_retry_wait=0.5)
    assert (await provider.complete(REQUEST)).text == "ok"
    first, second = server.request_times
    assert second - first >= 0.25


def test_max_retry_wait_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="max_retry_wait"):
        AnthropicProvider(anthropic.AsyncAnthropic(api_key="k"), max_retry_wait=0)


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("params", [{}, {"timeout": 30.0}], ids=["default", "given"])
async def test_requests_carry_the_sdks_own_timeout_headers(
    serve: Any, stream: bool, params: dict[str, Any]
) -> None:
    ours, theirs = serve([reply("ok")]), serve([reply("ok")])
    await AnthropicProvider(ours.client(), stream=stream).complete(replace(REQUEST, params=params))
    answer = await theirs.client().messages.create(**_plain_arguments(), **params, stream=stream)
    if stream:
        async for _ in answer:  # type: ignore[union-attr]
            pass
    (sent,), (expected,) = ours.recorded, theirs.recorded
    for name in ("x-stainless-timeout", "x-stainless-read-timeout"):
        assert sent.headers[name] == expected.headers[name]
    if not stream:  # the SDK's default timeout (600 s), never a placeholder
        assert sent.headers["x-stainless-timeout"] == ("30.0" if params else "600")


# ------------------------------------------------------------------ where the SDK cannot


SURROGATE = "name: \udce9"  # a lone surrogate, as os.fsdecode gives for a non-UTF-8 name


async def test_the_sdk_cannot_send_a_lone_surrogate(serve: Any) -> None:
    client = serve([reply("never")]).client()
    with pytest.raises(UnicodeEncodeError):
        await client.messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": SURROGATE}]
        )


@pytest.mark.parametrize("stream", MODES)
async def test_a_lone_surrogate_is_sent_escaped_with_the_same_options(
    serve: Any, stream: bool
) -> None:
    params = {
        "betas": ["b-1"],
        "temperature": 0.5,
        "extra_headers": {"x-trace": "t"},
        "extra_query": {"region": "eu"},
        "extra_body": {"custom": 1},
    }
    plain, escaped = serve([reply("ok")]), serve([reply("ok")])
    for server, prompt in ((plain, "name: x"), (escaped, SURROGATE)):
        provider = AnthropicProvider(server.client(), stream=stream)
        request = replace(REQUEST, messages=[Message.user(prompt)], params=params)
        assert (await provider.complete(request)).text == "ok"
    (sent,) = escaped.recorded
    (expected,) = plain.recorded
    assert sent.body["messages"][0]["content"] == SURROGATE
    assert sent.body == {**expected.body, "messages": sent.body["messages"]}
    assert sent.query == expected.query == {"region": "eu"}
    for name in ("anthropic-beta", "x-trace", "x-stainless-timeout", "authorization"):
        assert sent.headers[name] == expected.headers[name]


async def test_streamed_tool_input_is_parsed_once_not_per_delta(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's `messages.stream()` re-parses the partial input on every delta."""
    import jiter

    parsed: list[int] = []
    real = jiter.from_json

    def counting(data: bytes, *args: Any, **kwargs: Any) -> Any:
        parsed.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(jiter, "from_json", counting)
    value = "x" * 2000
    server = serve(
        [reply(tool_call("noop", {"value": value})), reply(tool_call("noop", {"value": value}))]
    )
    client = server.client()
    async with client.messages.stream(**_plain_arguments()) as helper:
        await helper.get_final_message()
    deltas = len(parsed)
    assert deltas > 50 and sum(parsed) > 50 * 1000  # every delta: the whole input again
    parsed.clear()
    response = await AnthropicProvider(client, stream=True).complete(REQUEST)
    assert response.tool_uses[0].input == {"value": value}
    assert parsed == []


def _plain_arguments() -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_stream_failing_before_any_block_is_retried_then_raised_with_its_cause(
    serve: Any,
) -> None:
    broken = Fault.stream_error(reply("never"), after_blocks=0)
    server = serve([broken, broken])
    provider = AnthropicProvider(server.client(max_retries=1), stream=True)
    with pytest.raises(OverloadedError) as info:
        await provider.complete(REQUEST)
    assert len(server.recorded) == 2
    assert isinstance(info.value.__cause__, anthropic.APIStatusError)
    assert info.value.headers["request-id"] == "req_local"


def test_retry_after_reads_seconds_milliseconds_and_dates() -> None:
    from email.utils import formatdate

    from agentloop.providers.base import retry_after

    assert retry_after({"retry-after": "7"}) == 7.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "7"}) == 0.25
    assert retry_after({"retry-after": formatdate(0, usegmt=True)}) == 0.0  # long past
    assert 3590 < (retry_after({"retry-after": formatdate(time.time() + 3600)}) or 0) <= 3600
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None
