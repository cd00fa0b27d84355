"""The state of a paused run, as plain JSON values, and the checks it passes to come back.

A run that ends with calls waiting (for approval, or for the caller to run them) hands
over `RunResult.state`: a versioned dict holding everything `Agent.resume` needs (the
history, the turn's finished results, the waiting calls, usage, rounds, the run's id). It
can be stored anywhere JSON goes and resumed by another process with another `Agent` of
the same configuration.

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

from .errors import HistoryError, InvalidStateError, StateVersionError, TamperedStateError
from .messages import Message, ToolResultBlock, parse_history
from .result import ToolCallRecord, Usage
from .tools import ToolCall, ToolResult

__all__ = ("STATE_FORMAT", "STATE_VERSION", "PausedRun", "PendingCall", "dump_state", "load_state")

STATE_FORMAT = "agentloop.run_state"
"""The `format` field of every run state."""

STATE_VERSION = 1
"""The state version this agentloop writes and reads."""


@dataclass(frozen=True)
class PendingCall:
    """A call of the paused turn that waits for the caller."""

    tool_use_id: str
    name: str
    input: dict[str, Any]
    kind: Literal["approval", "external"]
    reason: str


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
    answers: Mapping[str, ToolCall | ToolResult] = field(default_factory=dict)
    """How each waiting call is answered when the run resumes, by id: the call to run
    (approved, its input perhaps edited) or its result (denied, or an external result)."""

    @property
    def order(self) -> list[str]:
        """The ids of the paused turn's calls, in the model's order."""
        return [use.id for use in self.messages[-1].tool_uses]


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
    if version != STATE_VERSION or isinstance(version, bool):
        raise StateVersionError(
            f"this run state has version {version!r}; this agentloop reads version "
            f"{STATE_VERSION} only"
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
    )


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


class _Pending(_Strict):
    tool_use_id: str
    name: str
    input: dict[str, Any]
    kind: Literal["approval", "external"]
    reason: str


class _Record(_Strict):
    round: int
    name: str
    input: Any
    tool_use_id: str
    is_error: bool
    output: str
    duration: float


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
