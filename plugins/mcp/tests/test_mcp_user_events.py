"""What a server shows the user rather than the model, and what it logs, as run events.

Content blocks for the user alone (`audience: ["user"]`) become a `ToolUserContent` event
and stay out of the tool_result; log notifications become `ToolLog` events. Both reach
the run's iteration and its `on_event`, and `agentloop run` prints the user's content.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _mcp_support import SERVER_SCRIPT, ConnectionLog
from agentloop import Agent, Event, ImageBlock, TextBlock, ToolLog, ToolUserContent
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call
from mcp_server import PNG

from agentloop_mcp import MCPServer, MCPToolSource
from agentloop_mcp.content import FOR_USER_ONLY_NOTE


def tool_results(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The tool_result blocks of a history (as JSON), by tool_use id."""
    return {
        block["tool_use_id"]: block
        for message in messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    }


async def test_blocks_for_the_user_are_an_event_and_not_in_the_tool_result(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server()]) as source:
        script = [
            reply(tool_call("private_note", {}, id="t1"), tool_call("user_only", {}, id="t2")),
            reply("done"),
        ]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        called_back: list[Event] = []

        async def on_event(event: Event) -> None:
            called_back.append(event)

        async with agent.start("go", on_event=on_event) as run:
            streamed = [e async for e in run if isinstance(e, ToolUserContent)]
    assert sorted(streamed, key=lambda e: e.tool_use_id) == [
        ToolUserContent(
            1,
            "t1",
            "private_note",
            (
                TextBlock(text="only you see this"),
                ImageBlock(source={"type": "base64", "media_type": "image/png", "data": PNG}),
            ),
        ),
        ToolUserContent(1, "t2", "user_only", (TextBlock(text="hello user"),)),
    ]
    assert [e for e in called_back if isinstance(e, ToolUserContent)] == streamed
    results = tool_results(run.result.messages)
    # The assistant-only block goes to the model alone; a result with nothing left for
    # the model says so rather than being empty.
    assert (results["t1"]["content"], results["t1"].get("is_error")) == ("for the model", None)
    assert (results["t2"]["content"], results["t2"].get("is_error")) == (FOR_USER_ONLY_NOTE, None)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_server_logs_during_a_call_are_events_of_its_run(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, protocol: str
) -> None:
    async with MCPToolSource([stdio_server(protocol=protocol)]) as source:
        script = [reply(tool_call("chatter", {}, id="t1")), reply("done")]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        called_back: list[Event] = []

        async def on_event(event: Event) -> None:
            called_back.append(event)

        async with agent.start("go", on_event=on_event) as run:
            logs = [e async for e in run if isinstance(e, ToolLog)]
    assert logs == [
        ToolLog(1, "t1", "chatter", "info", "starting", "chat", "mcp:local"),
        ToolLog(1, "t1", "chatter", "warning", {"disk": "almost full"}, "chat", "mcp:local"),
    ]
    assert [e for e in called_back if isinstance(e, ToolLog)] == logs


def agentloop_run(
    tmp_path: Path, conn_log: ConnectionLog, tool: str, *options: str
) -> tuple[subprocess.CompletedProcess[str], MessagesServer]:
    """`agentloop run` with the test server's tools, the model calling `tool` once."""
    config = tmp_path / "mcp.json"
    server = {
        "command": sys.executable,
        "args": [str(SERVER_SCRIPT)],
        "env": {"MCP_TEST_CONN_LOG": str(conn_log.path)},
    }
    config.write_text(json.dumps({"mcpServers": {"notes": server}}))
    script = [reply(tool_call(tool, {}, id="t1")), reply("Shown.")]
    with MessagesServer(script) as api:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")},
            "ANTHROPIC_API_KEY": "k",
            "ANTHROPIC_BASE_URL": api.base_url,
            "AGENTLOOP_PLUGINS": "mcp",
        }
        command = [sys.executable, "-m", "agentloop", "run", "Go", "--mcp-config", str(config)]
        done = subprocess.run(
            [*command, *options], capture_output=True, text=True, env=env, timeout=120
        )
    assert done.returncode == 0, done.stderr
    return done, api


def test_agentloop_run_prints_the_users_content_and_keeps_it_from_the_model(
    tmp_path: Path, conn_log: ConnectionLog
) -> None:
    done, api = agentloop_run(tmp_path, conn_log, "private_note")
    assert "[round 1] private_note for you: only you see this" in done.stdout
    assert "[round 1] private_note for you: (image: image/png, not shown here)" in done.stdout
    sent = api.requests[1]["messages"][-1]["content"][0]
    assert sent["content"] == "for the model"


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "-v"])
def test_agentloop_run_shows_server_warnings_and_with_v_every_log(
    tmp_path: Path, conn_log: ConnectionLog, verbose: bool
) -> None:
    done, _ = agentloop_run(tmp_path, conn_log, "chatter", *(["-v"] if verbose else []))
    logs = [line for line in done.stderr.splitlines() if "mcp.server_log" in line]
    assert any("almost full" in line for line in logs)
    assert any("starting" in line for line in logs) == verbose
