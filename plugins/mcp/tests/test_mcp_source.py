"""The tool source against real servers: listing, names, validation, results, changes, failures."""

from __future__ import annotations

import sys
from collections.abc import Callable

import anyio
import pytest
from _mcp_support import ConnectionLog, HTTPServerProcess
from agentloop import ConfigurationError, RunContext, ToolError
from agentloop.errors import DuplicateToolError
from agentloop.messages import DocumentBlock, ImageBlock, TextBlock
from agentloop.registry import ToolRegistry
from agentloop.tools import ToolCall
from pydantic import ValidationError

from agentloop_mcp import MCPConfigError, MCPConnectError, MCPServer, MCPTool, MCPToolSource

EXPECTED = [
    "add",
    "add_tool",
    "ask",
    "big_text",
    "block",
    "chatter",
    "dotted_name",
    "echo",
    "fail",
    "gather",
    "media",
    "mixed",
    "nothing",
    "odd_picture",
    "picture",
    "pid",
    "private_note",
    "resources",
    "roots",
    "sample",
    "sample_in_call",
    "slow_read",
    "slow_write",
    "stats",
    "steps",
    "structured_only",
    "user_only",
    "wait_started",
]


async def test_stdio_tools_keep_name_description_and_schema(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server()]) as source:
        tools = source.tools()
        assert [t.name for t in tools] == EXPECTED  # sorted by name
        add = next(t for t in tools if t.name == "add")
        assert isinstance(add, MCPTool)
        assert add.description == "Add two integers."
        assert add.input_schema["properties"] == {
            "a": {"title": "A", "type": "integer"},
            "b": {"title": "B", "type": "integer"},
        }
        assert add.definition.to_wire() == {
            "name": "add",
            "description": "Add two integers.",
            "input_schema": add.input_schema,
        }
        assert add.source == "mcp:local" and add.server == "local"
        dotted = next(t for t in tools if t.name == "dotted_name")
        assert isinstance(dotted, MCPTool) and dotted.mcp_name == "dotted.name"
        assert await dotted() == "dotted"
        retryable = sorted(t.name for t in tools if isinstance(t, MCPTool) and t.retryable)
        assert retryable == [
            "dotted_name",
            "echo",
            "gather",
            "pid",
            "slow_read",
            "stats",
            "wait_started",
        ]
        # The same listing again: definitions are byte-stable for prompt caching.
        assert [t.definition for t in source.tools()] == [t.definition for t in tools]
    assert no_leaks.pids()  # the process ran, and (fixture) is gone now
    with pytest.raises(ConfigurationError, match="not open"):
        source.tools()


async def test_http_server_works_like_stdio(http_server: HTTPServerProcess) -> None:
    async with MCPToolSource([http_server.declare(headers={"X-Test": "1"})]) as source:
        tools = {t.name: t for t in source.tools()}
        assert sorted(tools) == EXPECTED
        assert await tools["add"](a=2, b=3) == "5"


async def test_prefix_and_collisions_name_both_servers(
    stdio_server: Callable[..., MCPServer], http_server: HTTPServerProcess, no_leaks: ConnectionLog
) -> None:
    with pytest.raises(DuplicateToolError) as caught:
        async with MCPToolSource([stdio_server(), http_server.declare()], strict=True):
            pass  # pragma: no cover
    message = str(caught.value)
    assert "MCP server 'local'" in message and "MCP server 'remote'" in message
    assert "'add'" in message and "prefix" in message

    servers = [stdio_server(prefix="fs"), http_server.declare(prefix="web")]
    async with MCPToolSource(servers) as source:
        names = [t.name for t in source.tools()]
        assert names == sorted([f"fs_{n}" for n in EXPECTED] + [f"web_{n}" for n in EXPECTED])
        tools = {t.name: t for t in source.tools()}
        assert await tools["fs_echo"](text="a") == "a"
        assert await tools["web_echo"](text="b") == "b"


def test_server_names_must_differ() -> None:
    one = MCPServer.stdio(sys.executable, ["-c", "pass"], name="same")
    with pytest.raises(MCPConfigError, match="used twice: same"):
        MCPToolSource([one, MCPServer.http("http://127.0.0.1:1/mcp", name="same")])


async def test_invalid_input_is_answered_without_calling_the_server(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server()]) as source:
        registry = ToolRegistry(source.tools())
        context = RunContext(run_id="run", round=1, limiter=anyio.CapacityLimiter(4), timeout=30.0)
        calls = [
            ToolCall("t1", "add", {"a": 1}),
            ToolCall("t2", "add", {"a": "one", "b": 2, "c": 3}),
            ToolCall("t3", "add", {"a": 1, "b": 2}),
        ]
        missing, wrong, right = await registry.execute(calls, context)
        assert missing.is_error and missing.content == (
            "Invalid input for tool 'add'. Fix these and call it again:\n"
            "- b: required argument is missing"
        )
        assert wrong.is_error
        assert "- a: 'one' is not of type 'integer'" in str(wrong.content)
        assert not right.is_error and right.content == "3"
        # Only the valid call reached the server.
        assert await registry.get("stats")() == '{\n  "add": 1\n}'  # type: ignore[misc]
        add = registry.get("add")
        assert add is not None
        with pytest.raises(ValidationError):
            add.validate({"a": True, "b": 1.5})


async def test_results_become_content_blocks(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server()]) as source:
        tools = {t.name: t for t in source.tools()}
        caption, image = await tools["picture"]()
        assert caption == TextBlock(text="a red pixel")
        assert isinstance(image, ImageBlock)
        assert image.source["type"] == "base64" and image.source["media_type"] == "image/png"

        notes, pdf, data, link = await tools["resources"]()
        assert notes == TextBlock(text="Resource file:///notes.txt:\nhello notes")
        assert isinstance(pdf, DocumentBlock)
        assert pdf.to_wire()["title"] == "file:///doc.pdf"
        assert pdf.source["media_type"] == "application/pdf"
        assert data == TextBlock(text='Resource file:///data.json:\n{"k": 1}')
        assert link == TextBlock(text="Resource link: report <file:///report.csv> (text/csv)")

        svg, broken, noise, gif = await tools["odd_picture"]()
        assert "image/svg+xml" in svg.text and "omitted" in svg.text
        assert "invalid base64" in broken.text
        # Bytes that are not what their label says are a note, never an image block.
        assert noise == TextBlock(
            text="[image omitted: labelled image/png, but its bytes are not an image the "
            "model reads]"
        )
        assert gif == TextBlock(
            text="[image omitted: labelled image/png, but its bytes look like image/gif]"
        )

        assert await tools["structured_only"]() == '{"temperature": 21, "unit": "c"}'
        assert await tools["nothing"]() is None
        with pytest.raises(ToolError, match="boom"):
            await tools["fail"](message="boom")


async def test_each_item_is_sent_once(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server()]) as source:
        tools = {t.name: t for t in source.tools()}
        # An image with its own bytes in structuredContent: the image, once.
        [image] = await tools["media"](size=300_000)
        assert isinstance(image, ImageBlock)
        assert len(image.source["data"]) > 400_000
        # Structured content beside a text block that serialises it: the text, once.
        assert await tools["stats"]() == "{}"
        assert await tools["add"](a=1, b=2) == "3"
        # Audio as a note; a block for the user only is left out; no structured JSON.
        audio, text = await tools["mixed"]()
        assert audio == TextBlock(text="[audio (audio/wav) omitted: the model cannot hear it]")
        assert text == TextBlock(text="for the model")


async def test_a_result_over_the_size_cut_is_cut_with_a_note(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(max_result_chars=1000)]) as source:
        tools = {t.name: t for t in source.tools()}
        assert await tools["big_text"](size=1000) == "x" * 1000
        kept, note = await tools["big_text"](size=5000)
        assert kept == TextBlock(text="x" * 1000)
        assert note.text == (
            "[result cut: the tool returned 5,000 characters of content, over the limit of "
            "1,000; the first 1,000 are above, the rest was not sent]"
        )
        note = await tools["media"](size=3000)  # an image that does not fit: only the note
        assert isinstance(note, str) and "over the limit of 1,000; the first 0 are" in note
    async with MCPToolSource([stdio_server(max_result_chars=None)]) as source:
        tools = {t.name: t for t in source.tools()}
        assert len(await tools["big_text"](size=2_000_000)) == 2_000_000


async def test_listing_is_refreshed_only_when_the_server_says_so(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server()]) as source:
        before = source.tools()
        assert "late" not in [t.name for t in before]
        tools = {t.name: t for t in before}
        version = source.version
        assert await tools["add_tool"]() == "added"
        with anyio.fail_after(20):
            assert await source.wait_changed(version) == version + 1
        after = {t.name: t for t in source.tools()}
        assert await after["late"]() == "late"
        assert [t.name for t in before] == EXPECTED  # what an agent already holds is unchanged


async def test_refresh_over_earlier_protocol_versions(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(protocol="legacy")]) as source:
        tools = {t.name: t for t in source.tools()}
        version = source.version
        assert await tools["add_tool"]() == "added"
        with anyio.fail_after(20):
            await source.wait_changed(version)
        assert "late" in [t.name for t in source.tools()]


async def test_a_server_that_does_not_start_is_named(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    missing = MCPServer.stdio("/nonexistent/mcp-server", name="ghost")
    with pytest.raises(MCPConnectError, match="cannot connect to MCP server 'ghost'"):
        async with MCPToolSource([stdio_server(), missing], strict=True):
            pass  # pragma: no cover

    refused = MCPServer.http("http://127.0.0.1:9/mcp", name="nowhere")
    with pytest.raises(MCPConnectError, match="MCP server 'nowhere'"):
        async with MCPToolSource([refused], strict=True):
            pass  # pragma: no cover


async def test_a_server_that_never_answers_times_out(no_leaks: ConnectionLog) -> None:
    code = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(60)"
    silent = MCPServer.stdio(sys.executable, ["-c", code, str(no_leaks.path)], name="silent")
    with pytest.raises(MCPConnectError, match=r"'silent'.*no answer within 1 s"):
        async with MCPToolSource([silent], connect_timeout=1, strict=True):
            pass  # pragma: no cover
    assert len(no_leaks.pids()) == 1  # and the fixture checks it was stopped


async def test_a_call_that_times_out_is_cancelled_on_the_server(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    async with MCPToolSource([stdio_server(timeout=0.5)]) as source:
        registry = ToolRegistry(source.tools())
        context = RunContext(run_id="run", round=1, limiter=anyio.CapacityLimiter(4), timeout=30.0)
        [result] = await registry.execute([ToolCall("t1", "block", {"tag": "b"})], context)
        assert result.is_error and "timed out after 0.5 s" in str(result.content)
        # The connection is still good for the next call.
        assert await registry.get("echo")(text="after") == "after"  # type: ignore[misc]


async def test_an_error_inside_the_block_comes_out_as_it_is(
    stdio_server: Callable[..., MCPServer], no_leaks: ConnectionLog
) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with MCPToolSource([stdio_server()]):
            raise KeyError("mine")
