"""The agent: one configuration, from which any number of runs start.

`Agent(...)` checks its options into an `AgentConfig` and gathers its tools in a
`ToolRegistry`. `start()` makes a `Run` (agentloop/run.py), which drives the loop; `run`,
`run_sync`, `run_stream`, `resume`, `resume_stream` and `as_tool` are thin layers over
it. An agent keeps no per-run state, so one serves any number of concurrent runs.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import anyio
from typing_extensions import Unpack

from .calls import ToolDefinition
from .config import DEFAULT_MODEL, AgentConfig, AgentOptions
from .context import DepsT
from .errors import ConfigurationError
from .messages import ContentBlock
from .options import ResumeOptions, RunOptions, StartOptions
from .output import OutputValidator, check_validator
from .providers.base import Provider
from .registry import ToolRegistry
from .result import OutputT, RunResult
from .run import Run, cancelled_on_exit
from .server_tools import ServerTool, check_announced
from .tools import Tool

if TYPE_CHECKING:
    from .batches import BatchOutcome, BatchStore

__all__ = ("DEFAULT_MODEL", "Agent")

RunOutputT = TypeVar("RunOutputT")
"""The output type of one run given `output_type=`, instead of the agent's."""
Prompt = str | Sequence[ContentBlock] | None


class Agent(Generic[DepsT, OutputT]):
    """Runs the model and its tools until the model is done.

    One `Agent` holds configuration only (`agent.config`, `agent.registry`); every run
    keeps its own state. It is generic in the type of the `deps` its runs take and in the
    type of their `result.output`: `Agent(deps_type=Shop, output_type=Forecast)` is an
    `Agent[Shop, Forecast]`, whose `run(deps=...)` a type checker holds to a `Shop`. With
    neither, it is an `Agent[Any, str]`.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        provider: Provider | None = None,
        client: Any = None,
        tools: Iterable[Tool | ServerTool | Callable[..., Any]] | ToolRegistry = (),
        deps_type: type[DepsT] | None = None,
        output_type: type[OutputT] | types.UnionType | None = None,
        **options: Unpack[AgentOptions],
    ) -> None:
        """Configure an agent.

        Args:
            model: Model name sent with each request.
            provider: Where requests go; by default an `AnthropicProvider` over `client`.
            client: An SDK client to send with: `anthropic.AsyncAnthropic` (or another
                client class of the SDK: Bedrock, Vertex, ...) or `openai.AsyncOpenAI`
                (Chat Completions, see `OpenAIChatProvider`); ignored with `provider`.
            tools: Tools (functions are wrapped with `tool`) and tools the API runs
                itself (`WebSearch`, `WebFetch`, `CodeExecution`, `ToolSearch`), or a
                ready `ToolRegistry`.
            deps_type: The type of the `deps` every run takes (`run(deps=...)`), which
                the tools read as `RunContext[DepsType]`: a type checker holds the runs'
                `deps` to it, and a run given `deps` of another class is refused with a
                `ConfigurationError` before it starts. None: any `deps`.
            output_type: What a run ends with, validated, as `result.output` (see
                `AgentConfig.output_type`); the final text by default.
            **options: The other options: `system`, `max_rounds`, `tool_concurrency`,
                `tool_timeout`, ... (every field of `AgentConfig`, documented there).

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
        listed = () if isinstance(tools, ToolRegistry) else list(tools)
        server_tools = [t for t in listed if isinstance(t, ServerTool)]
        self.config = AgentConfig(
            provider=provider,
            model=model,
            output_type=str if output_type is None else output_type,
            server_tools=server_tools,
            **options,
        )
        """The agent's options, checked (see `AgentConfig`)."""
        self.registry = (
            tools
            if isinstance(tools, ToolRegistry)
            else ToolRegistry(t for t in listed if not isinstance(t, ServerTool))
        )
        """The agent's tools (those it runs itself; `config.server_tools` the others)."""
        deferred = [t.name for t in self.registry if t.defer_loading]
        check_announced(self.registry.names, deferred, self.config.request_params)
        self.deps_type = deps_type
        """The type of its runs' `deps` (None: any)."""
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

    if not TYPE_CHECKING:  # a type checker points to `config` instead

        def __getattr__(self, name: str) -> Any:
            """Deprecated: an option read on the agent (`agent.max_rounds`): read `config`."""
            if name in AgentConfig.__dataclass_fields__:
                warnings.warn(
                    f"agent.{name} is deprecated: read agent.config.{name}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(self.config, name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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

    @overload
    def start(
        self,
        prompt: Prompt = None,
        *,
        output_type: None = None,
        **options: Unpack[StartOptions[DepsT]],
    ) -> Run[OutputT]: ...
    @overload
    def start(
        self,
        prompt: Prompt = None,
        *,
        output_type: type[RunOutputT],
        **options: Unpack[StartOptions[DepsT]],
    ) -> Run[RunOutputT]: ...
    @overload
    def start(
        self,
        prompt: Prompt = None,
        *,
        output_type: types.UnionType,
        **options: Unpack[StartOptions[DepsT]],
    ) -> Run[Any]: ...

    def start(
        self,
        prompt: Prompt = None,
        *,
        output_type: Any = None,
        **options: Unpack[StartOptions[DepsT]],
    ) -> Run[Any]:
        """A run of this agent, to hold: `async with agent.start(...) as run:` drives it.

        Nothing happens until the run is entered (see `Run`, which documents the
        options: `history`, `deps`, `tools`, `external_tools`, `session`, `usage_limits`, and
        `state` with `decisions` and `results` to resume a paused run). `run.result` is
        the run's result at any moment, after a cancellation too (docs/runs.md).

        ```python
        async with agent.start("Weather in Paris?") as run:
            async for event in run:
                print(event)
        print(run.result.text, run.usage)
        ```
        """
        self._check_deps(options.get("deps"))
        return Run(
            self.config, self.registry, self._validators, prompt, output_type=output_type, **options
        )

    def _check_deps(self, deps: object) -> None:
        """Refuse `deps` that are not of the agent's `deps_type` (when that is a class)."""
        expected = self.deps_type
        if deps is None or expected is None or not isinstance(expected, type):
            return
        try:
            fits = isinstance(deps, expected)
        except TypeError:  # a Protocol that is not runtime-checkable, say: not checkable
            return
        if not fits:
            raise ConfigurationError(
                f"deps must be a {expected.__qualname__} (the agent's deps_type), "
                f"not {type(deps).__qualname__}"
            )

    # -- thin layers over `start`

    @overload
    async def run(
        self,
        prompt: Prompt = None,
        *,
        output_type: None = None,
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[OutputT]: ...
    @overload
    async def run(
        self,
        prompt: Prompt = None,
        *,
        output_type: type[RunOutputT],
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[RunOutputT]: ...
    @overload
    async def run(
        self,
        prompt: Prompt = None,
        *,
        output_type: types.UnionType,
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[Any]: ...

    async def run(
        self,
        prompt: Prompt = None,
        *,
        output_type: Any = None,
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[Any]:
        """Run the model and its tools until the model stops or a limit is reached.

        Takes what `start` takes (`history`, `deps`, `tools` for this run alone,
        `external_tools`, `session`, `usage_limits`, `output_type`; see `RunOptions`).
        A cancellation around it cancels the run and goes on, without a result: to keep
        the partial result of a run you may cancel, run it through `start`
        (docs/runs.md).

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

    async def count_tokens(
        self, prompt: Prompt = None, *, output_type: Any = None, **options: Unpack[StartOptions]
    ) -> int:
        """The input tokens the request a run would send first uses, counted by the API.

        Takes what `start` takes (`history` or `session`, `tools`, `external_tools`,
        `deps`, `output_type`, ...): the request counted is the one that run would send
        (system prompt, tools, history and `prompt`, with cache markers), through the
        Messages API's count endpoint; nothing is sent to the model. `Run.count_tokens`
        does the same for a run you hold, which can then be entered.

        ```python
        tokens = await agent.count_tokens("Summarise this file", history=earlier)
        ```

        Raises:
            ConfigurationError: the provider cannot count tokens (Chat Completions), or
                an option is not usable (as for `run`).
            ProviderError: the count endpoint failed.
        """
        return await self.start(prompt, output_type=output_type, **options).count_tokens()

    async def run_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        job: str = "batch",
        store: BatchStore | None = None,
        poll_interval: float = 30.0,
        **options: Unpack[RunOptions],
    ) -> list[BatchOutcome]:
        """Run each of `prompts`, every round's requests sent together as a message batch.

        The runs go round by round: once every run still going has its next request
        ready, those requests go out as one batch of the Message Batches API (billed at
        half price), and each run gets its response when the batch has ended; tool
        calls run here, in parallel, as in `run`. Each response is priced at the batch
        rate (`Usage.batch_requests`). See docs/batches.md.

        Args:
            prompts: One run's prompt each.
            job: The job's name in `store`: run the same job again (same prompts, same
                options) after a crash to pick its pending batch up.
            store: Where the runs' responses and tool results, and the pending batches'
                ids, are kept (`BatchStore("jobs.db")`); by default in memory, and a
                batch left pending when the job stops is cancelled.
            poll_interval: Seconds between two looks at a pending batch.
            **options: What `run` takes besides the prompt (`history`, `deps`, `tools`,
                `usage_limits`, `output_type`, ...), the same for every run.

        Returns:
            Per prompt, in order: the run's `RunResult`, or the `AgentloopError` that
            ended it (a request of a batch that errored, a usage limit, ...).

        Raises:
            ConfigurationError: the provider cannot send batches (only the Anthropic one
                can), or an argument is not usable.
        """
        from .batches import run_batch

        return await run_batch(
            self.start,
            self.provider,
            prompts,
            job=job,
            store=store,
            poll_interval=poll_interval,
            **options,
        )

    @overload
    def run_sync(
        self,
        prompt: Prompt = None,
        *,
        output_type: None = None,
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[OutputT]: ...
    @overload
    def run_sync(
        self,
        prompt: Prompt = None,
        *,
        output_type: type[RunOutputT],
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[RunOutputT]: ...
    @overload
    def run_sync(
        self,
        prompt: Prompt = None,
        *,
        output_type: types.UnionType,
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[Any]: ...

    def run_sync(
        self,
        prompt: Prompt = None,
        *,
        output_type: Any = None,
        **options: Unpack[RunOptions[DepsT]],
    ) -> RunResult[Any]:
        """`run()` for scripts and notebooks without a running event loop (same arguments)."""
        return anyio.run(partial(self.run, prompt, output_type=output_type, **options))

    @overload
    def run_stream(
        self,
        prompt: Prompt = None,
        *,
        output_type: None = None,
        **options: Unpack[RunOptions[DepsT]],
    ) -> AbstractAsyncContextManager[Run[OutputT]]: ...
    @overload
    def run_stream(
        self,
        prompt: Prompt = None,
        *,
        output_type: type[RunOutputT],
        **options: Unpack[RunOptions[DepsT]],
    ) -> AbstractAsyncContextManager[Run[RunOutputT]]: ...
    @overload
    def run_stream(
        self,
        prompt: Prompt = None,
        *,
        output_type: types.UnionType,
        **options: Unpack[RunOptions[DepsT]],
    ) -> AbstractAsyncContextManager[Run[Any]]: ...

    @asynccontextmanager
    async def run_stream(
        self,
        prompt: Prompt = None,
        *,
        output_type: Any = None,
        **options: Unpack[RunOptions[DepsT]],
    ) -> AsyncIterator[Run[Any]]:
        """`start()`, streamed, as a block: leaving it before the run ends cancels the run.

        ```python
        async with agent.run_stream("Weather in Paris?") as run:
            async for event in run:
                print(event)
        print(run.result.text)
        ```
        """
        async with cancelled_on_exit(self.start(prompt, output_type=output_type, **options)) as run:
            yield run

    async def resume(
        self, state: Mapping[str, Any] | None = None, **options: Unpack[ResumeOptions[DepsT]]
    ) -> RunResult[Any]:
        """Continue a run that ended with calls waiting, from its `RunResult.state`.

        The state may come from another process (stored as JSON); this agent must be
        configured as the one that ran it. Approved calls run (with the edited input, if
        one is given); denied ones are answered `is_error` with the reason; external
        calls are answered with `results`; then the loop goes on as if the run had never
        stopped (see docs/approval.md). `agent.start(state=...)` holds such a run.

        Args:
            state: `RunResult.state` of the paused run (as it was, or read back from JSON);
                with a `session`, by default the paused run's state stored there.
            **options: `decisions` (`Approve()`, `Approve(input=...)` or `Deny("reason")`
                for every call in `RunResult.approvals`, by tool_use id), `results` (for
                every call of an external tool, `RunResult.pending`: what it returned, a
                `ToolError`, or a `tool_result` block), `deps` (handed to tools again;
                they are not in the state), `tools` (the tools the paused run was given
                for itself alone, given again: they are not in the state either),
                `session` (the paused run's, which what the resumed run adds is
                appended to).

        Raises:
            ResumeError: the state cannot be resumed (`InvalidStateError`,
                `StateVersionError`, `TamperedStateError`) or the answers do not fit the
                waiting calls (`DecisionError`); raised before anything runs.
            ConfigurationError: this agent lacks a tool the paused run needs.
            ProviderError, ToolCallFailed: as for `run`.
        """
        async with self._resuming(state, options, stream=False) as run:
            pass
        return run.result

    @asynccontextmanager
    async def resume_stream(
        self, state: Mapping[str, Any] | None = None, **options: Unpack[ResumeOptions[DepsT]]
    ) -> AsyncIterator[Run[Any]]:
        """`resume()` as a stream of events, as `run_stream()` is to `run()`.

        The answered calls of the paused turn are reported first (`ToolCallReady` for
        the approved ones, `ToolResultEvent` for every new result), then the loop's
        events follow. The errors of `resume()` are raised on entering the block.
        """
        async with cancelled_on_exit(self._resuming(state, options, stream=True)) as run:
            yield run

    def _resuming(
        self, state: Mapping[str, Any] | None, options: ResumeOptions[DepsT], *, stream: bool
    ) -> Run[Any]:
        """The run that continues a paused one (from `state`, or the one in its session)."""
        # Answers are always given (none is an empty set), so the run resumes, and a
        # waiting call left unanswered is refused as such.
        if options.get("decisions") is None and options.get("results") is None:
            options = {**options, "decisions": {}}
        return self.start(state=state, stream=stream, **options)

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        timeout: float | None = None,
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
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

        return agent_tool(
            partial(self.start, stream=False),
            sub_tools=self.registry,
            external_tools=external_tools,
            name=name or self.config.name,
            description=description,
            timeout=timeout,
            limits=self.config.usage_limits,
        )
