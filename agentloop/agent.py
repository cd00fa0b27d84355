"""The agent: the loop that turns a prompt into a finished run.

Each round sends the history to the model, appends the assistant message verbatim, runs
the turn's tool calls in parallel through the registry and appends their results as one
user message, until the model stops asking for tools or a limit is reached. All per-run
state lives in `_Run`, so one `Agent` serves any number of concurrent runs.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import anyio
import structlog

from agentloop.errors import AgentloopError, ConfigurationError, ProviderError, ToolCallFailed
from agentloop.events import Event, RequestStarted, RoundFinished, RunFinished, RunStarted
from agentloop.messages import (
    ContentBlock,
    HistoryLinter,
    Message,
    TextBlock,
    dump_history,
    parse_history,
)
from agentloop.providers.base import (
    ModelRequest,
    ModelResponse,
    Provider,
    StreamingProvider,
    Usage,
)
from agentloop.registry import ExecutionContext, ToolRegistry
from agentloop.stream import RunStream
from agentloop.tools import Tool, ToolCall, ToolResult
from agentloop.turn import CONTINUE, TRUNCATED_MESSAGE, Emit, Turn

__all__ = ("TRUNCATED_MESSAGE", "Agent", "RunResult", "ToolCallRecord")

_log = structlog.get_logger("agentloop")

DEFAULT_MODEL = "claude-sonnet-5-5"
"""The model an `Agent` uses when none is given."""

StopReason = str
"""Why a run ended: the model's last `stop_reason` ("end_turn", "max_tokens", "refusal",
"stop_sequence", "model_context_window_exceeded", "pause_turn", or a future value), or
agentloop's own "max_rounds", "tool_error", "cancelled" or "error"."""

CANCELLED_MESSAGE = "Cancelled: the run was stopped before this call finished."


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of a run, as logged in `RunResult.tool_calls`."""

    round: int
    name: str
    input: dict[str, Any]
    tool_use_id: str
    is_error: bool
    output: str
    """What the model was sent (block content rendered as text)."""
    duration: float
    """Seconds the tool ran."""


@dataclass
class RunResult:
    """What a run produced. `messages` can be passed back as `history=` to continue."""

    text: str
    """The final assistant message's text blocks, joined."""
    stop_reason: StopReason
    messages: list[dict[str, Any]]
    """The whole history in wire form (JSON-serialisable), valid to send again."""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    """Token counts summed over every request of the run."""
    rounds: int = 0
    """How many model requests the run made."""
    run_id: str = ""


class _Run:
    """The state of one run: its history, usage, log, and the round under way."""

    def __init__(self, agent: Agent, messages: list[Message], deps: Any) -> None:
        self.id = uuid.uuid4().hex
        self.messages = messages
        self.deps = deps
        self.usage = Usage()
        self.rounds = 0
        self.calls: list[ToolCallRecord] = []
        self.container: str | None = None
        self.limiter = anyio.CapacityLimiter(agent.tool_concurrency)
        self.log = _log.bind(run_id=self.id)
        thinking = bool(agent.thinking) and (agent.thinking or {}).get("type") != "disabled"
        self.linter = HistoryLinter(
            thinking=thinking,
            tool_choice=agent.tool_choice,
            allow_file_sources=agent._files_beta,
        )
        """Checks the history before each request, reading only what is new."""
        self.turn: Turn | None = None
        """The round under way: what `end_early` must complete after a failure."""
        self.stop_after_turn = False
        """Set by `RunStream.cancel(after_turn=True)`."""
        self.partial: RunResult | None = None
        """The result handed over when the run ended early."""
        self.final: RunResult | None = None
        """The result of a run that finished."""

    def add_response(self, response: ModelResponse) -> None:
        self.usage += response.usage
        if response.container and response.container.get("id"):
            self.container = str(response.container["id"])
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant":
            # Continuing a paused turn: the API treats consecutive assistant messages as
            # one, so keep them as one.
            self.messages[-1] = Message.of_blocks("assistant", [*last.blocks, *response.content])
        else:
            self.messages.append(response.message)

    def add_results(self, results: Sequence[ToolResult], calls: Sequence[ToolCall]) -> None:
        self.messages.append(Message.of_blocks("user", [r.to_block() for r in results]))
        for call, r in zip(calls, results, strict=True):
            self.calls.append(
                ToolCallRecord(
                    self.rounds, r.name, call.input, r.tool_use_id, r.is_error, r.text, r.duration
                )
            )

    def end_early(self, why: str, stop_reason: StopReason) -> RunResult:
        """Complete the history after a failure or cancellation; return the partial result."""
        if self.turn is not None:
            self.turn.close(why)
            self.turn = None
        self.partial = self.result(stop_reason)
        return self.partial

    def result(self, stop_reason: StopReason) -> RunResult:
        last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
        return RunResult(
            text=last.text if last else "",
            stop_reason=stop_reason,
            messages=dump_history(self.messages),
            tool_calls=list(self.calls),
            usage=self.usage,
            rounds=self.rounds,
            run_id=self.id,
        )


class Agent:
    """Runs the model and its tools until the model is done.

    One `Agent` holds configuration only; every `run()` keeps its own state, so a service
    can share one agent between any number of concurrent runs.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        provider: Provider | None = None,
        client: Any = None,
        system: str | Sequence[Mapping[str, Any]] | None = None,
        tools: Iterable[Tool | Callable[..., Any]] | ToolRegistry = (),
        max_rounds: int = 10,
        max_tokens: int = 4096,
        tool_concurrency: int = 8,
        tool_timeout: float = 30.0,
        tool_limiter: anyio.CapacityLimiter | None = None,
        tool_choice: Mapping[str, Any] | None = None,
        thinking: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        stop_sequences: Sequence[str] | None = None,
        on_tool_error: Literal["continue", "stop"] = "continue",
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Configure an agent.

        Args:
            model: Model name sent with each request.
            provider: Where requests go; by default an `AnthropicProvider` over `client`.
            client: An `anthropic.AsyncAnthropic` to use (base_url, retries, headers and
                timeouts are its own); ignored when `provider` is given.
            system: System prompt, a string or a list of text blocks.
            tools: Tools (functions are wrapped with `tool`), or a ready `ToolRegistry`.
            max_rounds: Most model requests one run may make; when reached the run stops
                with `stop_reason="max_rounds"` and a complete history.
            max_tokens: `max_tokens` of each request.
            tool_concurrency: Most tool calls of one run in flight at once.
            tool_timeout: Seconds a tool call may take, unless the tool sets its own.
            tool_limiter: An optional limiter shared by several agents or runs, capping
                tool calls across all of them (in addition to `tool_concurrency`).
            tool_choice: `{"type": "auto" | "any" | "tool" | "none", ...}`, including
                `disable_parallel_tool_use`.
            thinking: Extended thinking, e.g. `{"type": "enabled", "budget_tokens": 2048}`.
            metadata: Request metadata, e.g. `{"user_id": ...}`.
            stop_sequences: Custom stop sequences.
            on_tool_error: `"continue"` sends failures to the model as `is_error` results;
                `"stop"` also ends the run with `ToolCallFailed` once the turn's results are
                in the history.
            params: Further request fields, passed through as they are (`temperature`,
                `top_p`, `service_tier`, `extra_headers`, ...).
        """
        if max_rounds < 1 or tool_concurrency < 1 or tool_timeout <= 0 or max_tokens < 1:
            raise ConfigurationError(
                "max_rounds, tool_concurrency and max_tokens must be >= 1 and tool_timeout > 0"
            )
        if on_tool_error not in ("continue", "stop"):
            raise ConfigurationError(
                f"on_tool_error must be 'continue' or 'stop', not {on_tool_error!r}"
            )
        if provider is None:
            from .providers.anthropic import AnthropicProvider

            provider = AnthropicProvider(client)
        self.model = model
        self.provider = provider
        self.system = system
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.max_rounds = max_rounds
        self.max_tokens = max_tokens
        self.tool_concurrency = tool_concurrency
        self.tool_timeout = tool_timeout
        self.tool_limiter = tool_limiter
        self.tool_choice = tool_choice
        self.thinking = thinking
        self.metadata = metadata
        self.stop_sequences = stop_sequences
        self.on_tool_error = on_tool_error
        self.params = dict(params or {})
        headers = self.params.get("extra_headers") or {}
        betas = f"{headers.get('anthropic-beta', '')},{self.params.get('betas', '')}"
        self._files_beta = "files-api" in betas
        """Whether requests opt into the Files API, which allows `file` sources."""

    async def run(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Run the model and its tools until the model stops or a limit is reached.

        Args:
            prompt: The new user input; `None` continues `history` as it is (for
                example after `max_rounds`, or a paused turn).
            history: Earlier messages (e.g. a previous `RunResult.messages`).
            deps: Any object; tools receive it as `RunContext.deps`.

        Raises:
            HistoryError: `history` breaks an API rule (see `repair`).
            ProviderError: the API failed; `.result` holds the partial run.
            ToolCallFailed: a tool failed under `on_tool_error="stop"`.
        """
        return await self._drive(_Run(self, _start(history, prompt), deps), None)

    @asynccontextmanager
    async def run_stream(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
    ) -> AsyncIterator[RunStream]:
        """Run as `run()` does, yielding typed events while the model streams.

        Tool calls start the moment their `tool_use` block is complete (unless the tool
        was made with `eager=False`). Leaving the `async with` block before the run ends
        cancels it; `stream.result` then holds the partial result, whose history is valid
        to send again.

        ```python
        async with agent.run_stream("Weather in Paris?") as stream:
            async for event in stream:
                print(event)
        print(stream.result.text)
        ```
        """
        run = _Run(self, _start(history, prompt), deps)
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        stream = RunStream(run, receive)
        failure: Exception | None = None
        with receive:
            async with anyio.create_task_group() as group:
                group.start_soon(stream._drive, partial(self._drive, run), send)
                try:
                    yield stream
                except Exception as exc:
                    failure = exc  # re-raised below, as is rather than in an exception group
                finally:
                    stream.cancel()
        if failure is not None:
            raise failure

    async def _drive(self, run: _Run, emit: Emit | None) -> RunResult:
        """The loop with its logging; completes the history if the run ends early."""
        run.log.info("run.start", model=self.model, tools=len(self.registry))
        if emit is not None:
            await emit(RunStarted(run.id))
        try:
            with structlog.contextvars.bound_contextvars(run_id=run.id):
                stop = await self._loop(run, emit)
        except anyio.get_cancelled_exc_class() as exc:
            exc.result = run.end_early(CANCELLED_MESSAGE, "cancelled")  # type: ignore[attr-defined]
            run.log.info("run.cancelled", rounds=run.rounds)
            raise
        except AgentloopError as exc:
            if exc.result is None:
                cause = "the model request" if isinstance(exc, ProviderError) else "the run"
                exc.result = run.end_early(f"Cancelled: {cause} failed ({exc}).", "error")
            run.log.warning("run.error", error=str(exc), error_type=type(exc).__name__)
            raise
        result = run.final = run.result(stop)
        run.log.info("run.end", stop_reason=stop, rounds=run.rounds, usage=result.usage)
        if emit is not None:
            await emit(RunFinished(result))
        return result

    async def _loop(self, run: _Run, emit: Emit | None) -> StopReason:
        while run.rounds < self.max_rounds:
            response, calls = await self._round(run, emit)
            if run.stop_after_turn:
                return "cancelled"
            stop = response.stop_reason
            if stop not in CONTINUE or (stop != "pause_turn" and not calls):
                return stop or "end_turn"
        return "max_rounds"

    async def _round(self, run: _Run, emit: Emit | None) -> tuple[ModelResponse, list[ToolCall]]:
        """One model request and its tool calls, each started as early as it can be."""
        request = self._build_request(run)
        run.linter.check(request.messages)
        run.rounds += 1
        if emit is not None:
            await emit(RequestStarted(run.rounds))
        context = ExecutionContext(
            run.id,
            run.rounds,
            run.limiter,
            self.tool_timeout,
            run.deps,
            self.tool_limiter,
            None,  # worker threads: the event loop's thread_limiter(), shared by every run
            run.log.bind(round=run.rounds),
        )
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            turn = run.turn = Turn(run, self.registry, context, group, emit)
            try:
                response = await self._request(run, request, turn, emit)
            except Exception as exc:
                # Raised outside the task group, so the caller gets it as is (not grouped);
                # calls started from the stream are cancelled.
                failure = exc
                group.cancel_scope.cancel()
            else:
                calls = await turn.respond(response)
        if failure is not None:
            raise failure
        results = turn.complete(calls)
        run.turn = None
        if emit is not None:
            await emit(RoundFinished(run.rounds, response.stop_reason, response.usage))
        self._check_failures(run, results)
        return response, calls

    async def _request(
        self, run: _Run, request: ModelRequest, turn: Turn, emit: Emit | None
    ) -> ModelResponse:
        started = time.perf_counter()
        if emit is not None and isinstance(self.provider, StreamingProvider):
            response = await self.provider.stream(request, turn.on_event)
        else:
            response = await self.provider.complete(request)
        run.log.info(
            "model.request",
            round=run.rounds,
            latency=round(time.perf_counter() - started, 4),
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            cache_read_input_tokens=response.usage.cache_read_input_tokens,
            stop_reason=response.stop_reason,
        )
        return response

    def _build_request(self, run: _Run) -> ModelRequest:
        return ModelRequest(
            model=self.model,
            messages=run.messages,
            max_tokens=self.max_tokens,
            system=self.system,
            tools=self.registry.definitions(),
            tool_choice=self.tool_choice,
            thinking=self.thinking,
            metadata=self.metadata,
            stop_sequences=self.stop_sequences,
            container=run.container,
            params=self.params,
        )

    def _check_failures(self, run: _Run, results: Sequence[ToolResult]) -> None:
        """Under `on_tool_error="stop"`, end the run at the first call that failed."""
        if self.on_tool_error != "stop":
            return
        failed = next((r for r in results if r.is_error and r.ran), None)
        if failed is not None:
            raise ToolCallFailed(
                f"tool {failed.name!r} ({failed.tool_use_id}) failed: {failed.text}",
                result=run.result("tool_error"),
            )

    def run_sync(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
    ) -> RunResult:
        """`run()` for scripts and notebooks without a running event loop."""
        return anyio.run(partial(self.run, prompt, history=history, deps=deps))


def _start(
    history: Iterable[Message | Mapping[str, Any]] | None,
    prompt: str | Sequence[ContentBlock] | None,
) -> list[Message]:
    """The history a run starts from: `history` plus the prompt, merged into one user turn."""
    messages = list(parse_history(history or []))
    if prompt is None or prompt == "":
        if not messages:
            raise ConfigurationError("a run needs a prompt or a history to continue")
        return messages
    new: list[ContentBlock] = [TextBlock(text=prompt)] if isinstance(prompt, str) else list(prompt)
    if messages and messages[-1].role == "user":
        messages[-1] = Message.user([*messages[-1].blocks, *new])
    elif isinstance(prompt, str):
        messages.append(Message.user(prompt))
    else:
        messages.append(Message.user(new))
    return messages
