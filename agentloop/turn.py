"""One round of a run: the model's response arrives and its tool calls get their results.

A `Turn` starts each tool call as soon as it can: the moment its `tool_use` block closes
when the response is streamed (unless the tool is `eager=False`), or when the whole
response is in otherwise. Whatever happens (a cut-off block, a failed stream, a
cancellation), `close` leaves every `tool_use` of the turn with exactly one result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from agentloop.events import (
    Event,
    TextDelta,
    ThinkingDelta,
    ToolCallReady,
    ToolCallStarted,
    ToolInputDelta,
    ToolResultEvent,
)
from agentloop.messages import ContentBlock, ToolUseBlock
from agentloop.providers.base import BlockDelta, BlockStart, BlockStop, ModelResponse, StreamEvent
from agentloop.registry import ExecutionContext, ToolRegistry, bind_call_context
from agentloop.tools import ToolCall, ToolResult

if TYPE_CHECKING:
    from agentloop.agent import _Run

__all__ = ("CONTINUE", "TRUNCATED_MESSAGE", "Turn")

Emit = Callable[[Event], Awaitable[None]]

# Stop reasons after which the loop sends the history back for another round.
CONTINUE = frozenset({"tool_use", "max_tokens", "pause_turn"})

TRUNCATED_MESSAGE = (
    "Not run: this tool call was cut off by max_tokens, so its input is incomplete. "
    "Call the tool again with complete input (keep it shorter if needed)."
)


class Turn:
    """The tool calls of one round, from the first streamed block to the last result."""

    def __init__(
        self,
        run: _Run,
        registry: ToolRegistry,
        context: ExecutionContext,
        group: anyio.abc.TaskGroup,
        emit: Emit | None,
    ) -> None:
        self.run = run
        self.registry = registry
        self.context = context
        self.group = group
        self.emit = emit
        self.response: ModelResponse | None = None
        self.streamed: dict[int, tuple[ContentBlock, bool]] = {}  # index -> (block, complete)
        self.ids: dict[int, str] = {}  # block index -> tool_use id, while streaming
        self.started: set[str] = set()
        self.announced: set[str] = set()  # calls reported ready while streaming
        self.results: dict[str, ToolResult] = {}
        self.closed = False

    # -- while the response streams in

    async def on_event(self, event: StreamEvent) -> None:
        """Report a streamed event and start a tool call whose block just closed."""
        round_ = self.run.rounds
        if isinstance(event, BlockStop):
            self.streamed[event.index] = (event.block, event.complete)
            if isinstance(event.block, ToolUseBlock) and event.complete:
                call = ToolCall.from_block(event.block)
                tool = self.registry.get(call.name)
                eager = tool is None or tool.eager
                if self.emit is not None:
                    self.announced.add(call.id)
                    await self.emit(ToolCallReady(round_, call.id, call.name, call.input, eager))
                if eager:
                    self.start(call)
        elif self.emit is None:
            return
        elif isinstance(event, BlockDelta):
            if event.kind == "text":
                await self.emit(TextDelta(round_, event.index, event.value))
            elif event.kind == "thinking":
                await self.emit(ThinkingDelta(round_, event.index, event.value))
            elif event.kind == "input_json" and event.index in self.ids:
                await self.emit(
                    ToolInputDelta(round_, event.index, self.ids[event.index], event.value)
                )
        elif isinstance(event, BlockStart) and isinstance(event.block, ToolUseBlock):
            self.ids[event.index] = event.block.id
            await self.emit(ToolCallStarted(round_, event.index, event.block.id, event.block.name))

    def start(self, call: ToolCall) -> None:
        """Run `call` in the turn's task group (once)."""
        if call.id not in self.started:
            self.started.add(call.id)
            self.group.start_soon(self._call, call)

    async def _call(self, call: ToolCall) -> None:
        bind_call_context(self.context, call)
        await self.finished(await self.registry.run_call(call, self.context))

    async def _batch(self, calls: list[ToolCall]) -> None:
        await self.registry.execute(calls, self.context, on_result=self.finished)

    async def finished(self, result: ToolResult) -> None:
        """Record a call's result (run or not) and report it."""
        self.results[result.tool_use_id] = result
        if self.emit is not None:
            await self.emit(
                ToolResultEvent(
                    self.run.rounds,
                    result.tool_use_id,
                    result.name,
                    result.is_error,
                    result.text,
                    result.duration,
                )
            )

    # -- once the whole response is in

    async def respond(self, response: ModelResponse) -> list[ToolCall]:
        """Add the response to the history and start (or answer) its remaining calls."""
        self.response = response
        self.run.add_response(response)
        calls = [ToolCall.from_block(b) for b in response.tool_uses]
        blocked = self._not_runnable(response, calls)
        batch: list[ToolCall] = []
        for call in calls:
            if call.id in self.started:
                continue
            if call.id in blocked:
                await self.finished(ToolResult.error(call, blocked[call.id], ran=False))
            else:
                if self.emit is not None and call.id not in self.announced:
                    await self.emit(
                        ToolCallReady(self.run.rounds, call.id, call.name, call.input, False)
                    )
                self.started.add(call.id)
                batch.append(call)
        if batch:
            # One batch: far cheaper per call than a task each (see ToolRegistry.execute).
            self.group.start_soon(self._batch, batch)
        return calls

    def _not_runnable(self, response: ModelResponse, calls: Sequence[ToolCall]) -> dict[str, str]:
        """Why each call that must not run won't, by tool_use id."""
        reason = response.stop_reason
        if reason == "max_tokens":
            cut = {
                b.id
                for b, complete in self.streamed.values()
                if isinstance(b, ToolUseBlock) and not complete
            }
            last = response.content[-1] if response.content else None
            if isinstance(last, ToolUseBlock):
                cut.add(last.id)
            return {c.id: TRUNCATED_MESSAGE for c in calls if c.id in cut}
        if reason in CONTINUE:
            return {}
        message = f"Not run: the response ended with stop_reason '{reason}', so the run stopped."
        return {c.id: message for c in calls}

    def close(self, why: str) -> None:
        """Make the history valid after a failure or cancellation (no awaiting here).

        Keeps the blocks that arrived whole, and answers every tool_use of the turn that
        has no result with an is_error result saying `why`.
        """
        if self.closed:
            return
        self.closed = True
        if self.response is None:
            blocks = [block for _, (block, _) in sorted(self.streamed.items())]
            if not blocks:
                return
            self.run.add_response(ModelResponse(content=blocks, stop_reason=None))
        last = self.run.messages[-1]
        calls = [ToolCall.from_block(b) for b in last.tool_uses] if last.role == "assistant" else []
        if calls:
            results = [self.results.get(c.id) or ToolResult.error(c, why, ran=False) for c in calls]
            self.run.add_results(results, calls)

    def complete(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The turn's results in tool_use order, added to the history."""
        results = [self.results[c.id] for c in calls]
        if calls:
            self.run.add_results(results, calls)
        self.closed = True
        return results
