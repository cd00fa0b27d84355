"""The lower bound: a minimal hand-written tool loop over `AsyncAnthropic`.

create -> run the turn's tool calls concurrently -> append the SDK's content objects and
the results -> repeat. No validation, no logging, no limits on concurrency: whatever
agentloop costs on top of this is its overhead. The calls run in one anyio task group
(`run_calls`), or with `asyncio.gather` (`run_calls_gather`), as most hand-written loops
on asyncio do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from anthropic import AsyncAnthropic

Tool = Callable[..., Awaitable[Any]]


async def hand_loop(
    client: AsyncAnthropic,
    *,
    model: str,
    prompt: str,
    tools: dict[str, Tool],
    definitions: Sequence[dict[str, Any]],
    max_tokens: int,
    max_rounds: int,
    gather: bool = False,
) -> list[dict[str, Any]]:
    """Run the loop until the model stops calling tools; return the history."""
    run = run_calls_gather if gather else run_calls
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for _ in range(max_rounds):
        response = await client.messages.create(
            model=model,
            max_tokens=max_tokens,
            messages=messages,  # type: ignore[arg-type]
            tools=definitions,  # type: ignore[arg-type]
        )
        messages.append({"role": "assistant", "content": response.content})
        calls = [block for block in response.content if block.type == "tool_use"]
        if response.stop_reason != "tool_use" or not calls:
            break
        results = await run(tools, calls)
        messages.append({"role": "user", "content": results})
    return messages


async def run_calls(tools: dict[str, Tool], calls: Sequence[Any]) -> list[dict[str, Any]]:
    """Run one turn's calls concurrently; their tool_result blocks in call order."""
    results: list[dict[str, Any]] = [{}] * len(calls)

    async def run(index: int, call: Any) -> None:
        output = await tools[call.name](**call.input)
        results[index] = {"type": "tool_result", "tool_use_id": call.id, "content": output}

    async with anyio.create_task_group() as group:
        for index, call in enumerate(calls):
            group.start_soon(run, index, call)
    return results


async def run_calls_gather(tools: dict[str, Tool], calls: Sequence[Any]) -> list[dict[str, Any]]:
    """The same with `asyncio.gather` (asyncio only): one asyncio task per call."""
    outputs = await asyncio.gather(*(tools[c.name](**c.input) for c in calls))  # noqa: TID251
    return [
        {"type": "tool_result", "tool_use_id": call.id, "content": output}
        for call, output in zip(calls, outputs, strict=True)
    ]
