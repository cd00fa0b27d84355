"""The providers' own retries: each one a `RequestRetry` event and a `model.retry` log line.

Real SDK clients talk to a real closed port and to scripted servers that answer 529 and
429 with `retry-after` before a reply; waits are kept tiny by `retry_delay` and the
`retry-after` the scripts send.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from structlog.testing import capture_logs

from agentloop import Agent, AnthropicProvider, OpenAIChatProvider, RequestRetry
from agentloop.errors import APIConnectionError, OverloadedError
from agentloop.providers.base import Provider
from agentloop.result import RunResult
from agentloop.testing import Fault, reply

MODES = [pytest.param(False, id="json"), pytest.param(True, id="stream")]
USAGE = {"input_tokens": 11, "output_tokens": 7}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that nothing listens on: a connection there is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def run_seeing_retries(
    provider: Provider, **options: Any
) -> tuple[RunResult[Any] | None, list[RequestRetry], BaseException | None]:
    """Run "hi" through `provider`, reading the run's events; the retries it saw."""
    agent = Agent(model="m", provider=provider, **options)
    retries: list[RequestRetry] = []
    failure: BaseException | None = None
    run = agent.start("hi")
    try:
        async with run:
            async for event in run:
                if isinstance(event, RequestRetry):
                    retries.append(event)
    except (APIConnectionError, OverloadedError) as exc:
        failure = exc
    return (None if failure else run.result), retries, failure


@pytest.mark.parametrize("stream", MODES)
async def test_a_refused_connection_is_retried_and_each_retry_told(
    closed_port: int, stream: bool
) -> None:
    client = anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{closed_port}", api_key="k", max_retries=2
    )
    provider = AnthropicProvider(client, stream=stream, retry_delay=0.01)
    try:
        with capture_logs() as logs:
            result, retries, failure = await run_seeing_retries(provider)
    finally:
        await client.close()
    assert result is None and isinstance(failure, APIConnectionError)
    assert [(r.attempt, r.reason) for r in retries] == [
        (1, "connection refused"),
        (2, "connection refused"),
    ]
    # The SDK's backoff shape: the delay doubling, less up to a quarter.
    assert 0.0075 <= retries[0].wait <= 0.01 and 0.015 <= retries[1].wait <= 0.02
    told = [entry for entry in logs if entry["event"] == "model.retry"]
    assert [entry["attempt"] for entry in told] == [1, 2]
    assert told[0]["reason"] == "connection refused"


@pytest.mark.parametrize("stream", MODES)
async def test_overloaded_and_rate_limited_answers_are_waited_out(serve: Any, stream: bool) -> None:
    server = serve(
        [
            Fault.overloaded(retry_after=0.05),
            Fault.rate_limited(retry_after=0.02),
            reply("ok", usage=USAGE),
        ]
    )
    provider = AnthropicProvider(server.client(max_retries=2), stream=stream)
    result, retries, failure = await run_seeing_retries(provider)
    assert failure is None and result is not None
    assert result.text == "ok"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (11, 7)
    assert retries == [
        RequestRetry(1, 0.05, "529 overloaded"),
        RequestRetry(2, 0.02, "429 rate limited"),
    ]
    assert len(server.recorded) == 3
    first, second, third = server.request_times
    assert second - first >= 0.045 and third - second >= 0.015


@pytest.mark.parametrize("stream", MODES)
async def test_the_attempts_honour_the_clients_max_retries(serve: Any, stream: bool) -> None:
    busy = Fault.overloaded(retry_after=0.01)
    server = serve([busy, busy, busy, reply("late")])
    provider = AnthropicProvider(server.client(max_retries=1), stream=stream)
    result, retries, failure = await run_seeing_retries(provider)
    assert isinstance(failure, OverloadedError) and result is None
    assert [r.attempt for r in retries] == [1]
    assert len(server.recorded) == 2  # the first attempt and one retry


async def test_a_stream_is_not_retried_once_content_arrived(serve: Any) -> None:
    server = serve([Fault.stream_error(reply("partial", "more"), after_blocks=1), reply("x")])
    provider = AnthropicProvider(server.client(max_retries=2), stream=True)
    result, retries, failure = await run_seeing_retries(provider)
    assert isinstance(failure, OverloadedError) and result is None
    assert retries == [] and len(server.recorded) == 1


async def test_a_client_without_retries_sends_once(serve: Any) -> None:
    server = serve([Fault.overloaded(retry_after=0.01), reply("never")])
    provider = AnthropicProvider(server.client(max_retries=0))
    _, retries, failure = await run_seeing_retries(provider)
    assert isinstance(failure, OverloadedError) and retries == []
    assert len(server.recorded) == 1


@pytest.mark.parametrize("stream", MODES)
async def test_chat_completions_retries_are_told_too(serve_chat: Any, stream: bool) -> None:
    server = serve_chat([Fault.rate_limited(retry_after=0.02), reply("ok")])
    provider = OpenAIChatProvider(server.client(max_retries=1), stream=stream)
    result, retries, failure = await run_seeing_retries(provider)
    assert failure is None and result is not None and result.text == "ok"
    assert retries == [RequestRetry(1, 0.02, "429 rate limited")]
    assert len(server.recorded) == 2


async def test_chat_completions_refused_connection_is_retried(closed_port: int) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{closed_port}/v1", api_key="x", max_retries=1
    )
    provider = OpenAIChatProvider(client, compat="ollama", retry_delay=0.01)
    try:
        _, retries, failure = await run_seeing_retries(provider)
    finally:
        await client.close()
    assert isinstance(failure, APIConnectionError)
    assert [(r.attempt, r.reason) for r in retries] == [(1, "connection refused")]


def test_retry_delay_is_checked() -> None:
    from agentloop.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="retry_delay"):
        AnthropicProvider(anthropic.AsyncAnthropic(api_key="k"), retry_delay=0)


async def test_each_retry_reaches_the_runs_on_event_too(serve: Any) -> None:
    """As every event of the run does: a durable engine or a gateway records it there."""
    server = serve([Fault.overloaded(retry_after=0.01), reply("ok")])
    agent = Agent(model="m", provider=AnthropicProvider(server.client(max_retries=1)))
    handed: list[Any] = []

    async def on_event(event: Any) -> None:
        handed.append(event)

    async with agent.start("hi", on_event=on_event, stream=False) as run:
        streamed = [event async for event in run]
    retries = [e for e in handed if isinstance(e, RequestRetry)]
    assert retries == [RequestRetry(1, 0.01, "529 overloaded")]
    assert [e for e in streamed if isinstance(e, RequestRetry)] == retries
    assert run.result.text == "ok"
