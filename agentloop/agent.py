"""The agent: one configuration, from which any number of runs start.

`Agent(...)` checks its options into an `AgentConfig` and gathers its tools in a
`ToolRegistry`. `start()` makes a `Run` (agentloop/run.py), which drives the loop; `run`,
`run_sync`, `run_stream`, `resume`, `resume_stream` and `as_tool` are thin layers over
it. An agent keeps no per-run state, so one serves any number of concurrent runs.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, overload

from typing_extensions import Unpack

from .calls import ToolDefinition
from .config import DEFAULT_MODEL, AgentConfig, AgentOptions, check_deps
from .context import DepsT
from .errors import ConfigurationError
from .layers import Prompt, RunLayers, RunOutputT
from .options import StartOptions
from .output import OutputValidator, check_validator
from .providers.base import Provider
from .registry import ToolRegistry
from .result import OutputT
from .run import Run
from .server_tools import ServerTool
from .tools import Tool

__all__ = ("DEFAULT_MODEL", "Agent")


class Agent(RunLayers[DepsT, OutputT]):
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
        self.deps_type = deps_type
        """The type of its runs' `deps` (None: any)."""
        self.config.check_tools(self.registry)
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
        check_deps(options.get("deps"), self.deps_type)
        return Run(
            self.config, self.registry, self._validators, prompt, output_type=output_type, **options
        )

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
