"""Bad configuration and bad calls: one `ConfigurationError` (or `HistoryError`) at once,
before anything is sent, never a raw TypeError or a late failure."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agentloop import Agent, ConfigurationError, HistoryError, repair
from agentloop.testing import MessagesServer, ScriptedProvider, reply

BAD_OPTIONS = [
    ("tool_concurrency", None),
    ("tool_concurrency", "4"),
    ("tool_concurrency", 1.5),
    ("tool_concurrency", 0),
    ("tool_concurrency", True),
    ("tool_timeout", math.nan),
    ("tool_timeout", 0),
    ("tool_timeout", -1),
    ("tool_timeout", "30"),
    ("max_rounds", 2.5),
    ("max_rounds", 0),
    ("max_tokens", None),
    ("tools", None),
    ("tools", "get_weather"),
    ("tool_limiter", 2),
    ("on_tool_error", "ignore"),
    ("history_check", "loose"),
    ("provider", object()),
]


@pytest.mark.parametrize(
    ("name", "value"),
    BAD_OPTIONS,
    ids=[f"{n}={v!r}" if type(v) is not object else f"{n}=object()" for n, v in BAD_OPTIONS],
)
def test_a_bad_option_is_refused_at_construction(name: str, value: Any) -> None:
    options: dict[str, Any] = {"provider": ScriptedProvider([]), name: value}
    with pytest.raises(ConfigurationError, match=name if name != "provider" else "complete"):
        Agent(**options)


async def test_an_infinite_timeout_means_no_timeout() -> None:
    from agentloop import tool
    from agentloop.testing import tool_call

    @tool
    async def naps() -> str:
        """Sleeps a little."""
        await anyio.sleep(0.05)
        return "rested"

    agent = Agent(
        provider=ScriptedProvider([reply(tool_call("naps")), reply("done")]),
        tools=[naps],
        tool_timeout=math.inf,
    )
    result = await agent.run("go")
    (record,) = result.tool_calls
    assert (record.output, record.is_error) == ("rested", False)
    assert result.stop_reason == "end_turn"


@pytest.mark.parametrize(
    "prompt",
    [42, {"text": "hi"}, ["one", "two"], b"bytes"],
    ids=["int", "dict", "strings", "bytes"],
)
async def test_a_prompt_of_the_wrong_type_is_refused(prompt: Any) -> None:
    provider = ScriptedProvider([reply("never")])
    with pytest.raises(ConfigurationError, match="prompt"):
        await Agent(provider=provider).run(prompt)
    assert provider.requests == []


async def test_a_history_that_is_not_a_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="history"):
        await Agent(provider=ScriptedProvider([])).run("hi", history="earlier text")  # type: ignore[arg-type]


async def test_a_history_starting_with_the_assistant_is_caught_before_sending(
    serve: Callable[..., MessagesServer],
) -> None:
    server = serve([reply("ok")])
    history = [{"role": "assistant", "content": "Hello, how can I help?"}]
    agent = Agent(client=server.client())
    with pytest.raises(HistoryError, match="first message must use the user role"):
        await agent.run("hi", history=history)
    assert server.requests == []
    result = await agent.run("hi", history=repair(history).messages)
    assert result.text == "ok"
    assert server.requests[0]["messages"][0]["role"] == "user"


@pytest.mark.parametrize("prompt", ["   ", "\n\t"], ids=["spaces", "newline-tab"])
async def test_a_whitespace_only_prompt_is_caught_before_sending(
    serve: Callable[..., MessagesServer], prompt: str
) -> None:
    server = serve([reply("ok")])
    with pytest.raises(HistoryError, match="non-whitespace text"):
        await Agent(client=server.client()).run(prompt)
    assert server.requests == []
