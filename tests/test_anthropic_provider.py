"""AnthropicProvider over the real SDK: parameters through, errors typed, keys checked."""

from __future__ import annotations

import socket
from typing import Any

import anthropic
import httpx2
import pytest

from agentloop import Agent, AnthropicProvider, ProviderError, tool
from agentloop.errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    CreditBalanceError,
    MissingAPIKeyError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import Message
from agentloop.providers.base import ModelRequest
from agentloop.testing import Fault, RawResponse, reply


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


# ------------------------------------------------------------------ complete_once

ERROR_ANSWERS = [
    error(400, "invalid_request_error", CREDIT),
    error(402, "billing_error", "Payment required"),
    error(401, "authentication_error", "invalid x-api-key"),
    error(429, "rate_limit_error", "slow down"),
    error(500, "api_error", "oops"),
    error(529, "overloaded_error", "Overloaded"),
    RawResponse(503, "upstream connect error"),
]


async def _fail(serve: Any, answer: RawResponse, once: bool) -> tuple[ProviderError, list[Any]]:
    server = serve([answer])
    http = anthropic.DefaultAsyncHttpxClient()
    provider = AnthropicProvider(server.client(http_client=http))
    request = ModelRequest(model="m", max_tokens=8, messages=[Message.user("hi")])
    with pytest.raises(ProviderError) as info:
        if once:
            await provider.complete_once(request, http)
        else:
            await provider.complete(request)
    return info.value, server.recorded


@pytest.mark.parametrize("answer", ERROR_ANSWERS, ids=lambda a: str(a.status))
async def test_complete_once_types_errors_as_complete_does(serve: Any, answer: RawResponse) -> None:
    ours, _ = await _fail(serve, answer, once=True)
    theirs, _ = await _fail(serve, answer, once=False)
    assert type(ours) is type(theirs)
    assert (ours.status_code, ours.body, ours.request_id) == (
        theirs.status_code,
        theirs.body,
        theirs.request_id,
    )
    if isinstance(theirs.body, dict):
        assert str(ours) == str(theirs)
    # The cause carries the answer, as the SDK's error does (its headers are read there).
    assert isinstance(ours.__cause__, httpx2.HTTPStatusError)
    assert ours.__cause__.response.status_code == answer.status


async def test_complete_once_sends_once_whatever_the_client_retries(serve: Any) -> None:
    server = serve([Fault.overloaded(retry_after=0), reply("late")])
    http = anthropic.DefaultAsyncHttpxClient()
    provider = AnthropicProvider(server.client(http_client=http, max_retries=3))
    request = ModelRequest(model="m", max_tokens=8, messages=[Message.user("hi")])
    with pytest.raises(OverloadedError) as info:
        await provider.complete_once(request, http)
    assert info.value.__cause__.response.headers["retry-after"] == "0"  # type: ignore[union-attr]
    assert len(server.recorded) == 1
    assert (await provider.complete_once(request, http)).text == "late"


async def test_complete_once_to_an_unreachable_api_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    http = anthropic.DefaultAsyncHttpxClient()
    client = anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{port}", api_key="k", http_client=http
    )
    request = ModelRequest(model="m", max_tokens=8, messages=[Message.user("hi")])
    try:
        with pytest.raises(APIConnectionError, match="could not reach"):
            await AnthropicProvider(client).complete_once(request, http)
    finally:
        await client.close()


async def test_complete_once_goes_through_the_sdk_for_other_clients(serve: Any) -> None:
    class Custom(anthropic.AsyncAnthropic):
        """A client class of the application's, whose requests only the SDK knows how to make."""

    server = serve([reply("ok"), reply("ok")])
    http = anthropic.DefaultAsyncHttpxClient()
    direct = AnthropicProvider(server.client(http_client=http))
    custom = AnthropicProvider(
        Custom(base_url=server.base_url, api_key="k", max_retries=0, http_client=http)
    )
    request = ModelRequest(model="m", max_tokens=8, messages=[Message.user("hi")])
    assert (await direct.complete_once(request, http)).text == "ok"
    assert (await custom.complete_once(request, http)).text == "ok"
    try:
        first, second = server.recorded
        # Only the SDK numbers its attempts.
        assert "x-stainless-retry-count" not in first.headers
        assert second.headers["x-stainless-retry-count"] == "0"
    finally:
        await custom.client.close()
