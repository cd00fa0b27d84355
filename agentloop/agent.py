"""The agent: the loop that turns a prompt into a finished run.

Each round checks the history and sends it to the model, adds the assistant message
verbatim, runs the turn's tool calls in parallel through the registry and adds their
results as one user message, until the model stops asking for tools or a limit is reached.
All per-run state lives in a `RunState`, so one `Agent` serves any number of concurrent
runs.
"""

from __future__ import annotations

import json
import math
import time
import types
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, Generic, Literal, TypeVar, overload

import anyio
import structlog
from opentelemetry.trace import TracerProvider

from agentloop.approval import ApprovalRule, Decision, Gate, agent_rule
from agentloop.checks import check_count, check_seconds
from agentloop.compaction import (
    HistoryProcessor,
    apply_processors,
    context_management_params,
    is_length_refusal,
)
from agentloop.effects import OnEvent
from agentloop.errors import AgentloopError, ConfigurationError, ProviderError, ToolCallFailed
from agentloop.events import (
    Event,
    OutputReady,
    RequestStarted,
    RoundFinished,
    RunFinished,
    RunStarted,
)
from agentloop.history import History
from agentloop.limits import (
    Meter,
    UsageLimits,
    check_before_request,
    check_provider,
)
from agentloop.lint import HistoryLinter, lint_history
from agentloop.logs import get_logger
from agentloop.messages import ContentBlock, Message
from agentloop.output import (
    OutputMode,
    OutputRun,
    OutputSchema,
    OutputValidator,
    check_validator,
    output_schema,
    resolve_mode,
)
from agentloop.partial import PartialOutputs
from agentloop.pricing import table_provider
from agentloop.providers.base import (
    ModelRequest,
    ModelResponse,
    Provider,
    StreamingProvider,
)
from agentloop.providers.caching import CacheSetting, cache_marker
from agentloop.registry import ExecutionContext, ToolRegistry, reraise_base_exception
from agentloop.result import OutputT, RunResult, StopReason
from agentloop.resume import finish_turn, plan
from agentloop.run import RunState
from agentloop.scope import RunScope, entered
from agentloop.sessions.base import Session
from agentloop.sessions.runs import keeping, load_session
from agentloop.state import PausedRun
from agentloop.stream import RunStream
from agentloop.tools import RunContext, Tool, ToolDefinition, ToolResult, wire_tool_name
from agentloop.tracing import record_response, record_run, tracing_for
from agentloop.turn import CONTINUE, RESUME, Emit, Turn

__all__ = ("DEFAULT_MODEL", "Agent")

_log = get_logger()

DEFAULT_MODEL = "claude-sonnet-5-5"
"""The model an `Agent` uses when none is given."""

RunOutputT = TypeVar("RunOutputT")
"""The output type of one run given `output_type=`, instead of the agent's."""
_Prompt = str | Sequence[ContentBlock] | None
_History = Iterable[Message | Mapping[str, Any]] | None
_External = Sequence[ToolDefinition | Mapping[str, Any]]


class Agent(Generic[OutputT]):
    """Runs the model and its tools until the model is done.

    One `Agent` holds configuration only; every `run()` keeps its own state, so a service
    can share one agent between any number of concurrent runs. It is generic in the type
    of its runs' `result.output` (`Agent[Forecast]` for `output_type=Forecast`).
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
        approval_required: Collection[str] | ApprovalRule | None = None,
        usage_limits: UsageLimits | None = None,
        history_processors: Sequence[HistoryProcessor] = (),
        context_management: Mapping[str, Any] | None = None,
        output_type: type[OutputT] | types.UnionType | None = None,
        output_mode: OutputMode = "auto",
        output_retries: int = 2,
        cache: CacheSetting = "auto",
    ) -> None:
        """Configure an agent.

        Args:
            model: Model name sent with each request.
            provider: Where requests go; by default an `AnthropicProvider` over `client`.
            client: An `anthropic.AsyncAnthropic` to use (base_url, retries, headers and
                timeouts are its own) or one of the SDK's asynchronous platform clients
                (`AsyncAnthropicBedrock`, `AsyncAnthropicVertex`, ...), or an
                `openai.AsyncOpenAI` (then requests go to its Chat Completions endpoint,
                see `OpenAIChatProvider`); ignored when `provider` is given.
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
            approval_required: Tools whose calls wait for a person's decision, on top of
                each tool's own `requires_approval`: a set of tool names (for plugin
                tools, whose authors cannot know this service's policy), or
                `rule(ctx, input) -> bool` deciding per call. See `resume`.
            usage_limits: The most each run may spend (requests, tokens, tool calls,
                dollars); a run that would go over ends with `UsageLimitExceeded`. A
                run's own `usage_limits=` replaces these.
            history_processors: Functions (sync or async, optionally taking the
                `RunContext` first) from the messages to the messages to send, applied
                in order before every request, e.g. `agentloop.compaction`'s
                `clear_old_tool_results(keep_last=3)`. They shape what is sent, never
                the run's history (`RunResult.messages`). With processors, a request
                refused for length is retried once with their `forced` form.
            context_management: The Anthropic API's server-side context management,
                e.g. `{"edits": [{"type": "clear_tool_uses_20250919"}]}` or
                `{"edits": [{"type": "compact_20260112"}]}`, sent with each request under
                the beta its edits need. The blocks the API returns for it (such as
                `compaction`) stay in the history verbatim and are sent back.
            output_type: What a run ends with, validated, as `result.output`: a pydantic
                model, a dataclass, a TypedDict, a plain type (`int`, `list[str]`,
                `Literal[...]`) or a union of these; `str` (the default) is the final
                text. See the Output page of the docs.
            output_mode: How the output reaches the model: `"native"` (the provider's
                structured output), `"tool"` (a final-result tool), `"prompted"` (the
                schema in the system prompt), or `"auto"`: native where the provider
                has it, else tool.
            output_retries: How often an invalid output (schema or validator) is sent
                back to the model before the run ends with `OutputValidationError`.
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
        if type(output_retries) is not int or output_retries < 0:
            raise ConfigurationError(
                f"output_retries must be a whole number >= 0, not {output_retries!r}"
            )
        if output_mode not in ("auto", "native", "tool", "prompted"):
            raise ConfigurationError(
                f"output_mode must be 'auto', 'native', 'tool' or 'prompted', not {output_mode!r}"
            )
        if tool_limiter is not None and not isinstance(tool_limiter, anyio.CapacityLimiter):
            raise ConfigurationError(
                f"tool_limiter must be an anyio.CapacityLimiter, not {type(tool_limiter).__name__}"
            )
        if tools is None or isinstance(tools, (str, bytes, Mapping)):
            raise ConfigurationError(
                f"tools must be a list of tools or functions, not {type(tools).__name__}"
            )
        if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
            raise ConfigurationError(
                f"usage_limits must be a UsageLimits, not {type(usage_limits).__name__}"
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
        if context_management is not None:
            if getattr(provider, "name", None) == "openai":
                raise ConfigurationError(
                    "context_management is a Messages API feature; Chat Completions has none"
                )
            self.params = context_management_params(context_management, self.params)
        self.name = name
        self.tracer_provider = tracer_provider
        self.history_check = history_check
        self.approval_required = agent_rule(approval_required)
        if isinstance(self.approval_required, frozenset):
            unknown = sorted(self.approval_required - set(self.registry.names))
            if unknown:
                raise ConfigurationError(
                    f"approval_required names {', '.join(unknown)}, not tools of this agent"
                )
        check_provider(usage_limits, provider)
        self.usage_limits = usage_limits
        if isinstance(history_processors, (str, bytes)) or not all(
            callable(p) for p in history_processors
        ):
            raise ConfigurationError("history_processors must be a list of functions")
        self.history_processors = tuple(history_processors)
        self.output_type: Any = str if output_type is None else output_type
        self.output_mode: OutputMode = output_mode
        self.output_retries = output_retries
        self._output_schema = _schema_of(self.output_type)
        self._output_validators: list[OutputValidator] = []
        self.cache = cache
        self._cache_marker = cache_marker(cache)
        headers = self.params.get("extra_headers") or {}
        betas = self.params.get("betas") or ()
        betas = [betas] if isinstance(betas, str) else list(betas)
        self._files_beta = any(
            "files-api" in str(b) for b in [headers.get("anthropic-beta", ""), *betas]
        )
        """Whether requests opt into the Files API, which allows `file` sources."""

    def output_validator(self, validator: OutputValidator) -> OutputValidator:
        """Add a check of every run's output, usable as a decorator.

        The validator takes the output (and, first, a `RunContext` if it takes two
        parameters), sync or async, and returns the output, possibly changed; it raises
        `ModelRetry("...")` to send the model back with that message (counted against
        `output_retries`). Validators run in the order they were added, for runs of the
        agent's `output_type` (not for a run given its own). Any other exception a
        validator raises ends the run as it is, once the turn's calls are answered.

        ```python
        @agent.output_validator
        async def in_range(ctx: RunContext[Deps], forecast: Forecast) -> Forecast:
            if forecast.city not in ctx.deps.cities:
                raise ModelRetry(f"{forecast.city} is not one of our cities")
            return forecast
        ```
        """
        self._output_validators.append(check_validator(validator))
        return validator

    @overload
    async def run(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: None = None,
    ) -> RunResult[OutputT]: ...

    @overload
    async def run(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: type[RunOutputT],
    ) -> RunResult[RunOutputT]: ...

    @overload
    async def run(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: types.UnionType,
    ) -> RunResult[Any]: ...

    async def run(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
    ) -> RunResult[Any]:
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
                `messages` ends with that assistant message. Continue with
                `resume(result.state, results={tool_use_id: ...})`, or with a history
                that adds one user message answering every call of the turn, in order.
                Definitions are `ToolDefinition`s or wire dicts (JSON values), sent as
                they are.
            session: A `Session` (`agentloop.sessions`) to continue instead of `history`:
                its history is loaded, and what the run adds is appended when it ends
                (see docs/sessions.md).
            usage_limits: The most this run may spend, instead of the agent's
                `usage_limits`.
            output_type: This run's output type, instead of the agent's.

        Raises:
            ConfigurationError: the prompt or history is not of a usable type, or
                `history` and `session` were both given.
            HistoryError: `history` breaks an API rule (see `repair`).
            OutputValidationError: no valid output within `output_retries` (typed output).
            ProviderError: the API failed; `.result` holds the partial run.
            ToolCallFailed: a tool failed under `on_tool_error="stop"`.
            SessionConflict: another run appended to `session` first; nothing was
                stored, and `.result` holds this run's result.
            UsageLimitExceeded: the run went over a usage limit, or its next request
                would have; `.result` holds the partial run.
        """
        _, drive = await self._prepare(
            prompt, history, deps, external_tools, session, usage_limits, output_type
        )
        return await drive(None)

    @overload
    def run_stream(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        output_type: None = None,
    ) -> AbstractAsyncContextManager[RunStream[OutputT]]: ...

    @overload
    def run_stream(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        output_type: type[RunOutputT],
    ) -> AbstractAsyncContextManager[RunStream[RunOutputT]]: ...

    @overload
    def run_stream(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        output_type: types.UnionType,
    ) -> AbstractAsyncContextManager[RunStream[Any]]: ...

    @asynccontextmanager
    async def run_stream(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
    ) -> AsyncIterator[RunStream[Any]]:
        """Run as `run()` does, yielding typed events while the model streams.

        Tool calls start the moment their `tool_use` block is complete (unless the tool
        was made with `eager=False`). Leaving the `async with` block before the run ends,
        or cancelling a scope around it, cancels the run; `stream.result` then holds the
        partial result, whose history is valid to send again. With `session`, the run's
        messages are appended after `RunFinished`, before the iteration ends.

        ```python
        async with agent.run_stream("Weather in Paris?") as stream:
            async for event in stream:
                print(event)
        print(stream.result.text)
        ```
        """
        run, drive = await self._prepare(
            prompt, history, deps, external_tools, session, usage_limits, output_type
        )
        async with self._stream(run, drive) as stream:
            yield stream

    @asynccontextmanager
    async def _stream(
        self, run: RunState, drive: Callable[[Emit | None], Awaitable[RunResult[Any]]]
    ) -> AsyncIterator[RunStream[Any]]:
        """`run` driven (by `drive`) in a task, its events and result on the stream handle."""
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        stream: RunStream[Any] = RunStream(run, receive)
        failure: BaseException | None = None
        try:
            with receive:
                async with anyio.create_task_group() as group:
                    group.start_soon(stream._drive, drive, send)
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

    @overload
    def run_sync(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: None = None,
    ) -> RunResult[OutputT]: ...

    @overload
    def run_sync(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: type[RunOutputT],
    ) -> RunResult[RunOutputT]: ...

    @overload
    def run_sync(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: types.UnionType,
    ) -> RunResult[Any]: ...

    def run_sync(
        self,
        prompt: _Prompt = None,
        *,
        history: _History = None,
        deps: Any = None,
        external_tools: _External = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
    ) -> RunResult[Any]:
        """`run()` for scripts and notebooks without a running event loop (same arguments)."""
        return anyio.run(
            partial(
                self.run,
                prompt,
                history=history,
                deps=deps,
                external_tools=external_tools,
                session=session,
                usage_limits=usage_limits,
                output_type=output_type,
            )
        )

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        timeout: float | None = None,
        external_tools: _External = (),
    ) -> Tool:
        """This agent as a tool of another: each call runs it on the prompt the model writes.

        The sub-run gets the calling run's `deps`; its usage, cost and tool calls are added
        to the calling run's, and the calling run's `UsageLimits` bound it too (what is
        left of them, besides this agent's own). Its spans nest under the tool call's
        span (with a tracer provider both agents share), and cancelling the call (or the
        calling run) cancels it. A sub-run that fails or goes over a limit answers the
        call with an `is_error` result.

        The sub-run's id is the call's `RunContext.idempotency_key`, so the sub-agent's
        own calls have keys derived from it: the same keys when the call runs again (a
        durable run recovered after a crash), and other keys for every other call.

        A sub-run that pauses (its calls wait for approval, or are calls of its
        `external_tools`) pauses the calling run too: the calling run's result lists
        those calls in `approvals` and `pending`, each with the sub-agent call it is
        inside (`ApprovalRequest.via`), and its `state` holds the sub-run's. `resume`
        answers them by tool_use id, like the calling run's own: the sub-run goes on
        first, its answer is the call's result, then the calling run goes on.

        Args:
            name: The tool's name; by default the agent's `name`.
            description: What the model is told the tool does.
            timeout: Seconds a call may take; by default the calling agent's
                `tool_timeout`.
            external_tools: Tools announced to the sub-agent's model that the caller of
                the calling run runs (see `run`): a call of one pauses both runs.
        """
        from .subagents import agent_tool

        def start(prompt: str, deps: Any, limits: UsageLimits | None, run_id: str) -> RunState:
            return self._new_run(None, prompt, deps, external_tools, limits, run_id=run_id)

        return agent_tool(
            start,
            self._restored_run,
            partial(self._drive, emit=None),
            sub_tools=self.registry,
            name=name or self.name,
            description=description,
            timeout=timeout,
            limits=self.usage_limits,
        )

    async def resume(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        results: Mapping[str, Any] | None = None,
        deps: Any = None,
        session: Session | None = None,
    ) -> RunResult:
        """Continue a run that ended with calls waiting, from its `RunResult.state`.

        The state may come from another process (stored as JSON); this agent must be
        configured as the one that ran it (tools, model, limits). Approved calls run, with
        the edited input if one is given (validated again); denied ones are answered
        `is_error` with the reason; external calls are answered with `results`. The
        turn's results go to the model in the model's order and the loop goes on, as if
        the run had never stopped (its id, rounds, usage and tool-call log continue).

        ```python
        result = await agent.run("Refund order 42")
        while result.stop_reason == "approval_required":
            decisions = {a.tool_use_id: Approve() for a in result.approvals}
            result = await agent.resume(result.state, decisions=decisions)
        ```

        Args:
            state: `RunResult.state` of the paused run (as it was, or read back from JSON).
            decisions: `Approve()`, `Approve(input=...)` or `Deny("reason")` for every call
                in `RunResult.approvals`, by tool_use id.
            results: For every call of an external tool (`RunResult.pending`), by
                tool_use id: what the tool returned (as a tool's return value would be
                sent), a `ToolError` for a failure, or a `tool_result` block.
            deps: The run's `deps`, handed to tools again (they are not in the state).
            session: The session the paused run was in: `state` defaults to the paused
                run's state stored there, and what the resumed run adds is appended to it
                (as `run(..., session=...)` does).

        Raises:
            ResumeError: the state cannot be resumed (`InvalidStateError`,
                `StateVersionError`, `TamperedStateError`) or the answers do not fit the
                waiting calls (`DecisionError`); raised before anything runs.
            ConfigurationError: this agent lacks a tool the paused run needs.
            ProviderError, ToolCallFailed: as for `run`.
        """
        _, drive = await self._prepare_resume(state, decisions, results, deps, session)
        return await drive(None)

    @asynccontextmanager
    async def resume_stream(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        results: Mapping[str, Any] | None = None,
        deps: Any = None,
        session: Session | None = None,
    ) -> AsyncIterator[RunStream]:
        """`resume()` as a stream of events, as `run_stream()` is to `run()`.

        The answered calls of the paused turn are reported first (`ToolCallReady` for
        the approved ones, `ToolResultEvent` for every new result), then the loop's
        events follow. The errors of `resume()` are raised on entering the block.
        """
        run, drive = await self._prepare_resume(state, decisions, results, deps, session)
        async with self._stream(run, drive) as stream:
            yield stream

    async def _prepare_resume(
        self,
        state: Mapping[str, Any] | None,
        decisions: Mapping[str, Decision] | None,
        results: Mapping[str, Any] | None,
        deps: Any,
        session: Session | None,
    ) -> tuple[RunState, Callable[[Emit | None], Awaitable[RunResult]]]:
        """The resumed run and what drives it, as `_prepare` for a new one."""
        if session is None:
            if state is None:
                raise ConfigurationError(
                    "resume() needs the paused run's state (RunResult.state) or its session"
                )
            run = self._resumed_run(state, decisions, results, deps)
            return run, partial(self._drive, run)
        snapshot = await load_session(session, None)
        if state is None:
            state = snapshot.state
            if state is None:
                raise ConfigurationError(
                    f"session {session.session_id!r} holds no paused run to resume"
                )
        run = self._resumed_run(state, decisions, results, deps)
        return run, keeping(session, snapshot, run, partial(self._drive, run))

    def _resumed_run(
        self,
        state: Mapping[str, Any],
        decisions: Mapping[str, Decision] | None,
        results: Mapping[str, Any] | None,
        deps: Any,
    ) -> RunState:
        return self._restored_run(plan(state, decisions, results, self.registry), deps)

    def _restored_run(
        self, paused: PausedRun, deps: Any, usage_limits: UsageLimits | None = None
    ) -> RunState:
        """The run `paused` (answered by `plan`), ready to go on."""
        run = self._new_run(paused.messages, None, deps, paused.external, usage_limits)
        run.restore(paused)
        return run

    # -- the loop: agent -> turn -> one call function (ToolRegistry.run_call) -> history

    async def _loop(self, run: RunState, emit: Emit | None) -> StopReason:
        """Rounds of request, response and tool calls, until the model is done."""
        if run.paused is not None:
            ran = await finish_turn(run, self.registry, self._context(run, run.rounds), emit)
            self._check_failures(run, ran)
            if run.pause_reason is not None:  # a sub-run paused again
                return run.pause_reason
        forced = False  # compact whatever the size: the last request was refused for length
        while run.rounds < self.max_rounds:
            if self.history_check == "strict":
                run.history.check()
            request = self._build_request(run, await self._processed(run, forced))
            breach = await check_before_request(run.meter, run.usage, request, self.provider)
            if breach is not None:
                raise breach.error(run.end_early("usage_limit"))
            round_ = run.start_round()
            if emit is not None:
                await emit(RequestStarted(round_))
            registry = self.registry if run.output is None else run.output.registry
            turn_emit = emit
            if emit is not None and run.output is not None:
                turn_emit = PartialOutputs(run.output, emit, round_)
            turn = Turn(run, registry, self._context(run, round_), turn_emit)
            try:
                outcome = await turn.play(partial(self._request, run, request, emit))
            except ProviderError as exc:
                if forced or not self.history_processors or not is_length_refusal(exc):
                    raise
                run.log.info("run.compact_retry", error=str(exc))
                forced = True
                continue
            # A cancellation that reached only the tool calls (the response itself came in
            # whole) ends the run here, with every call answered.
            await anyio.lowlevel.checkpoint_if_cancelled()
            response = outcome.response
            if emit is not None:
                await emit(RoundFinished(round_, response.stop_reason, response.usage))
            self._check_failures(run, outcome.results)
            breach = run.meter.over(run.usage)
            if breach is not None:
                raise breach.error(run.end_early("usage_limit"))
            if run.pause_reason is not None:
                return run.pause_reason
            if run.stopping:
                return "cancelled"
            if run.output is not None:
                context = partial(RunContext, run.id, round_, "", "", run.deps)
                verdict = await run.output.after_turn(response, outcome.calls, run.history, context)
                if verdict == "done":
                    if emit is not None:
                        await emit(OutputReady(round_, run.output.value))
                    return "end_turn"
                if verdict == "retry":
                    continue
            stop = response.stop_reason
            if not forced and self.history_processors and is_length_refusal(stop_reason=stop):
                forced = True
                continue
            forced = False
            if stop not in CONTINUE or (stop not in RESUME and not outcome.calls):
                return stop or "end_turn"
        return "max_rounds"

    async def _prepare(
        self,
        prompt: str | Sequence[ContentBlock] | None,
        history: Iterable[Message | Mapping[str, Any]] | None,
        deps: Any,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]],
        session: Session | None,
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
    ) -> tuple[RunState, Callable[[Emit | None], Awaitable[RunResult[Any]]]]:
        """A new run and what drives it: the loop, in `session` when one is given."""
        if session is None:
            run = self._new_run(history, prompt, deps, external_tools, usage_limits, output_type)
            return run, partial(self._drive, run)
        snapshot = await load_session(session, history)
        messages = snapshot.messages
        run = self._new_run(messages, prompt, deps, external_tools, usage_limits, output_type)
        return run, keeping(session, snapshot, run, partial(self._drive, run))

    def _new_run(
        self,
        history: Iterable[Message | Mapping[str, Any]] | None,
        prompt: str | Sequence[ContentBlock] | None,
        deps: Any,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
        *,
        run_id: str | None = None,
    ) -> RunState:
        linter = HistoryLinter(
            thinking=self.thinking,
            tool_choice=self.tool_choice,
            allow_file_sources=self._files_beta,
        )
        history_ = History.start(history, prompt, linter)
        names = [name for t in external_tools if (name := _tool_name(t)) is not None]
        try:
            json.dumps(
                [t.to_wire() if isinstance(t, ToolDefinition) else t for t in external_tools]
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"external tool definitions must be JSON values (they go into the run's state): "
                f"{exc}"
            ) from exc
        clash = sorted(set(names) & set(self.registry.names))
        if clash:
            raise ConfigurationError(
                f"external tool name(s) {', '.join(clash)} are also tools of this agent; "
                "the model addresses tools by name"
            )
        if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
            raise ConfigurationError(
                f"usage_limits must be a UsageLimits, not {type(usage_limits).__name__}"
            )
        limits = usage_limits if usage_limits is not None else self.usage_limits
        check_provider(limits, self.provider)
        return RunState(
            history_,
            deps=deps,
            tool_concurrency=self.tool_concurrency,
            log=_log,
            tracing=tracing_for(self.tracer_provider),
            external=external_tools,
            external_names=frozenset(names),
            gate=Gate(
                self.registry,
                external_names=names,
                approval_required=self.approval_required,
            ),
            meter=Meter(limits, self.model, table_provider(_provider_name(self.provider))),
            output=self._output_run(output_type),
            run_id=run_id,
        )

    def _output_run(self, output_type: Any) -> OutputRun | None:
        """The typed output of a new run (None when its output is the text)."""
        schema = self._output_schema if output_type is None else _schema_of(output_type)
        if schema is None:
            return None
        return OutputRun(
            schema,
            resolve_mode(self.output_mode, self.provider),
            retries=self.output_retries,
            # Validators check the agent's output type; a run with its own has none.
            validators=self._output_validators if output_type is None else (),
            registry=self.registry,
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
            run.effects,
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
            with (
                structlog.contextvars.bound_contextvars(run_id=run.id),
                entered(RunScope(run, self.provider, self.model)),
            ):
                stop = await self._loop(run, emit)
                if run.output is not None:
                    run.output.check_end(stop)
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
        on_event: OnEvent,
    ) -> ModelResponse:
        """Send `request`; streamed to `on_event` when the run streams and the provider can."""
        started = time.perf_counter()
        send = partial(self._ask, request)
        stream = None if emit is None else on_event
        if run.tracing is None:
            response = await run.effects.model(request, run.rounds, send, stream)
        else:
            provider = _provider_name(self.provider)
            tracing = run.tracing
            with tracing.chat(provider, self.model, self.max_tokens, request.messages) as span:
                response = await run.effects.model(request, run.rounds, send, stream)
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

    async def _ask(self, request: ModelRequest, on_event: OnEvent | None) -> ModelResponse:
        """Send `request`, streamed to `on_event` when one is given and the provider can."""
        if on_event is not None and isinstance(self.provider, StreamingProvider):
            return await self.provider.stream(request, on_event)
        return await self.provider.complete(request)

    async def _processed(self, run: RunState, forced: bool) -> Sequence[Message]:
        """The messages to send: the history through the history processors, if any."""
        if not self.history_processors:
            return run.history.messages
        context = RunContext(run.id, run.rounds + 1, "", "", run.deps)
        messages = await apply_processors(
            self.history_processors, run.history.messages, context, forced=forced
        )
        if self.history_check == "strict":
            lint_history(
                messages,
                thinking=self.thinking,
                tool_choice=self.tool_choice,
                allow_file_sources=self._files_beta,
            )
        return messages

    def _build_request(
        self, run: RunState, messages: Sequence[Message] | None = None
    ) -> ModelRequest:
        registry = self.registry if run.output is None else run.output.registry
        request = ModelRequest(
            model=self.model,
            messages=run.history.messages if messages is None else messages,
            max_tokens=self.max_tokens,
            system=self.system,
            tools=[*registry.definitions(), *run.external]
            if run.external
            else (registry.definitions()),
            tool_choice=self.tool_choice,
            thinking=self.thinking,
            metadata=self.metadata,
            stop_sequences=self.stop_sequences,
            container=run.container,
            params=self.params,
            cache=self._cache_marker,
        )
        return request if run.output is None else run.output.shape(request)

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


def _tool_name(definition: ToolDefinition | Mapping[str, Any]) -> str | None:
    """An external tool's name; None for a tool kind without one, announced as it is."""
    try:
        return wire_tool_name(definition)
    except ConfigurationError as exc:
        raise ConfigurationError(f"external tool: {exc}") from None


def _provider_name(provider: Provider) -> str:
    """The provider's name for traces (`gen_ai.provider.name`)."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) else type(provider).__name__


def _schema_of(output_type: Any) -> OutputSchema | None:
    """The output schema of a type (None for `str`: the output is the text)."""
    return None if output_type is str else output_schema(output_type)
