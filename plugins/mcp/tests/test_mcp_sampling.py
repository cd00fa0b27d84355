"""Sampling answered by the calling run's own model, counted in its usage and cost.

The model is `MessagesServer` spoken to by the real anthropic SDK; the MCP server is the
test server in its own process. `sample` asks the way servers on earlier protocols do (a
request of its own, sent while the call runs), `sample_in_call` the 2026 way (as part of
the call's result).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from _mcp_support import SERVER_SCRIPT, ConnectionLog
from agentloop import Agent, AnthropicProvider, ToolError, UsageLimitExceeded, UsageLimits
from agentloop.pricing import cost_of
from agentloop.result import RunResult, Usage
from agentloop.testing import MessagesServer, reply, tool_call

from agentloop_mcp import MCPSampling, MCPServer, MCPToolSource, load_config

MODEL = "claude-sonnet-4-6"
SMALL = "claude-haiku-4-5"
ASKERS = [
    pytest.param("sample", "legacy", id="request-during-call"),
    pytest.param("sample_in_call", "auto", id="input-required"),
]


def used(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def priced(model: str, *counts: tuple[int, int]) -> float:
    total = 0.0
    for input_tokens, output_tokens in counts:
        cost = cost_of(model, Usage(input_tokens, output_tokens, requests=1))
        assert cost is not None
        total += cost
    return total


def agent_on(server: MessagesServer, source: MCPToolSource, **options: Any) -> Agent:
    options.setdefault("model", MODEL)
    return Agent(provider=AnthropicProvider(server.client()), tools=source.tools(), **options)


def errors(result: RunResult) -> list[str]:
    return [str(c.output) for c in result.tool_calls if c.is_error]


@pytest.mark.parametrize(("asker", "protocol"), ASKERS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_run_answers_with_its_own_model_and_pays_for_it(
    stdio_server: Callable[..., MCPServer],
    no_leaks: ConnectionLog,
    asker: str,
    protocol: str,
    stream: bool,
) -> None:
    script = [
        reply(tool_call(asker, {"prompt": "2+2?"}, id="t1"), usage=used(100, 20)),
        reply("four", usage=used(30, 5)),  # the server's sampling request
        reply("The tool says four.", usage=used(150, 10)),
    ]
    async with (
        MessagesServer(script) as model,
        MCPToolSource([stdio_server(protocol=protocol)]) as source,
    ):
        provider = AnthropicProvider(model.client(), stream=stream)
        agent = Agent(provider=provider, model=MODEL, tools=source.tools())
        result = await agent.run("What is 2+2? Ask the tool.")
    assert [c.output for c in result.tool_calls] == ["scripted: four"]
    sampled = model.requests[1]
    assert (sampled["model"], sampled["max_tokens"]) == (MODEL, 50)
    assert sampled["messages"] == [{"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]
    assert "tools" not in sampled
    assert (result.usage.input_tokens, result.usage.output_tokens) == (280, 35)
    assert result.usage.requests == 3
    assert result.cost == pytest.approx(priced(MODEL, (100, 20), (30, 5), (150, 10)))
    assert result.text == "The tool says four."


async def test_the_config_names_the_model_and_the_limit(
    tmp_path: Path, conn_log: ConnectionLog, no_leaks: ConnectionLog
) -> None:
    config = tmp_path / "mcp.json"
    entry = {
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT)],
        "env": {"MCP_TEST_CONN_LOG": str(conn_log.path)},
        "protocol": "legacy",
        "sampling_model": SMALL,
        "sampling_max_requests": 1,
    }
    config.write_text(json.dumps({"mcpServers": {"asker": entry}}))
    script = [
        reply(tool_call("sample", {"prompt": "one"}), usage=used(100, 20)),
        reply("first", usage=used(30, 5)),
        reply(tool_call("sample", {"prompt": "two"}), usage=used(200, 20)),
        reply("Only one answer.", usage=used(300, 10)),
    ]
    async with MessagesServer(script) as model, MCPToolSource(load_config(config)) as source:
        result = await agent_on(model, source).run("Sample twice.")
    assert result.tool_calls[0].output == "scripted: first"
    assert errors(result) == [
        "MCP server 'asker' refused the call to 'sample': sampling limit reached for this "
        "server (1 requests, 20000 tokens) (code -32600)"
    ]
    assert [r["model"] for r in model.requests] == [MODEL, SMALL, MODEL, MODEL]
    assert result.usage.requests == 4  # the refused request never reached the model
    assert result.cost == pytest.approx(
        priced(MODEL, (100, 20), (200, 20), (300, 10)) + priced(SMALL, (30, 5))
    )


async def test_requests_at_once_stay_within_the_limit(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    # Two calls ask at the same moment (the server waits for both); one request is allowed.
    twice = {"prompt": "hi", "together": 2}
    script = [
        reply(tool_call("sample", twice), tool_call("sample", twice)),
        reply("the one answer"),
        reply("One of two."),
    ]
    server = stdio_server(protocol="legacy", sampling_max_requests=1)
    async with MessagesServer(script) as model, MCPToolSource([server]) as source:
        result = await agent_on(model, source).run("Sample twice at once.")
    outputs = sorted((c.is_error, str(c.output)) for c in result.tool_calls)
    assert outputs[0] == (False, "scripted: the one answer")
    assert outputs[1][0] and "sampling limit reached for this server (1 requests" in outputs[1][1]
    assert len(model.requests) == 3


async def test_a_server_switched_off_is_refused(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    script = [reply(tool_call("sample", {"prompt": "hi"})), reply("It may not sample.")]
    async with (
        MessagesServer(script) as model,
        MCPToolSource([stdio_server(protocol="legacy", sampling=False)]) as source,
    ):
        result = await agent_on(model, source).run("Sample.")
    [error] = errors(result)
    assert "Sampling not supported" in error
    assert len(model.requests) == 2 and result.usage.requests == 2


async def test_the_run_usage_limit_bounds_sampling(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    # The first response alone reaches the output-token limit: the sampling request is
    # refused before it is sent, and the run then stops on the limit.
    script = [reply(tool_call("sample", {"prompt": "hi"}), usage=used(10, 50)), reply("unused")]
    async with (
        MessagesServer(script) as model,
        MCPToolSource([stdio_server(protocol="legacy")]) as source,
    ):
        agent = agent_on(model, source, usage_limits=UsageLimits(output_tokens=50))
        with pytest.raises(UsageLimitExceeded) as raised:
            await agent.run("Sample.")
    assert len(model.requests) == 1
    partial = raised.value.result
    assert partial is not None
    assert "usage limit (output_tokens = 50) was reached" in errors(partial)[0]


async def test_calls_of_two_runs_at_once(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    """On the 2026 protocol each request is counted in its own run; earlier, it is refused.

    Both runs' calls are in flight on one connection when the server asks (it waits for
    both). A request sent on its own cannot be told apart, so it is refused (no
    `MCPSampling` names a model of its own); one asked within the call is answered by
    the call's run.
    """
    results: dict[str, RunResult] = {}
    async with MCPToolSource(
        [stdio_server("old", protocol="legacy", prefix="old"), stdio_server("new", prefix="new")]
    ) as source:
        for tool in ("old_sample", "new_sample_in_call"):
            scripts = {
                name: [
                    reply(tool_call(tool, {"prompt": name, "together": 2}), usage=used(10, 1)),
                    reply(f"answer for {name}", usage=used(20, 2)),
                    reply("done", usage=used(30, 3)),
                ]
                for name in ("a", "b")
            }
            async with MessagesServer(scripts["a"]) as a, MessagesServer(scripts["b"]) as b:
                runs = {"a": agent_on(a, source), "b": agent_on(b, source, model=SMALL)}

                async def run(name: str) -> None:
                    results[name] = await runs[name].run(f"sample for {name}")  # noqa: B023

                async with anyio.create_task_group() as group:
                    group.start_soon(run, "a")
                    group.start_soon(run, "b")
                if tool == "old_sample":
                    for name in ("a", "b"):
                        [error] = errors(results[name])
                        assert "calls of several runs are in flight" in error
                        assert results[name].usage.requests == 2
                else:
                    assert results["a"].tool_calls[0].output == "scripted: answer for a"
                    assert results["b"].tool_calls[0].output == "scripted: answer for b"
                    assert [r["model"] for r in a.requests] == [MODEL] * 3
                    assert [r["model"] for r in b.requests] == [SMALL] * 3
                    assert results["a"].usage.requests == results["b"].usage.requests == 3


async def test_a_given_model_answers_outside_any_run(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MessagesServer([reply("direct", usage=used(5, 1))]) as model:
        sampling = MCPSampling(provider=AnthropicProvider(model.client()), model=SMALL)
        server = stdio_server(protocol="legacy")
        async with MCPToolSource([server], sampling=sampling) as source:
            tools = {t.name: t for t in source.tools()}
            assert await tools["sample"](prompt="hi") == "scripted: direct"
        assert model.requests[0]["model"] == SMALL
    async with MCPToolSource([stdio_server(protocol="legacy")]) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError, match="no run made the call"):
            await tools["sample"](prompt="hi")


def test_the_command_line_samples_with_the_agent_model(
    tmp_path: Path, conn_log: ConnectionLog
) -> None:
    """`agentloop run --mcp-config FILE`: the server's request goes to the run's model."""
    config = tmp_path / "mcp.json"
    entry = {
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT)],
        "env": {"MCP_TEST_CONN_LOG": str(conn_log.path)},
        "protocol": "legacy",
    }
    off = {**entry, "sampling": False, "prefix": "off"}
    config.write_text(json.dumps({"mcpServers": {"asker": entry, "quiet": off}}))
    # Two calls of one run in flight at once (the server waits for both): both answered.
    twice = {"prompt": "2+2?", "together": 2}
    script = [
        reply(tool_call("sample", twice), tool_call("sample", twice), usage=used(100, 20)),
        reply("four", usage=used(30, 5)),
        reply("four", usage=used(30, 5)),
        reply(tool_call("off_sample", {"prompt": "2+3?"}), usage=used(200, 20)),
        reply("Both said four.", usage=used(300, 10)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLOOP_", "ANTHROPIC_"))}
    with MessagesServer(script) as model:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "agentloop", "run", "Ask the tools."),
                *("--model", MODEL, "--mcp-config", str(config), "--json"),
            ],
            capture_output=True,
            text=True,
            env={**env, "ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": model.base_url},
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    calls = result["tool_calls"]
    assert [(c["output"], c["is_error"]) for c in calls[:2]] == [("scripted: four", False)] * 2
    assert calls[2]["is_error"] and "Sampling not supported" in calls[2]["output"]
    assert [r["model"] for r in model.requests] == [MODEL] * 5
    usage = result["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["requests"]) == (660, 60, 5)
