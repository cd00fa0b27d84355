"""One round of a run: the model's response arrives and its tool calls get their results.

A `Turn` starts each tool call as soon as it can: the moment its `tool_use` block closes
when the response is streamed (unless the tool is `eager=False`), or when the whole
response is in otherwise. Whatever happens (a cut-off block, a failed stream, a
cancellation), `close` leaves every `tool_use` of the turn with exactly one result; the
history itself is changed only through `History`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

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
from agentloop.history import TRUNCATED_MESSAGE, call_of
from agentloop.messages import ContentBlock, ToolUseBlock
from agentloop.providers.base import BlockDelta, BlockStart, BlockStop, ModelResponse, StreamEvent
from agentloop.registry import ExecutionContext, ToolRegistry, bind_call_context
from agentloop.run import CANCELLED_MESSAGE, RunState
from agentloop.tools import ToolCall, ToolResult, sendable
from agentloop.tracing import fail

__all__ = ("CONTINUE", "Emit", "Turn")

Emit = Callable[[Event], Awaitable[None]]

# Stop reasons after which the loop sends the history back for another round.
CONTINUE = frozenset({"tool_use", "max_tokens", "pause_turn"})


class Turn:
    """The tool calls of one round, from the first streamed block to the last result."""

    def __init__(
        self,
        run: RunState,
        registry: ToolRegistry,
        context: ExecutionContext,
        group: anyio.abc.TaskGroup,
        emit: Emit | None,
        external: frozenset[str] = frozenset(),
    ) -> None:
        self.run = run
        self.external = external
        """Names of tools announced to the model whose calls go back to the caller."""
        self.registry = registry
        self.context = context
        self.group = group
        self.emit = emit
        self.responded = False
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
            block = event.block
            if (
                isinstance(block, ToolUseBlock)
                and event.complete
                and block.id not in self.started
                and block.name not in self.external
            ):
                call = call_of(block)
                tool = self.registry.get(call.name)
                eager = call.error is None and (tool is None or tool.eager)
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
        tracing = self.run.tracing
        if tracing is None:
            await self.finished(await self.registry.run_call(call, self.context))
            return
        with tracing.tool(call.name, call.id, call.input) as span:
            result = await self.registry.run_call(call, self.context)
            if result.is_error:
                fail(span, "tool_error", result.text[:200])
            if tracing.capture_content:
                span.set_attribute("gen_ai.tool.call.result", result.text)
        await self.finished(result)

    async def _batch(self, calls: list[ToolCall]) -> None:
        await self.registry.execute(calls, self.context, on_result=self.finished)

    async def finished(self, result: ToolResult) -> None:
        """Record a call's result (run or not) and report it."""
        result = sendable(result)
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
        calls = self.run.add_response(response, self._not_runnable(response))
        self.responded = True
        batch: list[ToolCall] = []
        for call in calls:
            if call.id in self.started or self._handed_back(call):
                continue
            if call.error is not None:
                await self.finished(ToolResult.error(call, call.error, ran=False))
            else:
                if self.emit is not None and call.id not in self.announced:
                    await self.emit(
                        ToolCallReady(self.run.rounds, call.id, call.name, call.input, False)
                    )
                if self.run.tracing is not None:
                    self.start(call)  # a task each, so each call has its own span
                else:
                    self.started.add(call.id)
                    batch.append(call)
        if batch:
            # One batch: far cheaper per call than a task each (see ToolRegistry.execute).
            self.group.start_soon(self._batch, batch)
        return calls

    def _handed_back(self, call: ToolCall) -> bool:
        """Whether `call` goes back to the caller instead of running here."""
        return call.error is None and call.name in self.external

    def _not_runnable(self, response: ModelResponse) -> dict[str, str]:
        """Why each call that must not run won't, by tool_use id."""
        reason = response.stop_reason
        uses = response.tool_uses
        if response.call_errors:
            return {**self._by_stop_reason(response, reason, uses), **response.call_errors}
        return self._by_stop_reason(response, reason, uses)

    def _by_stop_reason(
        self, response: ModelResponse, reason: str | None, uses: Sequence[ToolUseBlock]
    ) -> dict[str, str]:
        if reason == "max_tokens":
            cut = {
                b.id
                for b, complete in self.streamed.values()
                if isinstance(b, ToolUseBlock) and not complete
            }
            last = response.content[-1] if response.content else None
            if isinstance(last, ToolUseBlock):
                cut.add(last.id)
            return {u.id: TRUNCATED_MESSAGE for u in uses if u.id in cut}
        if reason in CONTINUE:
            return {}
        message = f"Not run: the response ended with stop_reason '{reason}', so the run stopped."
        return {u.id: message for u in uses}

    def close(self, why: str) -> None:
        """Make the history valid after a failure or cancellation (no awaiting here).

        Keeps the blocks that arrived whole, and answers every tool_use of the turn that
        has no result with an is_error result saying `why`.
        """
        if self.closed:
            return
        self.closed = True
        partial = None
        if not self.responded:
            partial = [block for _, (block, _) in sorted(self.streamed.items())]
        pairs = self.run.history.close(why, partial=partial, results=self.results)
        self.run.log_calls(pairs)

    def complete(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The turn's results in tool_use order, added to the history.

        A call without a result (its task was cancelled while the response itself came
        in whole) is answered as cancelled. When the turn has calls of external tools,
        nothing is added: the run hands those calls back, and keeps its own results for
        the message that will answer them all.
        """
        own = [c for c in calls if not self._handed_back(c)]
        results = [
            self.results.get(c.id) or ToolResult.error(c, CANCELLED_MESSAGE, ran=False) for c in own
        ]
        pairs = list(zip(own, results, strict=True))
        if len(own) < len(calls):
            self.run.hand_back([c for c in calls if self._handed_back(c)], pairs)
        elif calls:
            self.run.add_results(pairs)
        self.closed = True
        return results
