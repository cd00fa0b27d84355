"""The entry points of an agent besides `start`: each a thin layer over it.

`run`, `run_sync`, `run_stream`, `resume`, `resume_stream`, `count_tokens` and
`run_batch` all start a `Run` (agentloop/run.py) through `start` and drive it their
way. `Agent` (agentloop/agent.py) inherits them; this module only keeps agent.py short.
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import anyio
from typing_extensions import Unpack

from .context import DepsT
from .messages import ContentBlock
from .options import ResumeOptions, RunOptions, StartOptions
from .result import OutputT, RunResult
from .run import Run, cancelled_on_exit

if TYPE_CHECKING:
    from .batches import BatchOutcome, BatchStore
    from .providers.base import Provider

__all__ = ("Prompt", "RunLayers")

RunOutputT = TypeVar("RunOutputT")
"""The output type of one run given `output_type=`, instead of the agent's."""
Prompt = str | Sequence[ContentBlock] | None
"""A run's prompt: text, content blocks, or None (a run given only a history)."""


class RunLayers(Generic[DepsT, OutputT]):
    """The entry points every `Agent` has besides `start`, each a thin layer over it."""

    @property
    def provider(self) -> Provider:
        """Where the agent's requests go."""
        raise NotImplementedError

    def start(
        self,
        prompt: Prompt = None,
        *,
        output_type: Any = None,
        **options: Unpack[StartOptions[DepsT]],
    ) -> Run[Any]:
        """A run to hold (`Agent.start`)."""
        raise NotImplementedError

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

        Batches are billed at half price; tool calls run here, in parallel, as in `run`
        (docs/batches.md). `job` names the job in `store` (`BatchStore("jobs.db")`; by
        default in memory) so that running it again after a crash picks its pending
        batch up; `poll_interval` is the seconds between two looks at a pending batch;
        `options` are what `run` takes besides the prompt, the same for every run.

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
