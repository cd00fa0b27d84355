"""A run you can hold: `Agent.start()` returns a `Run`, which drives the loop.

`async with agent.start(prompt) as run:` drives the run in a task of its own; `async for
event in run` reads its events as they happen; `run.result` is its `RunResult` at any
moment (partial while it runs, after a failure and after a cancellation, final when it
is done); `run.cancel()` stops it. Every entry point (`run`, `run_stream`, `resume`,
sub-agents, the gateway, the durable engines) is a thin layer over it.

The loop is three named steps a round: `_next_request` (check the history, compact it,
build the request, check the limits), `_play_turn` (send it, run and answer the calls)
and `_decide` (go on, or why the run stops).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any, Generic

import anyio
import anyio.lowlevel
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .calls import ToolDefinition
from .capabilities.base import Capability, Chain, check_capabilities
from .compaction import Compaction
from .config import AgentConfig
from .context import RunContext
from .effects import CallTasks, Effects, task_group_for
from .errors import AgentloopError, ConfigurationError, ProviderError
from .events import (
    Event,
    OutputReady,
    RequestStarted,
    RoundFinished,
    RunFinished,
    RunStarted,
)
from .history import last_user_input
from .limits import Spent, UsageLimits, check_before_request
from .lint import lint_history
from .messages import ContentBlock, Message
from .options import ResumeOptions, RunOptions, StartOptions
from .output import OutputValidator
from .partial import PartialOutputs
from .progress import events_to
from .providers.base import ModelRequest, ModelResponse, provider_name
from .registry import ToolRegistry, reraise_base_exception
from .request import announced_tools, build_request, counting_provider, send_request
from .result import OutputT, RunResult, StopReason, Usage
from .resume import plan
from .runstate import RunState, new_state, run_registry
from .sessions.base import Session, SessionSnapshot
from .sessions.runs import keeping, load_session
from .state import PausedRun
from .tools import Tool
from .tracing import record_run
from .turn import CONTINUE, RESUME, Emit, Turn, TurnOutcome, check_failures

__all__ = ("ResumeOptions", "Run", "RunOptions", "StartOptions", "cancelled_on_exit")


class Run(Generic[OutputT]):
    """One run of an agent, held: drive it, watch it, stop it, read its result.

    Made by `Agent.start()` (see there for its options); nothing happens until it is
    entered. `async with run:` checks the options, then drives the run until the block's
    end, where it waits for the run to finish: a failure of the run is raised there, as
    itself; leaving the block by an exception of the body, or a cancellation around it,
    cancels the run first. Iterate it inside the block for its `agentloop.events`.

    ```python
    async with agent.start("Weather in Paris?") as run:
        async for event in run:
            print(event)
    print(run.result.text, run.usage)
    ```
    """

    def __init__(
        self,
        config: AgentConfig,
        registry: ToolRegistry,
        validators: Sequence[OutputValidator],
        prompt: str | Sequence[ContentBlock] | None = None,
        *,
        output_type: Any = None,
        history: Iterable[Message | Mapping[str, Any]] | None = None,
        deps: Any = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        session: Session | None = None,
        usage_limits: UsageLimits | None = None,
        capabilities: Sequence[Capability] = (),
        state: Mapping[str, Any] | PausedRun | None = None,
        decisions: Mapping[str, Any] | None = None,
        results: Mapping[str, Any] | None = None,
        stream: bool = True,
        on_event: Emit | None = None,
        effects: Effects | None = None,
        run_id: str | None = None,
    ) -> None:
        """A run of the agent `config`, `registry` and `validators` describe.

        Made by `Agent.start`, which passes its arguments on.

        Args:
            config: The agent's options.
            registry: The agent's tools.
            validators: The agent's output validators.
            prompt: The new user input; `None` continues `history` as it is (for
                example after `max_rounds`).
            output_type: This run's output type, instead of the agent's.
            history: Earlier messages (e.g. a previous `RunResult.messages`).
            deps: Any object; tools receive it as `RunContext.deps`.
            tools: Tools for this run alone, besides the agent's (functions are wrapped
                with `tool`); a name one of the agent's tools has is refused. A resumed
                run that used them needs them again (`resume(..., tools=[...])`).
            external_tools: Tools announced to the model that this run does not run:
                when the model calls one, the run runs the turn's other calls, then ends
                with `stop_reason="tool_use"`, the calls in `RunResult.pending` and its
                own results in `RunResult.held`. Continue with `resume(result.state,
                results={tool_use_id: ...})`. `ToolDefinition`s or wire dicts.
            session: A `Session` (`agentloop.sessions`) to continue instead of
                `history`; what the run adds is appended when it ends.
            usage_limits: The most this run may spend, instead of the agent's.
            capabilities: This run's own capabilities, inside the agent's (see
                `agentloop.capabilities`).
            state: A paused run's `RunResult.state`, to continue instead of a prompt
                (what `Agent.resume` does); with a `session`, the state stored there. Or
                the `PausedRun` `agentloop.resume.plan` made of it, answered already.
            decisions: For a resumed run: `Approve()` or `Deny(...)` by tool_use id.
            results: For a resumed run: the results of external calls by tool_use id.
            stream: Send each model request streamed (when the provider can), so the
                events include text and input deltas as they arrive and tool calls start
                as soon as their block is complete; False sends plain requests.
            on_event: Awaited with each of the run's own events as it happens, before
                the run goes on (a durable engine records them in order); iterating the
                run gives the same events.
            effects: Where the run's model requests and tool calls are performed (a
                durable engine's `agentloop.effects.Effects`); by default here and now.
            run_id: The run's id, instead of a new one (an engine running a run again
                gives the same id, so its calls keep their idempotency keys).
        """
        self._config = config
        self._registry = registry
        self._validators = validators
        self._start = {
            "prompt": prompt,
            "history": history,
            "deps": deps,
            "tools": tools,
            "external_tools": external_tools,
            "usage_limits": usage_limits,
            "output_type": output_type,
        }
        self._session = session
        self._input = prompt  # the run's new user input (see `_prepare`)
        self._capabilities = (
            *config.capabilities,
            *check_capabilities(capabilities, "capabilities"),
        )
        resuming = state is not None or decisions is not None or results is not None
        self._paused = (state, decisions, results) if resuming else None
        self._stream = stream
        self._on_event = on_event
        self._effects = effects
        self._run_id = run_id
        self._state: RunState | None = None
        self._snapshot: SessionSnapshot | None = None
        self._compaction = Compaction(
            config.history_processors, self._check if config.history_check == "strict" else None
        )
        self._params = config.request_params
        # The events, made on entering; the buffer is unbounded: sending never waits, so
        # it is never where a cancellation lands, and no event the run made is lost.
        self._send: MemoryObjectSendStream[Event] | None = None
        self._receive: MemoryObjectReceiveStream[Event] | None = None
        self._scope = anyio.CancelScope()
        self._group: anyio.abc.TaskGroup | CallTasks | None = None
        self._error: Exception | None = None

    # -- the handle

    @property
    def run_id(self) -> str:
        """Id of the run (bound in its log events too)."""
        return self._started.id

    @property
    def result(self) -> RunResult[OutputT]:
        """The run's result so far: final, partial, or a snapshot while it runs.

        Final when the run is done; partial when it failed or was cancelled (its history
        valid to send again); while it runs, a snapshot with `stop_reason="running"`,
        whose `messages` may end with calls still running.
        """
        state = self._started
        return state.outcome or state.result("running")

    @property
    def usage(self) -> Usage:
        """Tokens used so far (sub-runs and summaries included)."""
        return self._started.usage

    @property
    def spent(self) -> Spent:
        """What the run has spent so far: tokens, dollars, tool calls (sub-runs included)."""
        return self._started.meter.spent

    @property
    def done(self) -> bool:
        """Whether the run has ended (finished, failed or cancelled)."""
        return self._state is not None and self._state.outcome is not None

    def cancel(self, *, after_turn: bool = False) -> None:
        """Stop the run (see docs/cancellation.md).

        Args:
            after_turn: Let the current turn's tool calls finish, add their results, and
                stop before the next model request, instead of stopping everything now.
        """
        if after_turn and self._state is not None:
            self._state.stop_after_turn()
        else:
            self._scope.cancel()

    async def __aenter__(self) -> Run[OutputT]:
        if self._send is not None:
            raise ConfigurationError("a Run is driven once; start another with agent.start()")
        state = await self._prepared()
        self._send, self._receive = anyio.create_memory_object_stream[Event](math.inf)
        self._group = task_group_for(state.effects)
        await self._group.__aenter__()
        self._group.start_soon(self._drive)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._group is not None
        failed = isinstance(exc_info[1], Exception)
        if failed:
            # The body failed: stop the run, and let the body's exception go on as itself.
            self._scope.cancel()
            exc_info = (None, None, None)
        try:
            handled = await self._group.__aexit__(*exc_info)
        except BaseException as exc:
            reraise_base_exception(exc)
            raise
        finally:
            assert self._receive is not None
            self._receive.close()  # the events are for the block: a later read ends at once
        if self._error is not None and not failed and exc_info[1] is None:
            error, self._error = self._error, None
            raise error
        # The group never saw the body's exception: what it says (trio's says True when
        # its tasks ended cleanly) must not swallow that exception.
        return None if failed else handled

    def __aiter__(self) -> Run[OutputT]:
        return self

    async def __anext__(self) -> Event:
        if self._receive is None:
            raise ConfigurationError("the run has not started: enter it (`async with run:`)")
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self._error is not None:
                error, self._error = self._error, None
                raise error from None
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        if self._state is None:
            return "Run(not started)"
        return f"Run(run_id={self._state.id!r}, done={self.done})"

    @property
    def _started(self) -> RunState:
        if self._state is None:
            raise ConfigurationError("the run has not started: enter it (`async with run:`)")
        return self._state

    async def count_tokens(self) -> int:
        """The input tokens of the run's first request, counted by the API; nothing runs.

        The request is the one the run would send first (system prompt, tools,
        history and new input, after the history processors, with the cache markers
        the provider adds), counted by the provider's `count_tokens` (the Messages
        API's count endpoint). The run can still be entered afterwards, and then
        sends that request.

        Raises:
            ConfigurationError: the run was entered already, or its provider cannot
                count tokens (a Chat Completions one).
            ProviderError: the count endpoint failed.
        """
        if self._send is not None:
            raise ConfigurationError("count_tokens() counts a run before it is entered")
        provider = counting_provider(self._config.provider)
        await self._prepared()
        return await provider.count_tokens(await self._request())

    # -- before the first round

    async def _prepared(self) -> RunState:
        """The run's state, prepared on first use (entering, or counting first)."""
        if self._state is None:
            self._state = await self._prepare()
            self._state.capabilities = Chain(self._capabilities, self._context(self._state.rounds))
        return self._state

    async def _prepare(self) -> RunState:
        """The run's state from what it was started with; every option checked here."""
        start = self._start
        history = start["history"]
        resuming = self._paused is not None
        state, decisions, answers = self._paused or (None, None, None)
        if resuming and (start["prompt"] is not None or history is not None):
            raise ConfigurationError("a resumed run continues its state: give no prompt or history")
        registry = run_registry(self._registry, start["tools"])
        snapshot = None
        if self._session is not None:
            snapshot = await load_session(self._session, history)
            history = snapshot.messages
            if resuming and state is None:
                state = snapshot.state
                if state is None:
                    raise ConfigurationError(
                        f"session {self._session.session_id!r} holds no paused run to resume"
                    )
        if resuming:
            if state is None:
                raise ConfigurationError(
                    "resume() needs the paused run's state (RunResult.state) or its session"
                )
            if isinstance(state, PausedRun):  # answered already (a sub-run, by its parent)
                paused = state
            else:
                paused = plan(state, decisions, answers, registry)
            run = self._new_state(
                registry,
                paused.messages,
                None,
                external_tools=paused.external,
                usage_limits=start["usage_limits"],
            )
            run.restore(paused)
        else:
            run = self._new_state(
                registry,
                history,
                start["prompt"],
                external_tools=start["external_tools"],
                usage_limits=start["usage_limits"],
                output_type=start["output_type"],
            )
            if start["prompt"] is None:  # the input came in the history (a gateway's, DBOS's)
                self._input = last_user_input(run.history.messages)
        if self._run_id is not None or self._effects is not None:
            run.perform_with(self._effects or run.effects, self._run_id or run.id)
        self._snapshot = snapshot
        return run

    def _new_state(
        self,
        registry: ToolRegistry,
        history: Iterable[Message | Mapping[str, Any]] | None,
        prompt: str | Sequence[ContentBlock] | None,
        **options: Any,
    ) -> RunState:
        return new_state(
            self._config,
            registry,
            self._validators,
            history=history,
            prompt=prompt,
            deps=self._start["deps"],
            **options,
        )

    def _check(self, messages: Sequence[Message]) -> None:
        """Lint compacted messages as the history itself is linted before each request."""
        config = self._config
        lint_history(
            messages,
            thinking=config.thinking,
            tool_choice=config.tool_choice,
            allow_file_sources=True,  # sent under the Files beta (`files_params`)
        )

    # -- driving: events, session, span, logs

    async def _drive(self) -> None:
        """Drive the run; its failure is kept for the block's end, never left in the group."""
        state, send = self._started, self._send
        assert send is not None
        with send:
            try:
                with self._scope, events_to(send.send_nowait, self._emit):
                    try:
                        await self._kept()
                    except Exception as exc:
                        self._error = exc
            finally:
                # Cancelled (by `cancel()` or a scope around the run): the partial result.
                if state.final is None and state.partial is not None and self._error is None:
                    send.send_nowait(RunFinished(state.partial))

    async def _emit(self, event: Event) -> None:
        if self._on_event is not None:
            await self._on_event(event)
        assert self._send is not None
        self._send.send_nowait(event)

    async def _kept(self) -> RunResult[Any]:
        """The run, its messages appended to its session (if any) when it ends."""
        if self._session is None or self._snapshot is None:
            return await self._traced(None)
        return await keeping(self._session, self._snapshot, self._started, self._traced)(None)

    async def _traced(self, _: None) -> RunResult[Any]:
        """The run inside its `invoke_agent` span, when it has one."""
        state, config = self._started, self._config
        if state.tracing is None:
            return await self._logged()
        name = provider_name(config.provider)
        with state.tracing.run(config.name, config.model, name, state.id) as span:
            try:
                return await self._logged()
            finally:
                if state.outcome is not None:
                    record_run(span, state.outcome)

    async def _logged(self) -> RunResult[Any]:
        """The loop with its logs and first and last events; ends early with a partial result."""
        state = self._started
        state.log.info("run.start", model=self._config.model, tools=len(self._registry))
        await self._emit(RunStarted(state.id))
        try:
            with structlog.contextvars.bound_contextvars(run_id=state.id):
                await state.capabilities.before_run(self._context(state.rounds))
                stop = await self._loop()
                if state.output is not None:
                    state.output.check_end(stop)
                await state.capabilities.after_run(self._context(state.rounds), state.result(stop))
        except anyio.get_cancelled_exc_class():
            state.end_early("cancelled")
            state.log.info("run.cancelled", rounds=state.rounds)
            raise
        except AgentloopError as exc:
            if exc.result is None:
                exc.result = state.end_early("error")
            else:
                state.partial = exc.result
            state.log.warning("run.error", error=str(exc), error_type=type(exc).__name__)
            raise
        except BaseException:
            state.end_early("error")  # KeyboardInterrupt, SystemExit, ...
            raise
        result = state.finish(stop)
        state.log.info("run.end", stop_reason=stop, rounds=state.rounds, usage=result.usage)
        await self._emit(RunFinished(result))
        return result

    # -- the loop: next request -> play the turn -> decide

    async def _loop(self) -> StopReason:
        """Rounds of request, response and tool calls, until the model is done."""
        state = self._started
        if state.paused is not None:
            context = replace(self._context(state.rounds), answers=state.paused.answers)
            turn = Turn(state, state.registry, context, self._emit)
            check_failures(state, await turn.resume(state.paused), self._config.on_tool_error)
            if state.pause_reason is not None:  # a sub-run paused again
                return state.pause_reason
        while state.rounds < self._config.max_rounds:
            request = await self._next_request()
            try:
                outcome = await self._play_turn(request)
            except ProviderError as exc:
                if self._compaction.retry_after(exc):
                    continue
                raise
            stop = await self._decide(outcome)
            if stop is not None:
                return stop
        return "max_rounds"

    async def _next_request(self) -> ModelRequest:
        """The next round's request (see `_request`), within the limits."""
        state = self._started
        request = await self._request()
        breach = await check_before_request(state.meter, request, self._config.provider)
        if breach is not None:
            raise breach.error(state.end_early("usage_limit"))
        return request

    async def _request(self) -> ModelRequest:
        """The next round's request: the history checked and compacted, the tools announced."""
        state, config = self._started, self._config
        if config.history_check == "strict":
            state.history.check()
        context = self._context(state.rounds + 1)
        messages = await self._compaction.messages(state.history.messages, context)
        tools = await announced_tools(state, context)
        return build_request(config, state, messages, tools, self._params)

    async def _play_turn(self, request: ModelRequest) -> TurnOutcome:
        """Send `request` and answer the calls of its response: one round."""
        state = self._started
        round_ = state.start_round()
        await self._emit(RequestStarted(round_))
        emit: Emit = self._emit
        if state.output is not None:
            emit = PartialOutputs(state.output, emit, round_)
        turn = Turn(state, state.registry, self._context(round_), emit)
        outcome = await turn.play(partial(self._send_request, request))
        # A cancellation that reached only the tool calls (the response itself came in
        # whole) ends the run here, with every call answered.
        await anyio.lowlevel.checkpoint_if_cancelled()
        response = outcome.response
        await self._emit(RoundFinished(round_, response.stop_reason, response.usage))
        return outcome

    async def _send_request(
        self, request: ModelRequest, on_event: Callable[[Any], Awaitable[None]]
    ) -> ModelResponse:
        state = self._started
        return await send_request(
            self._config,
            state,
            request,
            self._context(state.rounds),
            on_event if self._stream else None,
        )

    async def _decide(self, outcome: TurnOutcome) -> StopReason | None:
        """Why the run stops after this turn, or None to go on with another round."""
        state = self._started
        check_failures(state, outcome.results, self._config.on_tool_error)
        breach = state.meter.over()
        if breach is not None:
            raise breach.error(state.end_early("usage_limit"))
        if state.pause_reason is not None:
            return state.pause_reason
        if state.stopping:
            return "cancelled"
        response = outcome.response
        if state.output is not None:
            context = self._context(state.rounds)
            verdict = await state.output.after_turn(response, outcome.calls, state.history, context)
            if verdict == "done":
                await self._emit(OutputReady(state.rounds, state.output.value))
                return "end_turn"
            if verdict == "retry":
                return None
        stop = response.stop_reason
        if self._compaction.retry_after(stop_reason=stop):
            return None
        if stop not in CONTINUE or (stop not in RESUME and not outcome.calls):
            return stop or "end_turn"
        return None

    def _context(self, round_: int) -> RunContext[Any]:
        """The context of round `round_`: what its calls, rules and processors get."""
        state, config = self._started, self._config
        return RunContext(
            run_id=state.id,
            round=round_,
            deps=state.deps,
            model=config.model,
            provider=config.provider,
            meter=state.meter,
            limiter=state.limiter,
            timeout=config.tool_timeout,
            shared_limiter=config.tool_limiter,
            log=state.log.bind(round=round_),
            tracing=state.tracing,
            effects=state.effects,
            prompt=self._input,
            events=self._emit if self._effects is None else None,  # (see RunContext.events)
        )


@asynccontextmanager
async def cancelled_on_exit(run: Run[OutputT]) -> AsyncIterator[Run[OutputT]]:
    """`run`, entered; leaving the block before it ends cancels it (`Agent.run_stream`)."""
    async with run:
        try:
            yield run
        finally:
            run.cancel()
