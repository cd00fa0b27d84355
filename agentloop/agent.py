"""The agent: the loop that turns a prompt into a finished run.

Each round checks the history and sends it to the model, adds the assistant message
verbatim, runs the turn's tool calls in parallel through the registry and adds their
results as one user message, until the model stops asking for tools or a limit is reached.
All per-run state lives in a `RunState`, so one `Agent` serves any number of concurrent
runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

import anyio
import structlog
from opentelemetry.trace import TracerProvider

from agentloop.checks import check_count, check_seconds
from agentloop.errors import AgentloopError, ConfigurationError, ToolCallFailed
from agentloop.events import Event, RequestStarted, RoundFinished, RunFinished, RunStarted
from agentloop.history import History
from agentloop.lint import HistoryLinter
from agentloop.logs import get_logger
from agentloop.messages import ContentBlock, Message
from agentloop.pricing import cost_of
from agentloop.providers.base import (
    ModelRequest,
    ModelResponse,
    Provider,
    StreamEvent,
    StreamingProvider,
)
from agentloop.providers.caching import CacheSetting, cache_marker
from agentloop.registry import ExecutionContext, ToolRegistry, reraise_base_exception
from agentloop.result import RunResult, StopReason
from agentloop.run import RunState
from agentloop.stream import RunStream
from agentloop.tools import Tool, ToolDefinition, ToolResult
from agentloop.tracing import record_response, record_run, tracing_for
from agentloop.turn import CONTINUE, Emit, Turn

__all__ = ("DEFAULT_MODEL", "Agent")

_log = get_logger()

DEFAULT_MODEL = "claude-sonnet-5-5"
"""The model an `Agent` uses when none is given."""


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
        name: str = "agentloop",
        tracer_provider: TracerProvider | None = None,
        history_check: Literal["strict", "off"] = "strict",
        cache: CacheSetting = "auto",
    ) -> None:
        """Configure an agent.

        Args:
            model: Model name sent with each request.
            provider: Where requests go; by default an `AnthropicProvider` over `client`.
            client: An `anthropic.AsyncAnthropic` to use (base_url, retries, headers and
                timeouts are its own), or an `openai.AsyncOpenAI` (then requests go to
                its Chat Completions endpoint, see `OpenAIChatProvider`); ignored when
                `provider` is given.
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
                `top_p`, `service_tier`, `betas`, `extra_headers`, ...).
            name: The agent's name in traces (`invoke_agent {name}`).
            tracer_provider: Where the run's OpenTelemetry spans go; by default the
                global tracer provider, which records nothing until an SDK is set up.
            history_check: `"strict"` checks the history against the API's rules before
                every request (`HistoryError` at the first broken one); `"off"` sends it
                unchecked, for a model that accepts what the checks refuse.
            cache: Prompt caching (Anthropic): `"auto"` puts cache breakpoints on each
                request, where they move with the history (5-minute TTL); `"1h"` the
                same with a 1-hour TTL; `"off"` adds none (the user's own markers are
                sent either way). Chat Completions servers cache on their own.

        Raises:
            ConfigurationError: an option has a value that cannot work; nothing is
                checked later that could have been checked here.
        """
        check_count("max_rounds", max_rounds)
        check_count("max_tokens", max_tokens)
        check_count("tool_concurrency", tool_concurrency)
        check_seconds("tool_timeout", tool_timeout)
        if history_check not in ("strict", "off"):
            raise ConfigurationError(
                f"history_check must be 'strict' or 'off', not {history_check!r}"
            )
        if on_tool_error not in ("continue", "stop"):
            raise ConfigurationError(
                f"on_tool_error must be 'continue' or 'stop', not {on_tool_error!r}"
            )
        if tool_limiter is not None and not isinstance(tool_limiter, anyio.CapacityLimiter):
            raise ConfigurationError(
                f"tool_limiter must be an anyio.CapacityLimiter, not {type(tool_limiter).__name__}"
            )
        if tools is None or isinstance(tools, (str, bytes, Mapping)):
            raise ConfigurationError(
                f"tools must be a list of tools or functions, not {type(tools).__name__}"
            )
        if provider is None:
            from .providers import provider_for

            provider = provider_for(client)
        elif not callable(getattr(provider, "complete", None)):
            raise ConfigurationError(f"provider {provider!r} has no complete() method")
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
        self.name = name
        self.tracer_provider = tracer_provider
        self.history_check = history_check
        self.cache = cache
        self._cache_marker = cache_marker(cache)
        headers = self.params.get("extra_headers") or {}
        betas = self.params.get("betas") or ()
        betas = [betas] if isinstance(betas, str) else list(betas)
        self._files_beta = any(
            "files-api" in str(b) for b in [headers.get("anthropic-beta", ""), *betas]
        )
        """Whether requests opt into the Files API, which allows `file` sources."""

    async def run(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
    ) -> RunResult:
        """Run the model and its tools until the model stops or a limit is reached.

        Args:
            prompt: The new user input; `None` continues `history` as it is (for
                example after `max_rounds`, or a paused turn).
            history: Earlier messages (e.g. a previous `RunResult.messages`).
            deps: Any object; tools receive it as `RunContext.deps`.
            external_tools: Tools announced to the model that this run does not run:
                their calls are handed back. When the model calls one, the run runs the
                turn's other calls, then ends with `stop_reason="tool_use"`, the calls in
                `RunResult.pending` and its own results in `RunResult.held`;
                `messages` ends with that assistant message. Continue with a history
                that adds one user message answering every call of the turn, in order.
                Definitions are `ToolDefinition`s or wire dicts, sent as they are.

        Raises:
            ConfigurationError: the prompt or history is not of a usable type.
            HistoryError: `history` breaks an API rule (see `repair`).
            ProviderError: the API failed; `.result` holds the partial run.
            ToolCallFailed: a tool failed under `on_tool_error="stop"`.
        """
        run = self._new_run(history, prompt, deps, external_tools)
        return await self._drive(run, None)

    @asynccontextmanager
    async def run_stream(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
    ) -> AsyncIterator[RunStream]:
        """Run as `run()` does, yielding typed events while the model streams.

        Tool calls start the moment their `tool_use` block is complete (unless the tool
        was made with `eager=False`). Leaving the `async with` block before the run ends,
        or cancelling a scope around it, cancels the run; `stream.result` then holds the
        partial result, whose history is valid to send again.

        ```python
        async with agent.run_stream("Weather in Paris?") as stream:
            async for event in stream:
                print(event)
        print(stream.result.text)
        ```
        """
        run = self._new_run(history, prompt, deps, external_tools)
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        stream = RunStream(run, receive)
        failure: BaseException | None = None
        try:
            with receive:
                async with anyio.create_task_group() as group:
                    group.start_soon(stream._drive, partial(self._drive, run), send)
                    try:
                        yield stream
                    except Exception as exc:
                        failure = exc  # re-raised below, as is rather than in an exception group
                    finally:
                        stream.cancel()
        except BaseException as exc:
            reraise_base_exception(exc)
            raise
        if failure is not None:
            raise failure

    def run_sync(
        self,
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
    ) -> RunResult:
        """`run()` for scripts and notebooks without a running event loop (same arguments)."""
        return anyio.run(
            partial(self.run, prompt, history=history, deps=deps, external_tools=external_tools)
        )

    # -- the loop: agent -> turn -> one call function (ToolRegistry.run_call) -> history

    async def _loop(self, run: RunState, emit: Emit | None) -> StopReason:
        """Rounds of request, response and tool calls, until the model is done."""
        while run.rounds < self.max_rounds:
            if self.history_check == "strict":
                run.history.check()
            request = self._build_request(run)
            round_ = run.start_round()
            if emit is not None:
                await emit(RequestStarted(round_))
            turn = Turn(run, self.registry, self._context(run, round_), emit)
            outcome = await turn.play(partial(self._request, run, request, emit))
            # A cancellation that reached only the tool calls (the response itself came in
            # whole) ends the run here, with every call answered.
            await anyio.lowlevel.checkpoint_if_cancelled()
            response = outcome.response
            if emit is not None:
                await emit(RoundFinished(round_, response.stop_reason, response.usage))
            self._check_failures(run, outcome.results)
            if run.pending:
                return "tool_use"
            if run.stopping:
                return "cancelled"
            stop = response.stop_reason
            if stop not in CONTINUE or (stop != "pause_turn" and not outcome.calls):
                return stop or "end_turn"
        return "max_rounds"

    def _new_run(
        self,
        history: Iterable[Message | Mapping[str, Any]] | None,
        prompt: str | Sequence[ContentBlock] | None,
        deps: Any,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
    ) -> RunState:
        linter = HistoryLinter(
            thinking=self.thinking,
            tool_choice=self.tool_choice,
            allow_file_sources=self._files_beta,
        )
        history_ = History.start(history, prompt, linter)
        names = [_tool_name(t) for t in external_tools]
        clash = sorted(set(names) & set(self.registry.names))
        if clash:
            raise ConfigurationError(
                f"external tool name(s) {', '.join(clash)} are also tools of this agent; "
                "the model addresses tools by name"
            )
        return RunState(
            history_,
            deps=deps,
            tool_concurrency=self.tool_concurrency,
            log=_log,
            tracing=tracing_for(self.tracer_provider),
            external=external_tools,
            external_names=frozenset(names),
            price=partial(cost_of, self.model, provider=_provider_name(self.provider)),
        )

    def _context(self, run: RunState, round_: int) -> ExecutionContext:
        """What the tool calls of round `round_` need from the run."""
        return ExecutionContext(
            run.id,
            round_,
            run.limiter,
            self.tool_timeout,
            run.deps,
            self.tool_limiter,
            None,  # worker threads: the event loop's thread_limiter(), shared by every run
            run.log.bind(round=round_),
            run.tracing,
        )

    async def _drive(self, run: RunState, emit: Emit | None) -> RunResult:
        """The loop inside the run's span, when it has one."""
        if run.tracing is None:
            return await self._drive_logged(run, emit)
        provider = _provider_name(self.provider)
        with run.tracing.run(self.name, self.model, provider, run.id) as span:
            try:
                return await self._drive_logged(run, emit)
            finally:
                if run.outcome is not None:
                    record_run(span, run.outcome)

    async def _drive_logged(self, run: RunState, emit: Emit | None) -> RunResult:
        """The loop with its logs; keeps the partial result of a run that ends early."""
        run.log.info("run.start", model=self.model, tools=len(self.registry))
        if emit is not None:
            await emit(RunStarted(run.id))
        try:
            with structlog.contextvars.bound_contextvars(run_id=run.id):
                stop = await self._loop(run, emit)
        except anyio.get_cancelled_exc_class():
            run.end_early("cancelled")
            run.log.info("run.cancelled", rounds=run.rounds)
            raise
        except AgentloopError as exc:
            if exc.result is None:
                exc.result = run.end_early("error")
            run.log.warning("run.error", error=str(exc), error_type=type(exc).__name__)
            raise
        except BaseException:
            run.end_early("error")  # KeyboardInterrupt, SystemExit, ...
            raise
        result = run.finish(stop)
        run.log.info("run.end", stop_reason=stop, rounds=run.rounds, usage=result.usage)
        if emit is not None:
            await emit(RunFinished(result))
        return result

    async def _request(
        self,
        run: RunState,
        request: ModelRequest,
        emit: Emit | None,
        on_event: Callable[[StreamEvent], Awaitable[None]],
    ) -> ModelResponse:
        """Send `request`; streamed to `on_event` when the run streams and the provider can."""
        started = time.perf_counter()
        if run.tracing is None:
            response = await self._ask(request, emit, on_event)
        else:
            provider = _provider_name(self.provider)
            tracing = run.tracing
            with tracing.chat(provider, self.model, self.max_tokens, request.messages) as span:
                response = await self._ask(request, emit, on_event)
                record_response(span, response, tracing.capture_content)
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

    async def _ask(
        self,
        request: ModelRequest,
        emit: Emit | None,
        on_event: Callable[[StreamEvent], Awaitable[None]],
    ) -> ModelResponse:
        if emit is not None and isinstance(self.provider, StreamingProvider):
            return await self.provider.stream(request, on_event)
        return await self.provider.complete(request)

    def _build_request(self, run: RunState) -> ModelRequest:
        return ModelRequest(
            model=self.model,
            messages=run.history.messages,
            max_tokens=self.max_tokens,
            system=self.system,
            tools=[*self.registry.definitions(), *run.external]
            if run.external
            else (self.registry.definitions()),
            tool_choice=self.tool_choice,
            thinking=self.thinking,
            metadata=self.metadata,
            stop_sequences=self.stop_sequences,
            container=run.container,
            params=self.params,
            cache=self._cache_marker,
        )

    def _check_failures(self, run: RunState, results: Sequence[ToolResult]) -> None:
        """Under `on_tool_error="stop"`, end the run at the first call that failed."""
        if self.on_tool_error != "stop":
            return
        failed = next((r for r in results if r.is_error and r.ran), None)
        if failed is not None:
            raise ToolCallFailed(
                f"tool {failed.name!r} ({failed.tool_use_id}) failed: {failed.text}",
                result=run.result("tool_error"),
            )


def _tool_name(definition: ToolDefinition | Mapping[str, Any]) -> str:
    name = definition.name if isinstance(definition, ToolDefinition) else definition.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"an external tool needs a name: {definition!r}")
    return name


def _provider_name(provider: Provider) -> str:
    """The provider's name for traces (`gen_ai.provider.name`)."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) else type(provider).__name__
