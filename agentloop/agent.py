"""The agent: one configuration, from which any number of runs start.

`Agent(...)` checks its options into an `AgentConfig` and gathers its tools in a
`ToolRegistry`. `start()` makes a `Run` (agentloop/run.py), which drives the loop; `run`,
`run_sync`, `run_stream`, `resume`, `resume_stream` and `as_tool` are thin layers over
it. An agent keeps no per-run state, so one serves any number of concurrent runs.
"""

from __future__ import annotations

import types
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, Generic, Literal, TypedDict, TypeVar, overload

import anyio
from opentelemetry.trace import TracerProvider
from typing_extensions import Unpack

from .approval import ApprovalRule, Decision
from .calls import ToolDefinition
from .compaction import HistoryProcessor
from .config import DEFAULT_MODEL, AgentConfig
from .effects import Effects
from .errors import ConfigurationError
from .limits import UsageLimits
from .messages import ContentBlock, Message
from .output import OutputMode, OutputValidator, check_validator
from .providers.base import Provider
from .providers.caching import CacheSetting
from .registry import ToolRegistry
from .result import OutputT, RunResult
from .run import Run
from .sessions.base import Session
from .tools import Tool
from .turn import Emit

__all__ = ("DEFAULT_MODEL", "Agent", "RunOptions")

RunOutputT = TypeVar("RunOutputT")
"""The output type of one run given `output_type=`, instead of the agent's."""
Prompt = str | Sequence[ContentBlock] | None


class RunOptions(TypedDict, total=False):
    """What a run may be given besides its prompt (`start`, `run`, `run_stream`, ...)."""

    history: Iterable[Message | Mapping[str, Any]] | None
    """Earlier messages (e.g. a previous `RunResult.messages`)."""
    deps: Any
    """Any object; tools receive it as `RunContext.deps`."""
    external_tools: Sequence[ToolDefinition | Mapping[str, Any]]
    """Tools announced to the model that this run does not run: their calls are handed
    back (`stop_reason="tool_use"`, `RunResult.pending`; see docs/approval.md)."""
    session: Session | None
    """A `Session` to continue instead of `history`; what the run adds is appended."""
    usage_limits: UsageLimits | None
    """The most this run may spend, instead of the agent's `usage_limits`."""


class Agent(Generic[OutputT]):
    """Runs the model and its tools until the model is done.

    One `Agent` holds configuration only (`agent.config`, `agent.registry`); every run
    keeps its own state. It is generic in the type of its runs' `result.output`
    (`Agent[Forecast]` for `output_type=Forecast`).
    """

    def __init__(  # noqa: D417 (the options are documented on AgentConfig)
        self,
        model: str = DEFAULT_MODEL,
        *,
        provider: Provider | None = None,
        client: Any = None,
        tools: Iterable[Tool | Callable[..., Any]] | ToolRegistry = (),
        system: str | Sequence[Mapping[str, Any]] | None = None,
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
        """Configure an agent: each option is a field of `AgentConfig`, documented there.

        Args:
            model: Model name sent with each request.
            provider: Where requests go; by default an `AnthropicProvider` over `client`.
            client: An SDK client to send with: `anthropic.AsyncAnthropic` (or another
                client class of the SDK: Bedrock, Vertex, ...) or `openai.AsyncOpenAI`
                (Chat Completions, see `OpenAIChatProvider`); ignored with `provider`.
            tools: Tools (functions are wrapped with `tool`), or a ready `ToolRegistry`.
            **options: The other fields of `AgentConfig`.

        Raises:
            ConfigurationError: an option has a value that cannot work; nothing is
                checked later that could have been checked here.
        """
        if tools is None or isinstance(tools, (str, bytes, Mapping)):
            raise ConfigurationError(
                f"tools must be a list of tools or functions, not {type(tools).__name__}"
            )
        if provider is None:
            from .providers import provider_for

            provider = provider_for(client)
        self.config = AgentConfig(
            provider=provider,
            model=model,
            system=system,
            max_rounds=max_rounds,
            max_tokens=max_tokens,
            tool_concurrency=tool_concurrency,
            tool_timeout=tool_timeout,
            tool_limiter=tool_limiter,
            tool_choice=tool_choice,
            thinking=thinking,
            metadata=metadata,
            stop_sequences=stop_sequences,
            on_tool_error=on_tool_error,
            params=params or {},
            context_management=context_management,
            name=name,
            tracer_provider=tracer_provider,
            history_check=history_check,
            approval_required=approval_required,
            usage_limits=usage_limits,
            history_processors=history_processors,
            output_type=str if output_type is None else output_type,
            output_mode=output_mode,
            output_retries=output_retries,
            cache=cache,
        )
        """The agent's options, checked (see `AgentConfig`)."""
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        """The agent's tools."""
        required = self.config.approval_required
        if isinstance(required, frozenset) and (
            unknown := sorted(required - set(self.registry.names))
        ):
            raise ConfigurationError(
                f"approval_required names {', '.join(unknown)}, not tools of this agent"
            )
        self._validators: list[OutputValidator] = []

    @property
    def model(self) -> str:
        """The model the agent's requests go to (`config.model`)."""
        return self.config.model

    @property
    def provider(self) -> Provider:
        """Where the agent's requests go (`config.provider`)."""
        return self.config.provider

    @property
    def name(self) -> str:
        """The agent's name (`config.name`)."""
        return self.config.name

    @property
    def output_type(self) -> Any:
        """What the agent's runs end with (`config.output_type`)."""
        return self.config.output_type

    def output_validator(self, validator: OutputValidator) -> OutputValidator:
        """Add a check of every run's output, usable as a decorator.

        The validator takes the output (and, first, a `RunContext` if it takes two
        parameters), sync or async, and returns the output, possibly changed; it raises
        `ToolError("...")` to send the model back with that message (counted against
        `output_retries`). Validators run in the order they were added, for runs of the
        agent's `output_type` (not for a run given its own). Any other exception a
        validator raises ends the run as it is, once the turn's calls are answered.

        ```python
        @agent.output_validator
        async def in_range(ctx: RunContext[Deps], forecast: Forecast) -> Forecast:
            if forecast.city not in ctx.deps.cities:
                raise ToolError(f"{forecast.city} is not one of our cities")
            return forecast
        ```
        """
        self._validators.append(check_validator(validator))
        return validator

    # -- the run you hold

    def start(
        self,
        prompt: Prompt = None,
        *,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        output_type: Any = None,
        state: Mapping[str, Any] | None = None,
        decisions: Mapping[str, Decision] | None = None,
        results: Mapping[str, Any] | None = None,
        stream: bool = True,
        on_event: Emit | None = None,
        effects: Effects | None = None,
        run_id: str | None = None,
    ) -> Run[Any]:
        """A run of this agent, to hold: `async with agent.start(...) as run:` drives it.

        Nothing happens until the run is entered; its options are checked then (see
        `Run`). The run's result is `run.result` at any moment, after a cancellation
        too (see docs/runs.md).

        Args:
            prompt: The new user input; `None` continues `history` as it is (for
                example after `max_rounds`).
            history: Earlier messages (e.g. a previous `RunResult.messages`).
            deps: Any object; tools receive it as `RunContext.deps`.
            external_tools: Tools announced to the model that this run does not run:
                when the model calls one, the run runs the turn's other calls, then ends
                with `stop_reason="tool_use"`, the calls in `RunResult.pending` and its
                own results in `RunResult.held`. Continue with `resume(result.state,
                results={tool_use_id: ...})`. `ToolDefinition`s or wire dicts.
            session: A `Session` (`agentloop.sessions`) to continue instead of
                `history`; what the run adds is appended when it ends.
            usage_limits: The most this run may spend, instead of the agent's.
            output_type: This run's output type, instead of the agent's.
            state: A paused run's `RunResult.state`, to continue instead of a prompt (as
                `resume` does), with `decisions` and `results` answering its calls.
            decisions: See `resume`.
            results: See `resume`.
            stream: Send each model request streamed (when the provider can), so the
                run's events include text and input deltas as they arrive, and tool calls
                start as soon as their block is complete; False sends plain requests.
            on_event: Awaited with each of the run's own events as it happens, before the
                run goes on (a durable engine records them in order); iterating the run
                gives the same events.
            effects: Where the run's model requests and tool calls are performed (a
                durable engine's `agentloop.effects.Effects`); by default here and now.
            run_id: The run's id, instead of a new one (an engine running a run again
                gives the same id, so its calls keep their idempotency keys).
        """
        resuming = state is not None or decisions is not None or results is not None
        return Run(
            self.config,
            self.registry,
            self._validators,
            prompt=prompt,
            history=history,
            deps=deps,
            external_tools=external_tools,
            session=session,
            usage_limits=usage_limits,
            output_type=output_type,
            paused=(state, decisions, results) if resuming else None,
            stream=stream,
            on_event=on_event,
            effects=effects,
            run_id=run_id,
        )

    # -- thin layers over `start`

    @overload
    async def run(
        self, prompt: Prompt = None, *, output_type: None = None, **options: Unpack[RunOptions]
    ) -> RunResult[OutputT]: ...
    @overload
    async def run(
        self, prompt: Prompt = None, *, output_type: type[RunOutputT], **options: Unpack[RunOptions]
    ) -> RunResult[RunOutputT]: ...
    @overload
    async def run(
        self, prompt: Prompt = None, *, output_type: types.UnionType, **options: Unpack[RunOptions]
    ) -> RunResult[Any]: ...

    async def run(
        self, prompt: Prompt = None, *, output_type: Any = None, **options: Unpack[RunOptions]
    ) -> RunResult[Any]:
        """Run the model and its tools until the model stops or a limit is reached.

        Takes what `start` takes (`history`, `deps`, `external_tools`, `session`,
        `usage_limits`, `output_type`; see `RunOptions`). A cancellation around it
        cancels the run and goes on, without a result: to keep the partial result of a
        run you may cancel, run it through `start` (docs/runs.md).

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
        async with self.start(prompt, output_type=output_type, stream=False, **options) as run:
            pass
        return run.result

    @overload
    def run_sync(
        self, prompt: Prompt = None, *, output_type: None = None, **options: Unpack[RunOptions]
    ) -> RunResult[OutputT]: ...
    @overload
    def run_sync(
        self, prompt: Prompt = None, *, output_type: type[RunOutputT], **options: Unpack[RunOptions]
    ) -> RunResult[RunOutputT]: ...
    @overload
    def run_sync(
        self, prompt: Prompt = None, *, output_type: types.UnionType, **options: Unpack[RunOptions]
    ) -> RunResult[Any]: ...

    def run_sync(
        self, prompt: Prompt = None, *, output_type: Any = None, **options: Unpack[RunOptions]
    ) -> RunResult[Any]:
        """`run()` for scripts and notebooks without a running event loop (same arguments)."""
        return anyio.run(partial(self.run, prompt, output_type=output_type, **options))

    @overload
    def run_stream(
        self, prompt: Prompt = None, *, output_type: None = None, **options: Unpack[RunOptions]
    ) -> AbstractAsyncContextManager[Run[OutputT]]: ...
    @overload
    def run_stream(
        self, prompt: Prompt = None, *, output_type: type[RunOutputT], **options: Unpack[RunOptions]
    ) -> AbstractAsyncContextManager[Run[RunOutputT]]: ...
    @overload
    def run_stream(
        self, prompt: Prompt = None, *, output_type: types.UnionType, **options: Unpack[RunOptions]
    ) -> AbstractAsyncContextManager[Run[Any]]: ...

    @asynccontextmanager
    async def run_stream(
        self, prompt: Prompt = None, *, output_type: Any = None, **options: Unpack[RunOptions]
    ) -> AsyncIterator[Run[Any]]:
        """`start()`, streamed, as a block: leaving it before the run ends cancels the run.

        ```python
        async with agent.run_stream("Weather in Paris?") as run:
            async for event in run:
                print(event)
        print(run.result.text)
        ```
        """
        async with self._cancelled_on_exit(
            self.start(prompt, output_type=output_type, **options)
        ) as run:
            yield run

    async def resume(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        results: Mapping[str, Any] | None = None,
        deps: Any = None,
        session: Session | None = None,
    ) -> RunResult[Any]:
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
                run's state stored there, and what the resumed run adds is appended to it.

        Raises:
            ResumeError: the state cannot be resumed (`InvalidStateError`,
                `StateVersionError`, `TamperedStateError`) or the answers do not fit the
                waiting calls (`DecisionError`); raised before anything runs.
            ConfigurationError: this agent lacks a tool the paused run needs.
            ProviderError, ToolCallFailed: as for `run`.
        """
        run = self._resumed(state, decisions, results, deps, session, stream=False)
        async with run:
            pass
        return run.result

    @asynccontextmanager
    async def resume_stream(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        results: Mapping[str, Any] | None = None,
        deps: Any = None,
        session: Session | None = None,
    ) -> AsyncIterator[Run[Any]]:
        """`resume()` as a stream of events, as `run_stream()` is to `run()`.

        The answered calls of the paused turn are reported first (`ToolCallReady` for
        the approved ones, `ToolResultEvent` for every new result), then the loop's
        events follow. The errors of `resume()` are raised on entering the block.
        """
        run = self._resumed(state, decisions, results, deps, session, stream=True)
        async with self._cancelled_on_exit(run) as held:
            yield held

    def _resumed(
        self,
        state: Mapping[str, Any] | None,
        decisions: Mapping[str, Decision] | None,
        results: Mapping[str, Any] | None,
        deps: Any,
        session: Session | None,
        *,
        stream: bool,
    ) -> Run[Any]:
        """The run that continues a paused one (the state, or the one in `session`)."""
        return Run(
            self.config,
            self.registry,
            self._validators,
            prompt=None,
            history=None,
            deps=deps,
            external_tools=(),
            session=session,
            usage_limits=None,
            output_type=None,
            paused=(state, decisions, results),
            stream=stream,
        )

    @asynccontextmanager
    async def _cancelled_on_exit(self, run: Run[Any]) -> AsyncIterator[Run[Any]]:
        """`run` entered; leaving the block before it ends cancels it (`run_stream`)."""
        async with run:
            try:
                yield run
            finally:
                run.cancel()

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Tool:
        """This agent as a tool of another: each call runs it on the prompt the model writes.

        The sub-run gets the calling run's `deps`; its usage, cost and tool calls are added
        to the calling run's, and the calling run's `UsageLimits` bound it too (what is
        left of them, besides this agent's own). Its spans nest under the tool call's
        span (with a tracer provider both agents share), and cancelling the call (or the
        calling run) cancels it. A sub-run that fails or goes over a limit answers the
        call with an `is_error` result.

        Args:
            name: The tool's name; by default the agent's `name`.
            description: What the model is told the tool does.
            timeout: Seconds a call may take; by default the calling agent's
                `tool_timeout`.
        """
        from .subagents import agent_tool

        return agent_tool(
            partial(self.start, stream=False),
            name=name or self.config.name,
            description=description,
            timeout=timeout,
            limits=self.config.usage_limits,
        )
