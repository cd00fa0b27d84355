"""Hostile tool behaviour and text: lone surrogates and BaseExceptions never leave a run
with a history that cannot be sent, and never reach the caller in disguise."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agentloop import Agent, lint_history, tool
from agentloop.messages import TextBlock, parse_history
from agentloop.testing import MessagesServer, ScriptedProvider, SteppedProvider, reply, tool_call

MakeAgent = Callable[..., tuple[Agent, MessagesServer]]
NOT_UTF8 = os.fsdecode(b"caf\xe9.txt")  # what os.listdir gives for a non-UTF-8 name


@tool
def list_dir() -> str:
    """List a directory."""
    return f"files: {NOT_UTF8}"


@tool
def list_blocks() -> list[TextBlock]:
    """List a directory as blocks."""
    return [TextBlock(text=NOT_UTF8)]


@pytest.mark.parametrize("which", ["str", "blocks"])
async def test_a_tool_result_with_a_lone_surrogate_is_made_sendable(
    http_agent: MakeAgent, which: str
) -> None:
    name = "list_dir" if which == "str" else "list_blocks"
    agent, server = http_agent(
        [reply(tool_call(name, {})), reply("done")], tools=[list_dir, list_blocks]
    )
    result = await agent.run("ls")
    assert result.text == "done"
    (record,) = result.tool_calls
    assert not record.is_error
    assert "caf\ufffd.txt" in record.output and "U+FFFD" in record.output
    json.dumps(result.messages).encode()  # no surrogate left anywhere
    lint_history(parse_history(result.messages))
    assert len(server.requests) == 2


@tool
def keep(value: str) -> str:
    """Keep a value."""
    return f"kept {len(value)} characters"


async def test_model_input_with_a_lone_surrogate_goes_back_as_the_api_sent_it(
    http_agent: MakeAgent,
) -> None:
    agent, server = http_agent(
        [reply(tool_call("keep", {"value": "x\ud800y"})), reply("done")], tools=[keep]
    )
    result = await agent.run("go")
    assert result.text == "done", result
    assert result.tool_calls[0].output == "kept 3 characters"
    # The next request carried the input back verbatim (as a JSON escape).
    sent = server.requests[1]["messages"][1]["content"][0]
    assert sent["input"] == {"value": "x\ud800y"}


async def test_a_prompt_with_a_lone_surrogate_is_sent_escaped(serve: Any) -> None:
    server = serve([reply("ok")])
    result = await Agent(client=server.client()).run("name: \udce9")
    assert result.text == "ok"
    # a text block, to carry the cache breakpoint; the text as it was
    (sent,) = server.requests[0]["messages"][0]["content"]
    assert sent == {"type": "text", "text": "name: \udce9", "cache_control": {"type": "ephemeral"}}


class Custom(BaseException):
    pass


def raiser(kind: type[BaseException]) -> Any:
    @tool
    async def boom() -> str:
        """Raise."""
        raise kind("from a tool")

    return boom


@tool
async def sibling() -> str:
    """A sibling call that waits."""
    await anyio.sleep(5)
    return "late"


BASE = [KeyboardInterrupt, SystemExit, GeneratorExit, Custom]


# asyncio lets a KeyboardInterrupt or SystemExit straight out of its loop, and a sibling
# task not yet started is then never awaited: asyncio's behaviour, not the run's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_stream"])
@pytest.mark.parametrize("kind", BASE, ids=[k.__name__ for k in BASE])
def test_a_base_exception_from_a_tool_propagates_as_itself(
    kind: type[BaseException], streamed: bool, backend: str
) -> None:
    """Not wrapped in an exception group: `except KeyboardInterrupt` in the caller works.

    Run in an event loop of its own: asyncio lets a KeyboardInterrupt or SystemExit out of
    the loop itself, so it cannot be caught inside the test's loop.
    """
    script = [reply(tool_call("boom", {}), tool_call("sibling", {}))]
    tools = [raiser(kind), sibling]

    async def main() -> None:
        if streamed:
            agent = Agent(provider=SteppedProvider(script), tools=tools)
            async with agent.run_stream("go") as stream:
                async for _ in stream:
                    pass
        else:
            await Agent(provider=ScriptedProvider(script), tools=tools).run("go")

    with pytest.raises(kind) as info:
        anyio.run(main, backend=backend)
    # The loop's leftover tasks log their exception when collected; collected here, not
    # during a later test's ast.parse (CPython 3.11's traceback formatting parses source,
    # and a parse nested in another one fails it with "AST constructor recursion depth
    # mismatch").
    gc.collect()
    assert type(info.value) is kind
    assert str(info.value) == "from a tool"
