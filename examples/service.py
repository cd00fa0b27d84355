"""A service: one shared Agent answering many requests at once over TCP (JSON lines).

Each connection sends lines like {"customer": "ada", "prompt": "Where is order 1042?"};
the handler awaits `agent.run()` with that customer as the run's deps and writes back
{"customer": ..., "text": ..., "rounds": ...}. Runs keep no state on the Agent, so every
connection shares the one instance.

Without ANTHROPIC_API_KEY the model is agentloop's local Messages-API server with a
scripted model, reached through the real `anthropic` client. The script starts the
service, fires concurrent clients at it, prints what came back, and exits.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from agentloop import Agent, RunContext, ToolError, tool
from agentloop.testing import MessagesServer, reply, tool_call

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

ORDERS = {"1042": ("ada", "shipped"), "1043": ("grace", "packing"), "1044": ("ada", "delivered")}


@dataclass(frozen=True)
class Caller:
    """Per-request deps: who is asking (tools see it as `ctx.deps`)."""

    customer: str


@tool
async def order_status(order_id: str, ctx: RunContext[Caller]) -> str:
    """Status of one of the caller's orders.

    Args:
        order_id: The order number, e.g. "1042".
    """
    await anyio.sleep(0.05)  # stands in for a database query
    owner, status = ORDERS.get(order_id, ("", ""))
    if owner != ctx.deps.customer:
        raise ToolError(f"{ctx.deps.customer} has no order {order_id}")
    return f"order {order_id} is {status}"


# --------------------------------------------------------------------------- the service


class Stats:
    """How many runs are in flight now, and the most there ever were."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


async def handle(stream: anyio.abc.SocketStream, agent: Agent, stats: Stats) -> None:
    """Answer every JSON line a connection sends, until it closes."""
    lines = BufferedByteReceiveStream(stream)
    async with stream:
        while True:
            try:
                line = await lines.receive_until(b"\n", 64 * 1024)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return
            await stream.send(json.dumps(await answer(line, agent, stats)).encode() + b"\n")


async def answer(line: bytes, agent: Agent, stats: Stats) -> dict[str, Any]:
    """Run the agent for one request line; errors become an error field, not a crash."""
    try:
        request = json.loads(line)
        caller = Caller(str(request["customer"]))
        stats.enter()
        try:
            result = await agent.run(str(request["prompt"]), deps=caller)
        finally:
            stats.leave()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"customer": caller.customer, "text": result.text, "rounds": result.rounds}


# --------------------------------------------------------------------------- clients


async def ask(port: int, customer: str, prompt: str, answers: list[dict[str, Any]]) -> None:
    """One client: connect, send one request, keep the answer."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(json.dumps({"customer": customer, "prompt": prompt}).encode() + b"\n")
        line = await BufferedByteReceiveStream(stream).receive_until(b"\n", 64 * 1024)
        answers.append(json.loads(line))


def scripted_model(body: dict[str, Any]) -> dict[str, Any]:
    """The offline stand-in for Claude: look the order up, then report the tool's answer."""
    last = body["messages"][-1]
    content = last["content"]
    if isinstance(content, list) and content and content[0].get("type") == "tool_result":
        outcome = content[0].get("content") or ""
        outcome = outcome if isinstance(outcome, str) else outcome[0].get("text", "")
        if content[0].get("is_error"):
            return reply(f"Sorry: {outcome}.")
        return reply(f"Good news: {outcome}.")
    prompt = content if isinstance(content, str) else content[-1]["text"]
    order = re.search(r"\d+", prompt)
    return reply(tool_call("order_status", {"order_id": order.group() if order else "0"}))


async def main() -> None:
    online = bool(os.environ.get("ANTHROPIC_API_KEY"))
    requests = 3 if online else 24
    with ExitStack() as stack:
        client = None if online else stack.enter_context(MessagesServer(scripted_model)).client()
        agent = Agent(client=client, tools=[order_status], max_rounds=4)
        stats = Stats()
        answers: list[dict[str, Any]] = []
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        started = time.perf_counter()
        async with listener, anyio.create_task_group() as service:
            service.start_soon(listener.serve, lambda s: handle(s, agent, stats))
            async with anyio.create_task_group() as clients:
                for i in range(requests):
                    customer = ("ada", "grace")[i % 2]
                    order = ("1042", "1043", "1044")[i % 3]
                    clients.start_soon(ask, port, customer, f"Where is order {order}?", answers)
            service.cancel_scope.cancel()  # every client has its answer: stop serving
        elapsed = time.perf_counter() - started
    seen = sorted({(a.get("customer"), a.get("text") or a.get("error")) for a in answers})
    for who, said in seen:  # one line per distinct answer
        print(f"{who}: {said}")
    errors = sum(1 for a in answers if "error" in a)
    print(
        f"answered {len(answers)}/{requests} requests ({errors} failed) in {elapsed:.2f} s "
        f"on one Agent; up to {stats.peak} runs in flight at once"
    )


if __name__ == "__main__":
    anyio.run(main)
