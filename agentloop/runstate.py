"""The state of one run: its history, its meter, its tool-call log and its pause.

Every `Run` holds one `RunState`; the loop and its turns change it only through its
methods, and `result()` reads it as a `RunResult` at any moment. Keeping it apart from
`Agent` lets one agent serve any number of concurrent runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio

from .approval import Gate
from .calls import ToolCall, ToolDefinition, ToolResult, wire_tool_name
from .capabilities.base import Chain
from .config import AgentConfig, schema_of
from .effects import DIRECT, Effects
from .errors import ConfigurationError
from .history import History
from .limits import Meter, UsageLimits, check_provider
from .lint import HistoryLinter
from .logs import get_logger
from .messages import ContentBlock, Message
from .output import OutputRun, OutputValidator, resolve_mode
from .pricing import table_provider
from .providers.base import ModelResponse, provider_name
from .registry import ToolRegistry
from .result import ApprovalRequest, RunResult, StopReason, SubAgentCall, ToolCallRecord, Usage
from .server_tools import ServerTool
from .state import PausedRun, PendingCall, dump_state, waiting_calls
from .tools import Tool
from .tracing import Tracing, tracing_for

__all__ = ("CANCELLED_MESSAGE", "RunState", "new_state", "run_registry")

_log = get_logger()

CANCELLED_MESSAGE = "Cancelled: the run was stopped before this call finished."


class RunState:
    """One run's state. Its history changes only through `History`'s methods."""

    def __init__(
        self,
        history: History,
        *,
        deps: Any,
        tool_concurrency: int,
        log: Any,
        tracing: Tracing | None = None,
        registry: ToolRegistry | None = None,
        external: Sequence[ToolDefinition | Mapping[str, Any]] = (),
        external_names: frozenset[str] = frozenset(),
        gate: Gate | None = None,
        meter: Meter | None = None,
        output: OutputRun | None = None,
    ) -> None:
        """Start a run over `history`; `log` gets the run's id bound.

        `tracing` opens the run's spans (None: no spans); `registry` holds the tools the
        run announces and runs (a typed output's final-result tools included);
        `external` are the definitions of external tools announced with each request,
        `external_names` their names;
        `gate` says which calls wait (by default those of the external tools).
        `meter` counts the run's tokens, cost and tool calls against its usage limits.
        `output` reads a typed output (None: the output is the final text).
        """
        self.id = uuid.uuid4().hex
        self.history = history
        self.deps = deps
        self.tracing = tracing
        self.registry = registry if registry is not None else ToolRegistry()
        self.external = tuple(external)
        self.external_names = external_names
        self.meter = meter if meter is not None else Meter(None, "")
        self.rounds = 0
        self.calls: list[ToolCallRecord] = []
        self.models: list[str] = []
        """The model that answered each response the run kept, in order."""
        self.container: str | None = None
        self.stop_sequence: str | None = None
        """The stop sequence the last response stopped at, if it stopped at one."""
        self.warned_unenforced = False
        """Whether the run logged that some of its limits cannot be enforced."""
        self.limiter = anyio.CapacityLimiter(tool_concurrency)
        self.log = log.bind(run_id=self.id)
        self.stopping = False
        """Whether the run stops after the turn under way (see `stop_after_turn`)."""
        self.final: RunResult[Any] | None = None
        """The result of a run that finished."""
        self.partial: RunResult[Any] | None = None
        """The result of a run that ended early (failed or cancelled)."""
        self.held: list[dict[str, Any]] = []
        """The run's own results of the turn that handed calls back (wire blocks)."""
        self.gate = gate or Gate(external_names=external_names)
        self.waiting: list[PendingCall] = []
        """Every call of the turn that paused the run: approval, external and sub-agent
        calls whose runs paused, in order."""
        self.paused: PausedRun | None = None
        """The paused run this one resumes, until its turn is answered."""
        self.output = output
        self.effects: Effects = DIRECT
        """Where the run's model requests and tool calls are performed (`agentloop.effects`)."""
        self.capabilities = Chain()
        """The run's capabilities, composed (the agent's, then the run's own)."""
        self.offered: frozenset[str] | None = None
        """The names of the tools the turn under way announced, when its capabilities
        changed them (a call of another is answered as not available); None otherwise."""

    def perform_with(self, effects: Effects, run_id: str) -> None:
        """Run as `run_id`, its effects performed by `effects` (a durable engine's).

        An engine that replays a run after a crash gives it the same id each time, so
        that `RunContext.idempotency_key` is the same for each of its calls.
        """
        self.effects = effects
        self.id = run_id
        self.log = self.log.bind(run_id=run_id)

    @property
    def outcome(self) -> RunResult[Any] | None:
        """The final result, the partial one if the run ended early, or None while it runs."""
        return self.final or self.partial

    def start_round(self) -> int:
        """Count a new model request; return its number (from 1)."""
        self.rounds += 1
        return self.rounds

    @property
    def usage(self) -> Usage:
        """Tokens used so far (the meter's total, sub-runs and summaries included)."""
        return self.meter.usage

    @property
    def cost(self) -> float | None:
        """The run's cost so far in US dollars, or None when a price is unknown.

        Each response is priced as it came (the meter's total, which a cost limit counts).
        """
        return self.meter.cost

    def stop_after_turn(self) -> None:
        """Let the turn under way finish, then stop before the next model request."""
        self.stopping = True

    def add_response(
        self, response: ModelResponse, errors: dict[str, str] | None = None
    ) -> list[ToolCall]:
        """Count the response's usage and add it to the history; return its calls."""
        self.meter.add(response)
        sent_to = response.sent_to
        self.models.append(response.model or (sent_to[0] if sent_to else self.meter.model))
        self._note_uncounted()
        stopped = response.stop_reason == "stop_sequence"
        sequence = response.stop_sequence
        self.stop_sequence = sequence if stopped and isinstance(sequence, str) else None
        if response.container and response.container.get("id"):
            self.container = str(response.container["id"])
        return self.history.add_response(response, errors)

    def _note_uncounted(self) -> None:
        """Warn once when a response without token counts leaves limits unenforceable."""
        limits = self.meter.unenforced()
        if limits and not self.warned_unenforced:
            self.warned_unenforced = True
            self.log.warning(
                "run.limits_unenforced",
                limits=list(limits),
                detail="a response came without token counts; the counts are a floor",
            )

    def answer_turn(
        self,
        results: Mapping[str, ToolResult],
        missing: str,
        *,
        partial: Sequence[ContentBlock] | None = None,
        calls: Mapping[str, ToolCall] | None = None,
    ) -> list[tuple[ToolCall, ToolResult]]:
        """Answer the turn's calls in the history (see `History.answer_turn`) and log them.

        `calls` are the turn's calls by id, as the log shows them: what the model sent
        (an input that is not an object is kept as `{}` in the history) or what ran (a
        person's edit).
        """
        pairs = self.history.answer_turn(results, missing, partial=partial)
        if calls:
            pairs = [(calls.get(c.id, c), r) for c, r in pairs]
        if self.paused is None:
            self.log_calls(pairs)
        else:
            self._log_resumed(pairs)
        return pairs

    def hand_back(
        self,
        waiting: Sequence[PendingCall],
        own: Sequence[tuple[ToolCall, ToolResult]],
    ) -> None:
        """End the run's turns here: `waiting` calls wait for the caller, `own` results are held.

        Calls of `own` logged already (a resumed turn that pauses again) are not logged twice.
        """
        self.waiting = list(waiting)
        self.held = [r.to_block().to_wire() for _, r in own]
        logged = {r.tool_use_id for r in self.calls}
        self.log_calls([(c, r) for c, r in own if c.id not in logged])
        self.paused = None

    @property
    def pause_reason(self) -> StopReason | None:
        """Why the run stops for its caller: approval first, then external calls; or None.

        The calls its paused sub-runs wait for count as its own.
        """
        if any(w.kind == "approval" for _, w in waiting_calls(self.waiting)):
            return "approval_required"
        return "tool_use" if self.waiting else None

    def restore(self, paused: PausedRun) -> None:
        """Continue the run `paused` describes (its history is this run's already).

        A state with no waiting calls is a run between two rounds (a durable run going on
        in a new process): it has no turn to finish.
        """
        self.id = paused.run_id
        self.log = self.log.bind(run_id=self.id)
        self.rounds = paused.rounds
        self.calls = list(paused.tool_calls)
        self.models = list(paused.models)
        self.container = paused.container
        self.paused = paused if paused.pending else None
        # The limits hold over the whole run: count what it spent before the pause (its
        # responses priced one by one, as they came) and the tool calls it counted.
        self.meter.add_usage(paused.usage, paused.cost, paused.counted_calls)

    def _log_resumed(self, pairs: Sequence[tuple[ToolCall, ToolResult]]) -> None:
        """Log the paused turn's calls in order: the run's turn is over, as if never paused.

        The calls of the turn that ran before the pause were logged then, last; their
        entries move to their place among the others.
        """
        ids = {c.id for c, _ in pairs}
        earlier = {r.tool_use_id: r for r in self.calls if r.tool_use_id in ids}
        self.calls = [r for r in self.calls if r.tool_use_id not in ids]
        for call, result in pairs:
            if call.id in earlier:
                self.calls.append(earlier[call.id])
            else:
                self.log_calls([(call, result)])
        self.paused = None

    def log_calls(self, pairs: Sequence[tuple[ToolCall, ToolResult]]) -> None:
        """Add the calls to `RunResult.tool_calls`."""
        for call, r in pairs:
            self.calls.append(
                ToolCallRecord(
                    self.rounds,
                    r.name,
                    call.input,
                    r.tool_use_id,
                    r.is_error,
                    r.text,
                    r.duration,
                    r.ran,
                )
            )

    def finish(self, stop_reason: StopReason) -> RunResult[Any]:
        """The run is over: its final result."""
        self.final = self.result(stop_reason)
        return self.final

    def end_early(self, stop_reason: StopReason) -> RunResult[Any]:
        """The run failed or was cancelled: its partial result (the turn closed already)."""
        self.partial = self.result(stop_reason)
        return self.partial

    def result(self, stop_reason: StopReason) -> RunResult[Any]:
        """The run's result as it stands.

        The calls its sub-runs wait for are listed with the run's own (`approvals`,
        `pending`), each saying which sub-agent calls it is inside.
        """
        waiting = waiting_calls(self.waiting)
        self._note_uncounted()  # a sub-run's uncounted usage too
        return RunResult(
            text=self.history.last_text,
            stop_reason=stop_reason,
            messages=self.history.dump(),
            tool_calls=list(self.calls),
            usage=self.usage,
            rounds=self.rounds,
            run_id=self.id,
            pending=[_pending_block(via, w) for via, w in waiting if w.kind == "external"],
            held=list(self.held),
            approvals=[
                ApprovalRequest(w.tool_use_id, w.name, w.input, w.reason, via)
                for via, w in waiting
                if w.kind == "approval"
            ],
            state=self._state() if self.waiting else None,
            output=self.history.last_text if self.output is None else self.output.value,
            cost=self.cost,
            stop_sequence=self.stop_sequence,
            container=self.container,
            unenforced_limits=self.meter.unenforced(),
            models=list(self.models),
        )

    def _state(self) -> dict[str, Any]:
        """What `Agent.resume` needs to continue this paused run (see `agentloop.state`)."""
        return dump_state(
            run_id=self.id,
            rounds=self.rounds,
            usage=self.usage,
            messages=self.history.dump(),
            finished=self.held,
            pending=self.waiting,
            tool_calls=self.calls,
            container=self.container,
            external=[d.to_wire() if isinstance(d, ToolDefinition) else d for d in self.external],
            cost=self.cost,
            models=self.models,
        )


def _pending_block(via: tuple[SubAgentCall, ...], call: PendingCall) -> dict[str, Any]:
    """The `tool_use` block of an external call, for `RunResult.pending`.

    A sub-run's call also says which sub-agent calls it is inside (`"via"`, as
    `ApprovalRequest.via` in JSON): its block is not in the run's own history.
    """
    block = {"type": "tool_use", "id": call.tool_use_id, "name": call.name, "input": call.input}
    return block if not via else block | {"via": [list(v) for v in via]}


def new_state(
    config: AgentConfig,
    registry: ToolRegistry,
    validators: Sequence[OutputValidator],
    *,
    history: Iterable[Message | Mapping[str, Any]] | None,
    prompt: str | Sequence[ContentBlock] | None,
    deps: Any,
    external_tools: Sequence[ToolDefinition | Mapping[str, Any]] = (),
    usage_limits: UsageLimits | None = None,
    output_type: Any = None,
) -> RunState:
    """The state of a new run of the agent `config` and `registry` describe.

    Raises:
        ConfigurationError: the prompt, history, external tools or limits cannot be used.
        HistoryError: an item of `history` is not a valid message.
    """
    linter = HistoryLinter(
        thinking=config.thinking,
        tool_choice=config.tool_choice,
        allow_file_sources=True,  # sent under the Files beta (`files_params`)
    )
    messages = History.start(history, prompt, linter)
    names = _external_names(external_tools, registry)
    if usage_limits is not None and not isinstance(usage_limits, UsageLimits):
        raise ConfigurationError(
            f"usage_limits must be a UsageLimits, not {type(usage_limits).__name__}"
        )
    limits = usage_limits if usage_limits is not None else config.usage_limits
    check_provider(limits, config.provider)
    output = _output(config, registry, validators, output_type)
    return RunState(
        messages,
        deps=deps,
        tool_concurrency=config.tool_concurrency,
        log=_log,
        tracing=tracing_for(config.tracer_provider),
        registry=registry if output is None else output.registry,
        external=external_tools,
        external_names=names,
        gate=Gate(registry, external_names=names, approval_required=config.approval_required),
        meter=Meter(limits, config.model, table_provider(provider_name(config.provider))),
        output=output,
    )


def run_registry(
    registry: ToolRegistry, tools: Iterable[Tool | Callable[..., Any]] | None
) -> ToolRegistry:
    """The tools of one run: the agent's `registry`, and after them `tools`, the run's own.

    Raises:
        ConfigurationError: `tools` is not a list of tools or functions, or one of them
            has the name of another tool of the run (the agent's, or the run's own).
    """
    if tools is None or isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise ConfigurationError(
            f"tools must be a list of tools or functions, not {type(tools).__name__}"
        )
    listed = list(tools)
    if server := [type(t).__name__ for t in listed if isinstance(t, ServerTool)]:
        raise ConfigurationError(
            f"{', '.join(server)} is a server tool: give it to Agent(tools=[...]), "
            "whose requests announce it, not to one run"
        )
    added = [t if isinstance(t, Tool) else Tool(t) for t in listed]
    if not added:
        return registry
    combined = ToolRegistry()
    for tool in registry:
        combined.register(tool, source=tool.source)
    for tool in added:
        theirs = registry.get(tool.name)
        if theirs is not None:
            raise ConfigurationError(
                f"the run's tool {tool.name!r} ({_origin(tool)}) has the name of the agent's "
                f"tool {theirs.name!r} ({_origin(theirs)}); the model addresses tools by "
                "name, so rename one (tool.replace(name=...))"
            )
        combined.register(tool)
    return combined


def _origin(tool: Tool) -> str:
    """Where a tool comes from, for an error naming it: its function, and its plugin."""
    function = tool.function
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    module = getattr(function, "__module__", None)
    where = f"{module}.{name}" if module else name
    return where if tool.source is None else f"{where}, from plugin {tool.source!r}"


def _output(
    config: AgentConfig,
    registry: ToolRegistry,
    validators: Sequence[OutputValidator],
    output_type: Any,
) -> OutputRun | None:
    """The typed output of a run (None when its output is the text)."""
    schema = config.output_schema if output_type is None else schema_of(output_type)
    if schema is None:
        return None
    return OutputRun(
        schema,
        resolve_mode(config.output_mode, config.provider),
        retries=config.output_retries,
        # Validators check the agent's output type; a run with its own has none.
        validators=validators if output_type is None else (),
        registry=registry,
    )


def _external_names(
    external_tools: Sequence[ToolDefinition | Mapping[str, Any]], registry: ToolRegistry
) -> frozenset[str]:
    """The names of a run's external tools, checked: JSON values, none of the agent's."""
    names = []
    for definition in external_tools:
        try:
            name = wire_tool_name(definition)
        except ConfigurationError as exc:
            raise ConfigurationError(f"external tool: {exc}") from None
        if name is not None:
            names.append(name)
    try:
        json.dumps([t.to_wire() if isinstance(t, ToolDefinition) else t for t in external_tools])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"external tool definitions must be JSON values (they go into the run's state): {exc}"
        ) from exc
    clash = sorted(set(names) & set(registry.names))
    if clash:
        raise ConfigurationError(
            f"external tool name(s) {', '.join(clash)} are also tools of this agent; "
            "the model addresses tools by name"
        )
    return frozenset(names)
