"""A real MCP server for the tests, built with the MCP SDK's server side.

Run over stdio (`python mcp_server.py`), streamable HTTP (`python mcp_server.py --http
PORT`) or the legacy SSE transport (`--sse PORT`). With `MCP_TEST_CONN_LOG` set, each process appends its pid to that file when it
starts: over stdio one process is one connection, so the file counts connections, and the
line count is the process's generation. Calls of `slow_read`/`slow_write` hang in the
first generation (or up to MCP_TEST_HANG_GENERATIONS) until the test kills the process,
and answer at once in later ones; past MCP_TEST_LAST_GENERATION the server will not start.
Rendezvous happen inside the server (`wait_started`, `gather`), so no test sleeps.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path


def generation() -> int:
    log = os.environ.get("MCP_TEST_CONN_LOG")
    if not log:
        return 1
    return len(Path(log).read_text().split())


if __name__ == "__main__":
    # Before the SDK is imported, so a process that is refused starts (and fails) fast.
    if os.environ.get("MCP_TEST_CONN_LOG"):
        with open(os.environ["MCP_TEST_CONN_LOG"], "a") as out:
            out.write(f"{os.getpid()}\n")
    last = os.environ.get("MCP_TEST_LAST_GENERATION")
    if last and generation() > int(last):
        sys.exit(3)  # a server that cannot start again

import anyio  # noqa: E402
from mcp.server.mcpserver import Context  # noqa: E402
from mcp.server.mcpserver import MCPServer as SDKServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.types import (  # noqa: E402
    Annotations,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    EmbeddedResource,
    ImageContent,
    InputRequiredResult,
    ResourceLink,
    SamplingMessage,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from pydantic import BaseModel  # noqa: E402

PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
        "0000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
    )
).decode()

READ_ONLY = ToolAnnotations(readOnlyHint=True)


class Person(BaseModel):
    name: str


def hangs() -> bool:
    """Whether slow_read/slow_write hang in this process (MCP_TEST_HANG_GENERATIONS, default 1)."""
    return generation() <= int(os.environ.get("MCP_TEST_HANG_GENERATIONS", "1"))


def build(name: str) -> SDKServer:
    server = SDKServer(name, log_level="WARNING", instructions=f"Call {name}'s echo to echo.")
    started: list[str] = []
    calls: dict[str, int] = {}
    changed = anyio.Event()
    arrivals: dict[str, int] = {}
    everyone_here: dict[str, anyio.Event] = {}

    def mark(tag: str) -> None:
        nonlocal changed
        started.append(tag)
        changed.set()
        changed = anyio.Event()

    @server.tool(annotations=READ_ONLY)
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls["add"] = calls.get("add", 0) + 1
        return a + b

    @server.tool(annotations=READ_ONLY)
    def stats() -> dict[str, int]:
        """How many times each counted tool ran."""
        return calls

    @server.tool(annotations=READ_ONLY)
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool(name="dotted.name", annotations=READ_ONLY)
    def dotted() -> str:
        """A tool whose MCP name is not a valid Messages-API name."""
        return "dotted"

    @server.tool()
    def picture() -> list[TextContent | ImageContent]:
        """A caption and a 1x1 PNG."""
        return [
            TextContent(type="text", text="a red pixel"),
            ImageContent(type="image", data=PNG, mimeType="image/png"),
        ]

    @server.tool()
    def odd_picture() -> CallToolResult:
        """An SVG image (the API cannot take it), one with broken base64, random bytes
        labelled PNG, and a GIF labelled PNG."""
        noise = base64.b64encode(bytes(range(7, 200))).decode()
        gif = base64.b64encode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;").decode()
        return CallToolResult(
            content=[
                ImageContent(type="image", data="PHN2Zy8+", mimeType="image/svg+xml"),
                ImageContent(type="image", data="not base64!", mimeType="image/png"),
                ImageContent(type="image", data=noise, mimeType="image/png"),
                ImageContent(type="image", data=gif, mimeType="image/png"),
            ]
        )

    @server.tool()
    def resources() -> CallToolResult:
        """An embedded text resource, an embedded PDF, a JSON blob and a link."""
        return CallToolResult(
            content=[
                EmbeddedResource(
                    type="resource",
                    resource=TextResourceContents(
                        uri="file:///notes.txt", text="hello notes", mimeType="text/plain"
                    ),
                ),
                EmbeddedResource(
                    type="resource",
                    resource=BlobResourceContents(
                        uri="file:///doc.pdf",
                        blob=base64.b64encode(b"%PDF-1.4 tiny").decode(),
                        mimeType="application/pdf",
                    ),
                ),
                EmbeddedResource(
                    type="resource",
                    resource=BlobResourceContents(
                        uri="file:///data.json",
                        blob=base64.b64encode(b'{"k": 1}').decode(),
                        mimeType="application/json",
                    ),
                ),
                ResourceLink(
                    type="resource_link",
                    name="report",
                    uri="file:///report.csv",
                    mimeType="text/csv",
                ),
            ]
        )

    @server.tool()
    def structured_only() -> CallToolResult:
        """Only structured content, no text."""
        return CallToolResult(content=[], structured_content={"temperature": 21, "unit": "c"})

    @server.tool()
    def media(size: int) -> CallToolResult:
        """A PNG of about `size` bytes and the same base64 in structuredContent (as
        server-filesystem's read_media_file returns it)."""
        data = base64.b64encode(base64.b64decode(PNG) + b"\0" * size).decode()
        return CallToolResult(
            content=[ImageContent(type="image", data=data, mimeType="image/png")],
            structured_content={"content": [{"type": "image", "data": data}]},
        )

    @server.tool()
    def mixed() -> CallToolResult:
        """Audio, a block for the user only, one for the assistant, and structured content."""
        return CallToolResult(
            content=[
                AudioContent(type="audio", data="AAAA", mimeType="audio/wav"),
                TextContent(
                    type="text", text="for your eyes", annotations=Annotations(audience=["user"])
                ),
                TextContent(
                    type="text",
                    text="for the model",
                    annotations=Annotations(audience=["assistant", "user"], priority=1.0),
                ),
            ],
            structured_content={"ok": True},
        )

    @server.tool()
    def private_note() -> CallToolResult:
        """A note and a picture for the user alone, and a line for the model alone."""
        return CallToolResult(
            content=[
                TextContent(
                    type="text",
                    text="only you see this",
                    annotations=Annotations(audience=["user"]),
                ),
                ImageContent(
                    type="image",
                    data=PNG,
                    mimeType="image/png",
                    annotations=Annotations(audience=["user"]),
                ),
                TextContent(
                    type="text",
                    text="for the model",
                    annotations=Annotations(audience=["assistant"]),
                ),
            ]
        )

    @server.tool()
    def user_only() -> CallToolResult:
        """Nothing but a line for the user."""
        return CallToolResult(
            content=[
                TextContent(
                    type="text", text="hello user", annotations=Annotations(audience=["user"])
                )
            ]
        )

    @server.tool()
    def big_text(size: int) -> str:
        """`size` characters of text."""
        return "x" * size

    @server.tool()
    async def steps(count: int, pause: float, ctx: Context) -> str:
        """Report progress `count` times, `pause` seconds apart."""
        for done in range(1, count + 1):
            await anyio.sleep(pause)
            await ctx.report_progress(done, count, f"step {done}")
        return f"{count} steps"

    @server.tool()
    async def ask(ctx: Context) -> str:
        """Ask the user for a name (elicitation)."""
        answer = await ctx.elicit("Who are you?", Person)
        return f"{answer.action}: {answer.data.name if answer.action == 'accept' else '-'}"

    async def meet(group: str, size: int) -> None:
        """Return once `size` calls of `group` have arrived."""
        arrivals[group] = arrivals.get(group, 0) + 1
        event = everyone_here.setdefault(group, anyio.Event())
        if arrivals[group] >= size:
            event.set()
        await event.wait()

    @server.tool()
    async def sample(prompt: str, ctx: Context, together: int = 1) -> str:
        """Ask the client's model (sampling), once `together` calls are in progress."""
        await meet("sample", together)
        result = await ctx.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=50,
            system_prompt="Be brief.",
        )
        return f"{result.model}: {result.content.text}"  # type: ignore[union-attr]

    @server.tool()
    async def sample_in_call(
        prompt: str, ctx: Context, together: int = 1
    ) -> str | InputRequiredResult:
        """Ask the client's model as the 2026 protocol does: as part of the call's result
        (once `together` calls are in progress)."""
        answers = ctx.input_responses or {}
        answer = answers.get("llm")
        if isinstance(answer, CreateMessageResult) and isinstance(answer.content, TextContent):
            return f"{answer.model}: {answer.content.text}"
        await meet("sample_in_call", together)
        message = SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
        asked = CreateMessageRequest(
            params=CreateMessageRequestParams(messages=[message], max_tokens=50)
        )
        return InputRequiredResult(input_requests={"llm": asked})

    @server.tool()
    async def roots(ctx: Context) -> str:
        """The client's roots."""
        listed = await ctx.session.list_roots()
        return ",".join(f"{r.name}={r.uri}" for r in listed.roots)

    @server.tool()
    async def chatter(ctx: Context) -> str:
        """Send two log notifications, then answer."""
        await ctx.info("starting", logger_name="chat")
        await ctx.warning({"disk": "almost full"}, logger_name="chat")
        return "chatted"

    @server.tool()
    def nothing() -> CallToolResult:
        """An empty result."""
        return CallToolResult(content=[])

    @server.tool()
    def fail(message: str) -> str:
        """Always fails with the message."""
        raise ToolError(message)

    @server.tool(annotations=READ_ONLY)
    async def slow_read(tag: str) -> str:
        """Read-only; hangs in the first generation."""
        mark(tag)
        if hangs():
            await anyio.sleep_forever()
        return f"read {tag} in generation {generation()}"

    @server.tool()
    async def slow_write(tag: str) -> str:
        """Not idempotent; hangs in the first generation."""
        mark(tag)
        if hangs():
            await anyio.sleep_forever()
        return f"wrote {tag} in generation {generation()}"

    @server.tool()
    async def block(tag: str) -> str:
        """Hangs until cancelled."""
        mark(tag)
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool(annotations=READ_ONLY)
    async def wait_started(count: int) -> str:
        """Return once `count` hanging calls have started; their tags, comma-separated."""
        while len(started) < count:
            await changed.wait()
        return ",".join(started)

    @server.tool(annotations=READ_ONLY)
    async def gather(group: str, size: int, index: int) -> str:
        """Return only once `size` calls of the same group are in progress at once."""
        arrivals[group] = arrivals.get(group, 0) + 1
        event = everyone_here.setdefault(group, anyio.Event())
        if arrivals[group] >= size:
            event.set()
        await event.wait()
        return f"{name}:{group}:{index}"

    @server.tool()
    async def add_tool(ctx: Context) -> str:
        """Add the tool `late` and announce the change."""

        def late() -> str:
            """Added while running."""
            return "late"

        server.add_tool(late)
        await ctx.notify_tools_changed()  # listeners on the 2026 protocol
        try:
            await ctx.session.send_tool_list_changed()  # earlier protocol versions
        except Exception:
            pass
        return "added"

    @server.resource("notes://today", name="today", mime_type="text/plain")
    def today() -> str:
        """Today's notes."""
        return "buy milk"

    @server.resource("notes://day/{day}", name="day", mime_type="text/plain")
    def day(day: str) -> str:
        """One day's notes."""
        return f"notes of {day}"

    @server.prompt(name="review")
    def review(code: str) -> str:
        """Review a piece of code."""
        return f"Please review:\n{code}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--sse", type=int, default=None)
    parser.add_argument("--name", default="test-server")
    args = parser.parse_args()
    server = build(args.name)
    if args.http is not None:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    elif args.sse is not None:
        server.run("sse", host="127.0.0.1", port=args.sse)
    else:
        server.run()


if __name__ == "__main__":
    main()
