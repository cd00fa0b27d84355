"""The agent: the loop that turns a prompt into a finished run.

Each round sends the history to the model, appends the assistant message verbatim, runs
the turn's tool calls in parallel through the registry and appends their results as one
user message, until the model stops asking for tools or a limit is reached. All per-run
state lives in `_Run`, so one `Agent` serves any number of concurrent runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import anyio
import structlog

from .errors import ConfigurationError, ProviderError, ToolCallFailed
from .messages import (
    ContentBlock,
    Message,
    TextBlock,
    ToolUseBlock,
    dump_history,
    lint_history,
    parse_history,
)
from .providers.base import ModelRequest, ModelResponse, Provider, Usage
from .registry import ExecutionContext, ToolRegistry
from .tools import Tool, ToolCall, ToolResult

__all__ = ("Agent", "RunResult", "ToolCallRecord")

_log = structlog.get_logger("agentloop")

StopReason = str
"""Why a run ended: the model's last `stop_reason` ("end_turn", "max_tokens", "refusal",
"stop_sequence", "model_context_window_exceeded", "pause_turn", or a future value), or
agentloop's own "max_rounds" / "tool_error"."""

# Stop reasons after which the loop sends the history back for another round.
_CONTINUE = frozenset({"tool_use", "max_tokens", "pause_turn"})

TRUNCATED_MESSAGE = (
    "Not run: this tool call was cut off by max_tokens, so its input is incomplete. "
    "Call the tool again with complete input (keep it shorter if needed)."
)


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
    """The state of one run: its history, usage and log."""

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

    def add_response(self, response: ModelResponse) -> None:
        self.usage += response.usage
        if response.container and response.container.get("id"):
            self.container = str(response.container["id"])
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant":
            # Continuing a paused turn: the API treats consecutive assistant messages as
            # one, so keep them as one.
            self.messages[-1] = Message.assistant([*last.blocks, *response.content])
        else:
            self.messages.append(response.message)

    def add_results(self, results: Sequence[ToolResult], calls: Sequence[ToolCall]) -> None:
        self.messages.append(Message.user([r.to_block() for r in results]))
        for call, r in zip(calls, results, strict=False):
            self.calls.append(
                ToolCallRecord(
                    self.rounds, r.name, call.input, r.tool_use_id, r.is_error, r.text, r.duration
                )
            )

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
        model: str = "claude-sonnet-5-5",
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
        run = _Run(self, _start(history, prompt), deps)
        run.log.info("run.start", model=self.model, tools=len(self.registry))
        try:
            stop = await self._loop(run)
        except ProviderError as exc:
            exc.result = run.result("error")
            run.log.warning("run.error", error=str(exc), rounds=run.rounds)
            raise
        result = run.result(stop)
        run.log.info("run.end", stop_reason=stop, rounds=run.rounds, usage=result.usage)
        return result

    async def _loop(self, run: _Run) -> StopReason:
        while run.rounds < self.max_rounds:
            response = await self._request(run)
            run.add_response(response)
            calls = [ToolCall.from_block(b) for b in response.tool_uses]
            if calls:
                await self._answer(run, response, calls)
            if response.stop_reason not in _CONTINUE or (
                response.stop_reason == "tool_use" and not calls
            ):
                return response.stop_reason or "end_turn"
            if response.stop_reason == "max_tokens" and not calls:
                return "max_tokens"
        return "max_rounds"

    async def _request(self, run: _Run) -> ModelResponse:
        request = self._build_request(run)
        lint_history(
            request.messages, thinking=request.thinking_enabled, tool_choice=request.tool_choice
        )
        run.rounds += 1
        started = time.perf_counter()
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

    async def _answer(self, run: _Run, response: ModelResponse, calls: list[ToolCall]) -> None:
        """Give every tool_use of the turn its result, running those that may run."""
        skipped = _not_runnable(response, calls)
        runnable = [c for c in calls if c.id not in skipped]
        context = ExecutionContext(
            run.id, run.rounds, run.limiter, self.tool_timeout, run.deps, self.tool_limiter
        )
        done = {r.tool_use_id: r for r in await self.registry.execute(runnable, context)}
        done.update(skipped)
        results = [done[c.id] for c in calls]
        run.add_results(results, calls)
        failed = next((r for r in results if r.is_error and r.tool_use_id not in skipped), None)
        if failed is not None and self.on_tool_error == "stop":
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


def _not_runnable(response: ModelResponse, calls: list[ToolCall]) -> dict[str, ToolResult]:
    """Results for calls that must not run, by tool_use id."""
    if response.stop_reason == "max_tokens":
        last = response.content[-1] if response.content else None
        if isinstance(last, ToolUseBlock):
            call = calls[-1]
            return {call.id: ToolResult.error(call, TRUNCATED_MESSAGE)}
        return {}
    if response.stop_reason in _CONTINUE:
        return {}
    reason = response.stop_reason or "unknown"
    message = f"Not run: the response ended with stop_reason '{reason}', so the run stopped."
    return {c.id: ToolResult.error(c, message) for c in calls}
