"""One round of a run: the model's response arrives and its tool calls get their results.

`Turn.play` sends the request and starts each tool call, as a task of the turn's
`CallGroup`, as soon as it can: the moment its `tool_use` block closes when the response
is streamed (unless the tool is `eager=False`), or when the whole response is in.
`Turn.resume` finishes a paused turn instead, seeded with the caller's decisions. Either
way, whatever happens (a cut-off block, a failed stream, a cancellation), the turn ends in
`RunState.answer_turn`: every `tool_use` of the turn is left with exactly one result.
A capability may send the request again (a retry, a fallback) before any tool call was
streamed: the turn then drops what it had of the earlier response (`ResponseReplaced`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentloop.approval import Waiting
from agentloop.calls import ToolCall, ToolResult, sendable
from agentloop.context import RunContext
from agentloop.dynamic import may_start, over_max_uses, uses_of
from agentloop.errors import AgentloopError, ProviderError, ToolCallFailed
from agentloop.events import (
    ApprovalRequested,
    Event,
    ModelResponded,
    ModelStreamEvent,
    ResponseWatch,
    ToolCallReady,
    ToolResultEvent,
    friendly_event,
)
from agentloop.history import TRUNCATED_MESSAGE, call_of
from agentloop.messages import ContentBlock, TextBlock, ToolUseBlock
from agentloop.providers.base import BlockStop, ModelResponse, StreamEvent
from agentloop.registry import CallGroup, ToolRegistry
from agentloop.result import SubAgentCall
from agentloop.runstate import CANCELLED_MESSAGE, RunState
from agentloop.state import PausedRun, PendingCall, load_state, waiting_calls

__all__ = (
    "CONTINUE",
    "RESUME",
    "Ask",
    "Emit",
    "Turn",
    "TurnOutcome",
    "check_failures",
    "result_events",
)

Emit = Callable[[Event], Awaitable[None]]
Ask = Callable[[Callable[[StreamEvent], Awaitable[None]]], Awaitable[ModelResponse]]
"""Sends the turn's request; streams its events to the function given, if it streams."""

# Stop reasons after which the loop sends the history back for another round.
CONTINUE = frozenset({"tool_use", "max_tokens", "pause_turn", "compaction"})
RESUME = frozenset({"pause_turn", "compaction"})
"""Stop reasons of a turn the server has not finished: sent back as it is, to continue."""


@dataclass(frozen=True)
class TurnOutcome:
    """What one turn produced: the model's response, its calls, and the results of ours."""

    response: ModelResponse
    calls: list[ToolCall]
    results: list[ToolResult]


class Turn:
    """The tool calls of one round, from the first streamed block to the last result."""

    def __init__(
        self,
        run: RunState,
        registry: ToolRegistry,
        context: RunContext[Any],
        emit: Emit | None,
    ) -> None:
        """A turn of `run`, its calls run by `registry` with `context`; events to `emit`."""
        self.run = run
        self.round = context.round
        self.registry = registry
        self.context = context
        self.emit = emit
        self.group: CallGroup | None = None
        self.responded = False
        self.streamed: dict[int, tuple[ContentBlock, bool]] = {}  # index -> (block, complete)
        self.ids: dict[int, str] = {}  # block index -> tool_use id, while streaming
        self.watch = ResponseWatch(self.round)  # a response sent again replaces this one
        self.started: set[str] = set()
        self.running: Counter[str] = Counter()  # the started calls, by tool (max_uses)
        self.announced: set[str] = set()  # calls reported ready while streaming
        self.results: dict[str, ToolResult] = {}
        self.calls: dict[str, ToolCall] = {}  # the response's calls, as the model sent them
        self.paused: dict[str, dict[str, Any]] = {}  # sub-agent calls' paused runs, by call
        self.waits: dict[str, Waiting | None] = {}  # the gate's answer, asked once per call
        self.ran = uses_of(run.calls)  # the calls of earlier turns that ran, by tool (max_uses)
        self.closed = False

    async def play(self, ask: Ask) -> TurnOutcome:
        """Send the request through `ask`, run the calls, and answer them in the history.

        On a failure or a cancellation the turn is closed (every `tool_use` answered)
        before the exception goes on, as itself.
        """
        failure: Exception | None = None
        try:
            async with CallGroup(self.registry, self.context, self.run.capabilities) as group:
                self.group = group
                try:
                    response = await ask(self.on_event)
                    if self.emit is not None:
                        await self.emit(ModelResponded(self.round, response))
                    calls = await self.respond(response)
                except Exception as exc:
                    # Raised outside the group, so the caller gets it as is (not in an
                    # exception group); calls already started are cancelled.
                    failure = exc
                    group.cancel()
            if failure is not None:
                raise failure
        except BaseException as exc:
            self.close(_why(exc))
            raise
        return TurnOutcome(response, calls, self.complete(calls))

    # -- while the response streams in

    async def on_event(self, event: StreamEvent) -> None:
        """Report a streamed event and start a tool call whose block just closed."""
        replaced = self.watch.replaced(event)
        if replaced is not None:
            # No call of the dropped response started (see `request.py`): forget it.
            self.streamed.clear()
            self.ids.clear()
            if self.emit is not None:
                await self.emit(replaced)
        if self.emit is not None:
            await self.emit(ModelStreamEvent(self.round, event))
        if isinstance(event, BlockStop):
            self.streamed[event.index] = (event.block, event.complete)
            block = event.block
            if isinstance(block, ToolUseBlock) and event.complete and block.id not in self.started:
                call = call_of(block)
                if self._handed_back(call):
                    # Announced once the whole response is in: a limit it crosses, or
                    # its stop reason, may yet refuse the call (see `respond`).
                    return
                tool = self.registry.get(call.name)
                left = self.run.meter.calls_left()  # a tool_calls limit: start none over it
                offered = self.run.offered
                eager = (
                    call.error is None
                    and (tool is None or tool.eager)
                    and (offered is None or call.name in offered)
                    and (left is None or len(self.started) < left)
                    and may_start(self.registry, call.name, self.ran, self.running[call.name])
                )
                if self.emit is not None:
                    self.announced.add(call.id)
                    await self.emit(
                        ToolCallReady(self.round, call.id, call.name, call.input, eager)
                    )
                if eager:
                    self.start(call)
        if self.emit is not None:
            friendly = friendly_event(self.round, event, self.ids)
            if friendly is not None:
                await self.emit(friendly)

    def start(self, call: ToolCall) -> None:
        """Run `call` in a task of the turn's group (once)."""
        if call.id not in self.started:
            self.started.add(call.id)
            self.running[call.name] += 1
            assert self.group is not None
            self.group.start(call, self.finished)

    async def finished(self, result: ToolResult) -> None:
        """Record a call's result (run or not) and report it."""
        result = sendable(result)
        if result.paused is None:
            self.results[result.tool_use_id] = result
        else:  # not an answer: the call waits with its sub-run
            self.paused[result.tool_use_id] = result.paused
        if self.emit is not None:
            for event in result_events(self.round, result):
                await self.emit(event)

    # -- once the whole response is in

    async def respond(self, response: ModelResponse) -> list[ToolCall]:
        """Add the response to the history and start (or answer) its remaining calls."""
        calls = self.run.add_response(response, self._not_runnable(response))
        self.calls = {c.id: c for c in calls}
        self.responded = True
        ready = []
        for call in calls:
            if call.id in self.started:
                continue
            if self._handed_back(call):
                await self._announce_wait(call)
            elif call.error is not None:
                await self.finished(ToolResult.error(call, call.error, ran=False))
            else:
                if self.emit is not None and call.id not in self.announced:
                    await self.emit(
                        ToolCallReady(self.round, call.id, call.name, call.input, False)
                    )
                ready.append(call)
        # Every event first, then every start: what the calls' tasks do never lands
        # between two of the turn's own events (a durable engine records those in order).
        for call in ready:
            self.start(call)
        return calls

    def _handed_back(self, call: ToolCall) -> bool:
        """Whether `call` waits for the caller (approval, external) instead of running here."""
        return self._wait_of(call) is not None

    def _wait_of(self, call: ToolCall) -> Waiting | None:
        """Why `call` waits for the caller (the gate is asked once per call); None: it runs."""
        if call.error is not None:
            return None
        if call.id not in self.waits:
            self.waits[call.id] = self.run.gate.check(call, self.context)
        return self.waits[call.id]

    async def _announce_wait(self, call: ToolCall) -> None:
        """Report a call that waits for approval."""
        waiting = self._wait_of(call)
        if self.emit is not None and waiting is not None and waiting.kind == "approval":
            await self.emit(
                ApprovalRequested(self.round, call.id, call.name, call.input, waiting.reason)
            )

    def _not_runnable(self, response: ModelResponse) -> dict[str, str]:
        """Why each call that must not run won't, by tool_use id."""
        errors = {
            **self._not_offered(response),
            **self._by_stop_reason(response),
            **response.call_errors,
        }
        uses = response.tool_uses
        errors |= over_max_uses(self.registry, uses, self.ran, errors, self.started)
        run = self.run
        over = run.meter.refused_calls(response, errors, run.external_names, self.started)
        return {**errors, **over}

    def _not_offered(self, response: ModelResponse) -> dict[str, str]:
        """The calls of tools the turn's capabilities did not announce (hid)."""
        offered = self.run.offered
        if offered is None:
            return {}
        return {
            u.id: f"Not run: the tool '{u.name}' is not available now."
            for u in response.tool_uses
            if u.name not in offered and u.name in self.registry
        }

    def _by_stop_reason(self, response: ModelResponse) -> dict[str, str]:
        reason = response.stop_reason
        uses = response.tool_uses
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
        self.run.answer_turn(self.results, why, partial=partial, calls=self.calls)

    def complete(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The turn's results in tool_use order (of the calls that have one), added to the history.

        A call without a result (its task was cancelled while the response itself came
        in whole) is answered as cancelled. When calls of the turn wait (external tools,
        approvals, sub-agents whose runs paused), nothing is added: the run hands those
        calls back, and keeps its own results for the message that will answer them all.
        """
        self.closed = True
        if any(self._wait_of(c) or c.id in self.paused for c in calls):
            return self._hand_back(calls)
        pairs = self.run.answer_turn(self.results, CANCELLED_MESSAGE, calls=self.calls)
        return [r for _, r in pairs]

    def _hand_back(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """End the run here: the calls that wait are handed back, the others' results held."""
        waiting: list[PendingCall] = []
        own: list[tuple[ToolCall, ToolResult]] = []
        for call in calls:
            gate = self._wait_of(call)
            if gate is not None:
                waiting.append(PendingCall(call.id, call.name, call.input, gate.kind, gate.reason))
            elif call.id in self.paused:
                waiting.append(PendingCall.sub_run(call, self.paused[call.id]))
            else:
                own.append((call, self.results.get(call.id) or _cancelled(call)))
        self.run.hand_back(waiting, own)
        return [r for _, r in own]

    # -- a paused turn, resumed

    async def resume(self, paused: PausedRun) -> list[ToolResult]:
        """Finish the paused turn, seeded with the caller's answers; return what ran.

        Approved calls run (in parallel, as in any turn); denied and external ones are
        answered as decided; the calls that finished before the pause keep their
        results. A sub-agent's call runs again as the model asked it: its tool finds the
        sub-run it resumes, answered, in the turn's context (`RunContext.answers`); if
        that sub-run pauses again, so does this run, the turn's other results held. If
        the run is cancelled while the calls run, the calls left are answered as
        cancelled before the cancellation goes on.
        """
        uses = {use.id: use for use in paused.messages[-1].tool_uses}
        for block in paused.finished:
            self.results[block.tool_use_id] = ToolResult.from_block(
                block, uses[block.tool_use_id].name
            )
        to_run: dict[str, ToolCall] = {}
        for id_, answer in paused.answers.items():
            if isinstance(answer, ToolCall):
                to_run[id_] = answer
            elif isinstance(answer, PausedRun):
                to_run[id_] = call_of(uses[id_])
        ended = False
        try:
            for answer in paused.answers.values():
                if isinstance(answer, ToolResult):
                    await self.finished(answer)
            if self.emit is not None:
                for call in to_run.values():
                    await self.emit(
                        ToolCallReady(self.round, call.id, call.name, call.input, False)
                    )
            async with CallGroup(self.registry, self.context, self.run.capabilities) as group:
                self.group = group
                for call in to_run.values():
                    self.start(call)
            ended = True
        finally:
            self.closed = True
            for id_, call in to_run.items():
                if id_ in self.results and call.input != uses[id_].input:
                    self.results[id_] = _noted(self.results[id_], call.input)
            if ended and self.paused:
                self._hand_back([to_run.get(id_) or call_of(use) for id_, use in uses.items()])
            else:
                self.run.answer_turn(self.results, CANCELLED_MESSAGE, calls=to_run)
        return [self.results[i] for i in to_run if i in self.results]


def check_failures(run: RunState, results: Sequence[ToolResult], on_tool_error: str) -> None:
    """Under `on_tool_error="stop"`, end `run` at the first of `results` that failed."""
    if on_tool_error != "stop":
        return
    failed = next((r for r in results if r.is_error and r.ran), None)
    if failed is not None:
        raise ToolCallFailed(
            f"tool {failed.name!r} ({failed.tool_use_id}) failed: {failed.text}",
            result=run.result("tool_error"),
        )


def _cancelled(call: ToolCall) -> ToolResult:
    return ToolResult.error(call, CANCELLED_MESSAGE, ran=False)


def _noted(result: ToolResult, edited: dict[str, Any]) -> ToolResult:
    """`result`, telling the model that the call ran with an input a person edited."""
    note = (
        "Note: before this call ran, a person approved it with edited input: "
        f"{json.dumps(edited, ensure_ascii=False)}"
    )
    content = result.content
    if content is None or isinstance(content, str):
        return replace(result, content=f"{note}\n{content or ''}".rstrip("\n"))
    return replace(result, content=[TextBlock(text=note), *content])


def result_events(round_: int, result: ToolResult) -> list[Event]:
    """How a call's result of round `round_` is reported.

    As its `ToolResultEvent`; a sub-agent call whose run paused has no result yet: it is
    reported by an `ApprovalRequested` for each call inside that waits for approval.
    """
    if result.paused is None:
        return [ToolResultEvent.of(round_, result)]
    inside = SubAgentCall(result.name, result.tool_use_id)
    return [
        ApprovalRequested(round_, w.tool_use_id, w.name, w.input, w.reason, (inside, *via))
        for via, w in waiting_calls(load_state(result.paused).pending)
        if w.kind == "approval"
    ]


def _why(exc: BaseException) -> str:
    """What the calls left without a result are told when the turn ends with `exc`."""
    if isinstance(exc, AgentloopError):
        cause = "the model request" if isinstance(exc, ProviderError) else "the run"
        return f"Cancelled: {cause} failed ({exc})."
    return CANCELLED_MESSAGE
