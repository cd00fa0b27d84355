"""What the client offers servers: progress, roots, elicitation and sampling, each switchable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mcp.types as mcp_types
import pytest
from _mcp_support import ConnectionLog
from agentloop import Agent, ConfigurationError, ToolError, ToolProgress
from agentloop.testing import ScriptedProvider, reply, tool_call

from agentloop_mcp import MCPSampling, MCPServer, MCPToolSource


async def test_progress_becomes_stream_events_and_restarts_the_idle_timeout(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    # Three steps 0.3 s apart take longer than the idle timeout of 1 s, and pass: each
    # notification restarts it. A call that sends nothing is cut off after 1 s.
    async with MCPToolSource([stdio_server(idle_timeout=1)]) as source:
        script = [
            reply(tool_call("steps", {"count": 4, "pause": 0.3}, id="t1")),
            reply("done"),
        ]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        async with agent.run_stream("go") as stream:
            events = [e async for e in stream if isinstance(e, ToolProgress)]
        assert stream.result is not None
        assert [c.output for c in stream.result.tool_calls] == ["4 steps"]
        assert events == [ToolProgress(1, "t1", "steps", n, 4, f"step {n}") for n in range(1, 5)]
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError, match="sent no answer and no progress for 1 s"):
            await tools["block"](tag="idle")
        assert await tools["echo"](text="still here") == "still here"


async def test_progress_switched_off_sends_no_token(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(progress=False)]) as source:
        script = [reply(tool_call("steps", {"count": 2, "pause": 0}, id="t1")), reply("ok")]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        async with agent.run_stream("go") as stream:
            events = [e async for e in stream if isinstance(e, ToolProgress)]
        assert events == []


async def test_roots_come_from_the_config(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, tmp_path: Path
) -> None:
    (tmp_path / "work").mkdir()
    server = stdio_server(roots=(str(tmp_path / "work"),), protocol="legacy")
    async with MCPToolSource([server]) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["roots"]() == f"work={(tmp_path / 'work').as_uri()}"
    async with MCPToolSource([stdio_server(protocol="legacy")]) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError):  # none offered: the server's request is refused
            await tools["roots"]()


async def test_elicitation_asks_the_handler_or_is_refused(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    asked: list[tuple[str, str]] = []

    async def handler(server: str, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append((server, params.message))
        return mcp_types.ElicitResult(action="accept", content={"name": "Ada"})

    async with MCPToolSource([stdio_server(protocol="legacy")], elicitation=handler) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["ask"]() == "accept: Ada"
        assert asked == [("local", "Who are you?")]
    switched_off = stdio_server(protocol="legacy", elicitation=False)
    async with MCPToolSource([switched_off], elicitation=handler) as source:
        tools = {t.name: t for t in source.tools()}
        with pytest.raises(ToolError):
            await tools["ask"]()
        assert len(asked) == 1


async def test_sampling_uses_the_given_model_within_its_limits(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    model = ScriptedProvider([reply("four"), reply("five")])
    sampling = MCPSampling(provider=model, model="claude-test", max_requests=2)
    async with MCPToolSource([stdio_server(protocol="legacy")], sampling=sampling) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["sample"](prompt="2+2?") == "scripted: four"
        [request] = model.requests
        assert request["model"] == "claude-test"
        assert request["system"] == "Be brief." and request["max_tokens"] == 50
        assert request["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}
        ]
        assert await tools["sample"](prompt="2+3?") == "scripted: five"
        with pytest.raises(ToolError, match="sampling limit reached"):
            await tools["sample"](prompt="again")
    async with MCPToolSource(
        [stdio_server(protocol="legacy", sampling=False)], sampling=sampling
    ) as source:
        with pytest.raises(ToolError):
            await {t.name: t for t in source.tools()}["sample"](prompt="no")


async def test_the_terminal_prompt_asks_each_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from agentloop_mcp import terminal_elicitation

    form = mcp_types.ElicitRequestFormParams(
        message="Details?",
        requested_schema={
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        },
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("Ada\n36\n"))
    answer = await terminal_elicitation("files", form)
    assert (answer.action, answer.content) == ("accept", {"name": "Ada", "age": 36})
    monkeypatch.setattr("sys.stdin", io.StringIO("!decline\n"))
    assert (await terminal_elicitation("files", form)).action == "decline"
    monkeypatch.setattr("sys.stdin", io.StringIO("Ada\n!cancel\n"))
    assert (await terminal_elicitation("files", form)).action == "cancel"
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert (await terminal_elicitation("files", form)).action == "cancel"


async def test_the_terminal_form_checks_answers_and_shows_defaults_and_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from agentloop_mcp import terminal_elicitation

    form = mcp_types.ElicitRequestFormParams(
        message="Order?",
        requested_schema={
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 1, "maximum": 9},
                "colour": {
                    "type": "string",
                    "oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "Green"}],
                },
                "gift": {"type": "boolean", "default": True},
                "note": {"type": "string", "maxLength": 5},
            },
            "required": ["count", "colour"],
        },
    )
    typed = ["three", "12", "", "3", "blue", "2", "", "far too long", ""]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(typed) + "\n"))
    answer = await terminal_elicitation("shop", form)
    assert (answer.action, answer.content) == ("accept", {"count": 3, "colour": "g", "gift": True})
    shown = capsys.readouterr().err
    assert "count [integer, at least 1, at most 9]: " in shown
    assert "'three' is not a whole number; try again" in shown
    assert "12 is greater than the maximum of 9; try again" in shown
    assert "this field needs an answer; try again" in shown
    assert "1) Red (r)" in shown and "2) Green (g)" in shown
    assert "'blue' is not valid under any of the given schemas; try again" in shown
    assert "gift [boolean, y/n, default True]: " in shown
    assert "note [string, at most 5 characters, optional]: " in shown
    assert "'far too long' is too long; try again" in shown


async def test_a_server_asks_through_the_terminal_form(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from agentloop_mcp import terminal_elicitation

    monkeypatch.setattr("sys.stdin", io.StringIO("\nAda\n"))  # asked again: a name is required
    async with MCPToolSource([stdio_server()], elicitation=terminal_elicitation) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["ask"]() == "accept: Ada"


async def test_resources_and_prompts_from_python(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    from agentloop_mcp import MCPRequestError

    async with MCPToolSource([stdio_server()]) as source:
        [resource] = await source.list_resources("local")
        assert (str(resource.uri), resource.name, resource.mime_type) == (
            "notes://today",
            "today",
            "text/plain",
        )
        [content] = await source.read_resource("local", "notes://today")
        assert isinstance(content, mcp_types.TextResourceContents)
        assert content.text == "buy milk"
        with pytest.raises(MCPRequestError, match="refused"):
            await source.read_resource("local", "notes://nope")
        [prompt] = await source.list_prompts("local")
        assert prompt.name == "review" and [a.name for a in prompt.arguments or []] == ["code"]
        filled = await source.get_prompt("local", "review", {"code": "x = 1"})
        [message] = filled.messages
        assert message.role == "user" and message.content.text == "Please review:\nx = 1"  # type: ignore[union-attr]
        with pytest.raises(ConfigurationError, match="no open MCP server named 'other'"):
            await source.list_prompts("other")


async def test_resources_as_a_read_tool(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(name="my.notes", resources_tool=True)]) as source:
        tools = {t.name: t for t in source.tools()}
        reader = tools["my_notes_read_resource"]
        assert reader.description == (
            "Read a resource of MCP server 'my.notes' by its URI.\n- notes://today (today)\n"
            "URI templates (fill in each {placeholder}):\n- notes://day/{day} (day)"
        )
        assert await reader(uri="notes://today") == "Resource notes://today:\nbuy milk"
        assert await reader(uri="notes://day/monday") == (
            "Resource notes://day/monday:\nnotes of monday"
        )
        [template] = await source.list_resource_templates("my.notes")
        assert (template.uri_template, template.name) == ("notes://day/{day}", "day")
        with pytest.raises(ToolError, match="Unknown resource"):
            await reader(uri="notes://nope")
    async with MCPToolSource([stdio_server()]) as source:  # off by default
        assert not [t for t in source.tools() if t.name.endswith("read_resource")]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_server_log_notifications_reach_the_agentloop_logger(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog, protocol: str
) -> None:
    from structlog.testing import capture_logs

    async with MCPToolSource([stdio_server(protocol=protocol)]) as source:
        tools = {t.name: t for t in source.tools()}
        with capture_logs() as logs:
            assert await tools["chatter"]() == "chatted"
    sent = [
        (e["log_level"], e["level_sent"], e["logger_name"], e["data"])
        for e in logs
        if e["event"] == "mcp.server_log" and e["mcp_server"] == "local"
    ]
    assert sent == [
        ("info", "info", "chat", "starting"),
        ("warning", "warning", "chat", {"disk": "almost full"}),
    ]
