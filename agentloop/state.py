"""The state of a paused run, as plain JSON values, and the checks it passes to come back.

A run that ends with calls waiting (for approval, or for the caller to run them) hands
over `RunResult.state`: a versioned dict holding everything `Agent.resume` needs (the
history, the turn's finished results, the waiting calls, usage, rounds, the run's id). It
can be stored anywhere JSON goes and resumed by another process with another `Agent` of
the same configuration. A call of a sub-agent (`Agent.as_tool`) whose run paused waits
with that run's own state inside it (`PendingCall.run`), to any depth.

The state carries a SHA-256 checksum over its canonical JSON. It catches a state that
was changed after the run wrote it: cut short, edited by hand, merged from two runs,
mangled by a store. It is not a signature: whoever can write the state can compute a new
checksum, so keep states where only the service writes them (or sign them yourself) when
the people deciding must not be able to change the history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .calls import ToolCall, ToolResult
from .errors import HistoryError, InvalidStateError, StateVersionError, TamperedStateError
from .messages import Message, ToolResultBlock, parse_history
from .result import SubAgentCall, ToolCallRecord, Usage

__all__ = (
    "READ_VERSIONS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "PausedRun",
    "PendingCall",
    "dump_state",
    "load_state",
    "waiting_calls",
)

STATE_FORMAT = "agentloop.run_state"
"""The `format` field of every run state."""

STATE_VERSION = 3
"""The state version this agentloop writes (2: waiting calls may hold a sub-run's state;
3: each logged call says whether it ran)."""

READ_VERSIONS = (1, 2, 3)
"""The state versions this agentloop reads (a version 1 state has no sub-runs; in a
state before version 3, every logged call is taken to have run)."""


@dataclass(frozen=True)
class PendingCall:
    """A call of the paused turn that waits for the caller."""

    tool_use_id: str
    name: str
    input: dict[str, Any]
    kind: Literal["approval", "external", "agent"]
    """`"agent"`: a sub-agent's call, waiting for the calls its paused run waits for."""
    reason: str
    run: dict[str, Any] | None = None
    """For an `"agent"` call: the state of the sub-agent's paused run."""

    @classmethod
    def sub_run(cls, call: ToolCall, state: dict[str, Any]) -> PendingCall:
        """The call `call` of a sub-agent whose run paused with `state`."""
        reason = f"the '{call.name}' agent's run waits for its own calls"
        return cls(call.id, call.name, call.input, "agent", reason, state)


@dataclass(frozen=True)
class PausedRun:
    """A run state, read back and checked."""

    run_id: str
    rounds: int
    usage: Usage
    messages: list[Message]
    """The history; it ends with the assistant message whose calls are being answered."""
    finished: list[ToolResultBlock]
    """The results of the turn's calls that ran (or were answered) before the pause."""
    pending: list[PendingCall]
    tool_calls: list[ToolCallRecord]
    container: str | None
    external: list[dict[str, Any]]
    """The run's external tool definitions (wire form), announced again after resuming."""
    cost: float | None = None
    """What the run's requests cost before the pause (None: unknown)."""
    models: list[str] = field(default_factory=list)
    """The model that answered each response before the pause (`RunResult.models`)."""
    answers: Mapping[str, ToolCall | ToolResult | PausedRun] = field(default_factory=dict)
    """How each waiting call is answered when the run resumes, by id: the call to run
    (approved, its input perhaps edited), its result (denied, or an external result), or
    for a sub-agent's call the sub-run to resume, with its own answers."""

    @property
    def order(self) -> list[str]:
        """The ids of the paused turn's calls, in the model's order."""
        return [use.id for use in self.messages[-1].tool_uses]

    @property
    def counted_calls(self) -> int:
        """The tool calls the run had counted against `UsageLimits.tool_calls` when it paused.

        Those it ran, and the waiting calls counted when their response came: each
        approval and sub-agent call (a call answered without running is counted too:
        the count errs on the safe side), and what the sub-runs counted.
        """
        waiting = 0
        for call in self.pending:
            if call.run is not None:
                waiting += 1 + load_state(call.run).counted_calls
            elif call.kind == "approval":
                waiting += 1
        return len(self.tool_calls) + waiting


def waiting_calls(
    pending: Sequence[PendingCall],
) -> list[tuple[tuple[SubAgentCall, ...], PendingCall]]:
    """Every call that `pending` waits for, sub-runs opened up, in the models' order.

    Each comes with the sub-agent calls it is inside, outermost first (empty for a call
    of the run itself); sub-agent calls themselves are not listed, only what they wait for.
    """
    found: list[tuple[tuple[SubAgentCall, ...], PendingCall]] = []
    for call in pending:
        if call.run is None:
            found.append(((), call))
            continue
        where = SubAgentCall(call.name, call.tool_use_id)
        inner = waiting_calls(load_state(call.run).pending)
        found.extend(((where, *via), leaf) for via, leaf in inner)
    return found


def dump_state(
    *,
    run_id: str,
    rounds: int,
    usage: Usage,
    messages: list[dict[str, Any]],
    finished: Sequence[Mapping[str, Any]],
    pending: Sequence[PendingCall],
    tool_calls: Sequence[ToolCallRecord],
    container: str | None,
    external: Sequence[Mapping[str, Any]],
    cost: float | None = None,
    models: Sequence[str] = (),
) -> dict[str, Any]:
    """The state of a paused run, with its checksum: plain JSON values only."""
    body = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "run_id": run_id,
        "rounds": rounds,
        "usage": asdict(usage),
        "messages": messages,
        "finished": list(finished),
        "pending": [asdict(p) for p in pending],
        "tool_calls": [asdict(r) for r in tool_calls],
        "container": container,
        "external": list(external),
        "cost": cost,
        "models": list(models),
    }
    text = _canonical(body)  # also proves every value is JSON
    state: dict[str, Any] = json.loads(text)
    state["checksum"] = _checksum(text)
    return state


def load_state(state: Any) -> PausedRun:
    """Check a run state and read it; `state` itself is left as it is.

    Raises:
        InvalidStateError: `state` is not a run state, or it does not hold together.
        StateVersionError: it was written by an incompatible version of agentloop.
        TamperedStateError: it was changed after the run wrote it (its checksum fails).
    """
    if not isinstance(state, Mapping):
        raise InvalidStateError(
            f"a run state is the dict of RunResult.state, not {type(state).__name__}"
        )
    if state.get("format") != STATE_FORMAT:
        raise InvalidStateError(
            f"not a run state: its 'format' is {state.get('format')!r}, not {STATE_FORMAT!r}"
        )
    version = state.get("version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        raise StateVersionError(
            f"this run state has version {version!r}; this agentloop reads versions "
            f"{', '.join(map(str, READ_VERSIONS))}"
        )
    body = {k: v for k, v in state.items() if k != "checksum"}
    try:
        text = _canonical(body)
    except (TypeError, ValueError) as exc:
        raise TamperedStateError(f"the run state holds a value JSON cannot: {exc}") from exc
    if state.get("checksum") != _checksum(text):
        raise TamperedStateError(
            "the run state's checksum does not match its content: it was changed after the "
            "run wrote it (or cut short), so it cannot be resumed"
        )
    try:
        shape = _Shape.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidStateError(f"the run state is malformed: {exc}") from exc
    return _read(shape)


def _read(shape: _Shape) -> PausedRun:
    try:
        messages = parse_history(shape.messages)
        finished = parse_history([{"role": "user", "content": shape.finished}])[0].blocks
    except HistoryError as exc:
        raise InvalidStateError(f"the run state's history is not valid: {exc}") from exc
    if not messages or messages[-1].role != "assistant" or not messages[-1].tool_uses:
        raise InvalidStateError("the run state's history does not end with the paused turn")
    results = [b for b in finished if isinstance(b, ToolResultBlock)]
    pending = [PendingCall(**p.model_dump()) for p in shape.pending]
    for call in pending:
        _check_sub_run(call)
    answered = [r.tool_use_id for r in results] + [p.tool_use_id for p in pending]
    order = [use.id for use in messages[-1].tool_uses]
    if len(results) != len(finished) or sorted(answered) != sorted(order) or not pending:
        raise InvalidStateError(
            "the run state's results and waiting calls do not match the paused turn's calls"
        )
    return PausedRun(
        run_id=shape.run_id,
        rounds=shape.rounds,
        usage=Usage(**shape.usage.model_dump()),
        messages=messages,
        finished=results,
        pending=pending,
        tool_calls=[ToolCallRecord(**r.model_dump()) for r in shape.tool_calls],
        container=shape.container,
        external=shape.external,
        cost=shape.cost,
        models=shape.models,
    )


def _check_sub_run(call: PendingCall) -> None:
    """A sub-agent's call holds a sub-run's state, itself sound; no other call holds one."""
    if (call.kind == "agent") != (call.run is not None):
        raise InvalidStateError(
            f"the run state's waiting call {call.tool_use_id!r} is of kind {call.kind!r} "
            f"{'with' if call.run is not None else 'without'} a sub-run's state"
        )
    if call.run is None:
        return
    try:
        load_state(call.run)
    except InvalidStateError as exc:
        raise type(exc)(f"the sub-run of call {call.tool_use_id!r} ('{call.name}'): {exc}") from exc


def _canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def _checksum(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


# -- the shape a state must have (after its checksum passed)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Usage(_Strict):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cache_creation_input_tokens: int = Field(ge=0)
    cache_read_input_tokens: int = Field(ge=0)
    requests: int = Field(ge=0)
    cache_creation_1h_input_tokens: int = Field(default=0, ge=0)
    uncounted_requests: int = Field(default=0, ge=0)
    batch_requests: int = Field(default=0, ge=0)


class _Pending(_Strict):
    tool_use_id: str
    name: str
    input: dict[str, Any]
    kind: Literal["approval", "external", "agent"]
    reason: str
    run: dict[str, Any] | None = None


class _Record(_Strict):
    round: int
    name: str
    input: Any
    tool_use_id: str
    is_error: bool
    output: str
    duration: float
    ran: bool = True


class _Shape(_Strict):
    format: str
    version: int
    run_id: str
    rounds: int = Field(ge=1)
    usage: _Usage
    messages: list[dict[str, Any]]
    finished: list[dict[str, Any]]
    pending: list[_Pending]
    tool_calls: list[_Record]
    container: str | None
    external: list[dict[str, Any]]
    cost: float | None = Field(default=None, ge=0)
    models: list[str] = Field(default_factory=list)  # absent from states written before
