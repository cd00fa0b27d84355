"""A terminal progress display for a streamed run (offline on a scripted model without a key).

Text is printed as it streams; each tool call gets a line when it starts, and the line is
completed when its result arrives, while the model may still be writing the next call.
Press Ctrl-C to cancel: the partial result still has a history valid to send again.
"""

import logging
import os
import sys

import anyio
import structlog

from agentloop import Agent, tool
from agentloop.events import (
    RequestStarted,
    RoundFinished,
    RunFinished,
    TextDelta,
    ToolCallReady,
    ToolResultEvent,
)
from agentloop.testing import MessagesServer, reply, text, tool_call

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@tool
async def fetch_page(url: str) -> str:
    """Fetch a page (simulated: takes a moment)."""
    await anyio.sleep(0.3)
    return f"<html>{url}</html>"


SCRIPT = [
    reply(
        text("I'll fetch the three pages at once."),
        *[tool_call("fetch_page", {"url": f"https://example.org/{n}"}) for n in range(3)],
    ),
    reply("All three pages are up."),
]


class Display:
    """Prints streamed text inline and one line per tool event."""

    def __init__(self) -> None:
        self.mid_line = False

    def text(self, chunk: str) -> None:
        print(chunk, end="", flush=True)
        self.mid_line = True

    def line(self, message: str) -> None:
        if self.mid_line:
            print()
            self.mid_line = False
        print(message, flush=True)


async def show(agent: Agent) -> None:
    screen = Display()
    async with agent.run_stream("Are the three pages up?") as stream:
        async for event in stream:
            if isinstance(event, RequestStarted):
                screen.line(f"-- round {event.round}")
            elif isinstance(event, TextDelta):
                screen.text(event.text)
            elif isinstance(event, ToolCallReady):
                screen.line(f"   > {event.name}({event.input}) started")
            elif isinstance(event, ToolResultEvent):
                status = "error" if event.is_error else "ok"
                screen.line(f"   < {event.name} {status} in {event.duration:.2f} s")
            elif isinstance(event, RoundFinished):
                screen.line(f"   ({event.stop_reason}, {event.usage.output_tokens} tokens out)")
            elif isinstance(event, RunFinished):
                result = event.result
                screen.line(f"done: {result.stop_reason} after {result.rounds} rounds")


async def main() -> None:
    if os.environ.get("ANTHROPIC_API_KEY"):
        await show(Agent(tools=[fetch_page]))
        return
    async with MessagesServer(SCRIPT) as server:  # a local Messages API streaming the script
        from agentloop import AnthropicProvider

        await show(
            Agent(provider=AnthropicProvider(server.client(), stream=True), tools=[fetch_page])
        )


if __name__ == "__main__":
    try:
        anyio.run(main)
    except KeyboardInterrupt:
        sys.exit(130)
