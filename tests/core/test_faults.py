"""Faults on the wire, through the real SDK: its retries recover, exhausted ones are typed.

Retries are the SDK's own (`AsyncAnthropic(max_retries=N)`): it honours `retry-after` and
otherwise backs off 0.5 s * 2**attempt (jittered down by up to 25 %, capped at 8 s). The
faults here send small `retry-after` values so the file stays fast.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentloop import (
    Agent,
    AnthropicProvider,
    ProviderError,
    RunContext,
    RunResult,
    lint_history,
    tool,
)
from agentloop.errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequestError,
    InvalidResponseError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import parse_history
from agentloop.testing import Fault, MessagesServer, reply, tool_call

FAST = 0.05  # seconds of retry-after for faults that should be retried quickly

MODES = [pytest.param(False, id="json"), pytest.param(True, id="sse")]


class Tools:
    """A tool that counts its executions per tool_use id."""

    def __init__(self) -> None:
        self.runs: collections.Counter[str] = collections.Counter()

        @tool
        async def lookup(ctx: RunContext[None], key: str = "") -> str:
            """Look a key up."""
            self.runs[ctx.tool_use_id] += 1
            await anyio.lowlevel.checkpoint()
            return f"value of {key}"

        self.lookup = lookup


Make = Callable[..., tuple[Agent, MessagesServer, Tools]]


@pytest.fixture
async def servers() -> AsyncIterator[list[MessagesServer]]:
    started: list[MessagesServer] = []
    yield started
    for server in started:
        await server.aclose()


@pytest.fixture(params=MODES)
def make(request: pytest.FixtureRequest, servers: list[MessagesServer]) -> Make:
    """An Agent over `server.client(max_retries=...)`, JSON or SSE, with a counting tool."""

    def build(
        script: Any, *, retries: int, backoff: float | None = FAST, **client_options: Any
    ) -> tuple[Agent, ...]:
        """`backoff`: the first wait before a retry the API names no wait for (None: the
        provider's default)."""
        server = MessagesServer(script).start()
        servers.append(server)
        client = server.client(max_retries=retries, **client_options)
        tools = Tools()
        waits = {} if backoff is None else {"retry_delay": backoff}
        provider = AnthropicProvider(client, stream=request.param, **waits)
        agent = Agent(provider=provider, tools=[tools.lookup])
        return agent, server, tools

    build.streaming = request.param  # type: ignore[attr-defined]
    return build  # type: ignore[return-value]


def calls(*keys: str) -> dict[str, Any]:
    return reply(*[tool_call("lookup", {"key": k}) for k in keys])


def check_history(result: RunResult, tools: Tools) -> None:
    """Valid to send again; every tool_use answered exactly once; no tool run twice."""
    messages = parse_history(result.messages)
    lint_history(messages)
    uses = [b.id for m in messages if m.role == "assistant" for b in m.tool_uses]
    answered = [
        b["tool_use_id"]
        for m in result.messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert sorted(uses) == sorted(answered)
    assert all(count == 1 for count in tools.runs.values()), tools.runs
    assert set(tools.runs) <= set(uses)


# -- retried faults: the run completes

RETRIED = [
    pytest.param(Fault.rate_limited(retry_after=FAST), FAST, id="429"),
    pytest.param(Fault.server_error(retry_after=FAST), FAST, id="500"),
    pytest.param(Fault.overloaded(retry_after=FAST), FAST, id="529"),
    pytest.param(Fault.server_error(), None, id="500-default-backoff"),
    pytest.param(Fault.dropped(), FAST, id="dropped"),
]


@pytest.mark.parametrize(("fault", "backoff"), RETRIED)
async def test_retryable_fault_is_retried_and_the_run_completes(
    make: Make, fault: Fault, backoff: float | None
) -> None:
    script = [calls("a", "b"), fault, reply("done")]
    agent, server, tools = make(script, retries=1, backoff=backoff)
    result = await agent.run("go")
    assert result.text == "done" and result.stop_reason == "end_turn"
    assert len(server.requests) == 3 and result.rounds == 2
    assert result.usage.requests == 2 and result.usage.input_tokens == 20
    assert sorted(tools.runs.values()) == [1, 1]
    check_history(result, tools)


async def test_several_faults_in_a_row_are_all_retried(make: Make) -> None:
    faults = [
        Fault.dropped(),
        Fault.rate_limited(retry_after=FAST),
        Fault.server_error(retry_after=FAST),
        Fault.overloaded(retry_after=FAST),
    ]
    script = [calls("a"), *faults, calls("b", "c"), Fault.rate_limited(FAST), reply("done")]
    agent, server, tools = make(script, retries=4)
    result = await agent.run("go")
    assert result.text == "done" and len(server.requests) == 8
    assert result.rounds == 3 and result.usage.requests == 3
    assert len(tools.runs) == 3
    check_history(result, tools)


async def test_retry_after_is_honoured(make: Make) -> None:
    # 0.15 s is well above the first backoff these agents wait (FAST) when told nothing.
    agent, server, _ = make(
        [calls("a"), Fault.rate_limited(retry_after=0.15), reply("ok")], retries=2
    )
    result = await agent.run("go")
    assert result.text == "ok"
    times = server.request_times
    assert 0.14 <= times[2] - times[1] < 3.0


async def test_a_mid_stream_overload_before_any_block_is_retried(make: Make) -> None:
    if not make.streaming:  # type: ignore[attr-defined]
        pytest.skip("an SSE error event needs a streamed response")
    script = [calls("a"), Fault.stream_error(calls("b"), after_blocks=0), reply("done")]
    agent, server, tools = make(script, retries=1)
    result = await agent.run("go")
    assert result.text == "done" and len(server.requests) == 3
    check_history(result, tools)


# -- exhausted retries: the typed error carries the partial result

EXHAUSTED = [
    pytest.param(Fault.rate_limited(retry_after=FAST), RateLimitError, id="429"),
    pytest.param(Fault.server_error(retry_after=FAST), ServerError, id="500"),
    pytest.param(Fault.overloaded(retry_after=FAST), OverloadedError, id="529"),
    pytest.param(Fault.dropped(), APIConnectionError, id="dropped"),
]


@pytest.mark.parametrize(("fault", "expected"), EXHAUSTED)
async def test_exhausted_retries_raise_the_typed_error_with_the_partial_result(
    make: Make, fault: Fault, expected: type[ProviderError]
) -> None:
    first = calls("a", "b")

    def script(body: dict[str, Any]) -> Any:
        return first if len(body["messages"]) == 1 else fault

    agent, server, tools = make(script, retries=1)
    with pytest.raises(expected) as info:
        await agent.run("go")
    assert type(info.value) is expected
    assert len(server.requests) == 1 + 2  # the first round, then one try and one retry
    partial = info.value.result
    assert partial is not None and partial.stop_reason == "error"
    assert partial.rounds == 2 and partial.usage.requests == 1
    assert partial.usage.input_tokens == 10
    assert [c.output for c in partial.tool_calls] == ["value of a", "value of b"]
    check_history(partial, tools)


async def test_timeouts_on_a_slow_response_end_as_a_connection_error(make: Make) -> None:
    script = [calls("a"), Fault.slow(1.5), Fault.slow(1.5), reply("never")]
    agent, server, tools = make(script, retries=1, timeout=0.2)
    with pytest.raises(APIConnectionError) as info:
        await agent.run("go")
    assert len(server.requests) == 3
    partial = info.value.result
    assert partial is not None and partial.usage.requests == 1
    check_history(partial, tools)


# -- faults that are not retried

NOT_RETRIED = [
    pytest.param(400, BadRequestError, id="400"),
    pytest.param(401, AuthenticationError, id="401"),
    pytest.param(403, AuthenticationError, id="403"),
    pytest.param(404, BadRequestError, id="404"),
    pytest.param(413, BadRequestError, id="413"),
]


@pytest.mark.parametrize(("status", "expected"), NOT_RETRIED)
async def test_client_errors_are_not_retried(
    make: Make, status: int, expected: type[ProviderError]
) -> None:
    agent, server, tools = make([calls("a"), Fault.http_error(status), reply("never")], retries=3)
    with pytest.raises(expected) as info:
        await agent.run("go")
    assert type(info.value) is expected and info.value.status_code == status
    assert len(server.requests) == 2
    assert info.value.result is not None
    check_history(info.value.result, tools)


async def test_malformed_json_is_an_invalid_response_error(make: Make) -> None:
    agent, _, tools = make([calls("a"), Fault.malformed_json()], retries=0)
    with pytest.raises(InvalidResponseError) as info:
        await agent.run("go")
    assert info.value.result is not None
    check_history(info.value.result, tools)


# -- streams that break (SSE only)


async def test_overload_after_a_block_fails_the_run_with_a_valid_history(make: Make) -> None:
    if not make.streaming:  # type: ignore[attr-defined]
        pytest.skip("an SSE error event needs a streamed response")
    script = [calls("a"), Fault.stream_error(calls("b", "c"), after_blocks=1), reply("never")]
    agent, server, tools = make(script, retries=2)
    with pytest.raises(OverloadedError) as info:
        await agent.run("go")
    assert len(server.requests) == 2  # content had arrived: not retried
    partial = info.value.result
    assert partial is not None and partial.usage.requests == 1
    check_history(partial, tools)


async def test_overload_after_a_block_in_a_streamed_run(servers: list[MessagesServer]) -> None:
    tools = Tools()
    script = [calls("a"), Fault.stream_error(calls("b", "c"), after_blocks=1)]
    server = MessagesServer(script).start()
    servers.append(server)
    provider = AnthropicProvider(server.client(max_retries=0), stream=True)
    agent = Agent(provider=provider, tools=[tools.lookup])
    with pytest.raises(OverloadedError):
        async with agent.run_stream("go") as stream:
            async for _ in stream:
                pass
    assert stream.result is not None
    check_history(stream.result, tools)


@pytest.mark.parametrize(
    "clean_end",
    [
        pytest.param(False, id="cut"),
        pytest.param(True, id="clean"),
    ],
)
async def test_stream_that_ends_early_is_a_connection_error(make: Make, clean_end: bool) -> None:
    if not make.streaming:  # type: ignore[attr-defined]
        pytest.skip("only a streamed response can end early")
    broken = Fault.stream_ends_early(calls("b", "c"), after_blocks=1, clean_end=clean_end)
    agent, _, tools = make([calls("a"), broken, reply("never")], retries=0)
    with pytest.raises(APIConnectionError) as info:
        await agent.run("go")
    assert info.value.result is not None
    check_history(info.value.result, tools)
