"""What a run produces: its `RunResult`, the log of its tool calls, and token `Usage`.

These are plain values at the bottom of the package: the loop fills them, errors carry
them (`AgentloopError.result`), stream events hand them over, and providers report
`Usage`. They import nothing else from agentloop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Generic, Literal, NamedTuple, Union

from typing_extensions import TypeVar

__all__ = (
    "ApprovalRequest",
    "OutputT",
    "RunResult",
    "Spent",
    "StopReason",
    "SubAgentCall",
    "ToolCallRecord",
    "Usage",
    "sub_agent_path",
)

OutputT = TypeVar("OutputT", default=str)
"""The type of a run's output (`Agent(output_type=...)`); `str` unless one is given."""

StopReason = Union[  # noqa: UP007 (readable as a list)
    Literal[
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "approval_required",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
        "max_rounds",
        "tool_error",
        "usage_limit",
        "cancelled",
        "error",
        "running",
    ],
    str,
]
"""Why a run ended: the model's last stop reason as the provider maps it ("end_turn",
"max_tokens", "stop_sequence", "refusal", "model_context_window_exceeded", "pause_turn";
"tool_use" when calls of external tools are handed back, "approval_required" when calls
wait for a decision; `str` for a value the API adds later), or agentloop's own
"max_rounds", "tool_error", "usage_limit", "cancelled" or "error"; "running" in the result
of a run that has not ended yet (`Run.result` read while it runs)."""


@dataclass(frozen=True)
class Usage:
    """Token counts of one response, or summed over a run.

    A response that came without counts (a stream from a server that does not report
    usage in streams, such as llama-cpp-python's) is counted in `requests` and in
    `uncounted_requests`, with 0 tokens: the counts are then a floor, not the total, and
    `tokens_known` is False.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    requests: int = 0
    """How many model requests these counts cover."""
    cache_creation_1h_input_tokens: int = 0
    """The part of `cache_creation_input_tokens` written with a 1-hour TTL (priced higher
    than 5-minute writes); from the API's `cache_creation.ephemeral_1h_input_tokens`."""
    uncounted_requests: int = 0
    """How many of `requests` came back without token counts: their tokens are unknown,
    and not in the counts above."""
    batch_requests: int = 0
    """How many of `requests` the Message Batches API answered (usage `service_tier:
    "batch"`): priced at the batch rate (see docs/batches.md)."""

    @classmethod
    def from_wire(cls, usage: Mapping[str, Any] | None) -> Usage:
        """Counts from an Anthropic `usage` object (missing or null fields count as 0)."""
        usage = usage if isinstance(usage, Mapping) else {}
        split = usage.get("cache_creation")
        split = split if isinstance(split, Mapping) else {}
        return cls(
            input_tokens=_count(usage.get("input_tokens")),
            output_tokens=_count(usage.get("output_tokens")),
            cache_creation_input_tokens=_count(usage.get("cache_creation_input_tokens")),
            cache_read_input_tokens=_count(usage.get("cache_read_input_tokens")),
            requests=1,
            cache_creation_1h_input_tokens=_count(split.get("ephemeral_1h_input_tokens")),
            batch_requests=int(usage.get("service_tier") == "batch"),
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            self.cache_read_input_tokens + other.cache_read_input_tokens,
            self.requests + other.requests,
            self.cache_creation_1h_input_tokens + other.cache_creation_1h_input_tokens,
            self.uncounted_requests + other.uncounted_requests,
            self.batch_requests + other.batch_requests,
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens - other.input_tokens,
            self.output_tokens - other.output_tokens,
            self.cache_creation_input_tokens - other.cache_creation_input_tokens,
            self.cache_read_input_tokens - other.cache_read_input_tokens,
            self.requests - other.requests,
            self.cache_creation_1h_input_tokens - other.cache_creation_1h_input_tokens,
            self.uncounted_requests - other.uncounted_requests,
            self.batch_requests - other.batch_requests,
        )

    @property
    def tokens_known(self) -> bool:
        """Whether every request's tokens are counted (no `uncounted_requests`)."""
        return self.uncounted_requests == 0

    @property
    def total_tokens(self) -> int:
        """Input (including cache reads and writes) plus output tokens."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


_USAGE_FIELDS = frozenset(f.name for f in fields(Usage))


@dataclass(frozen=True)
class Spent:
    """What a run spent: tokens, dollars (None: unknown), tool calls."""

    usage: Usage = field(default_factory=Usage)
    cost: float | None = 0.0
    tool_calls: int = 0

    def __add__(self, other: Spent) -> Spent:
        cost = None if self.cost is None or other.cost is None else self.cost + other.cost
        return Spent(self.usage + other.usage, cost, self.tool_calls + other.tool_calls)

    def __sub__(self, other: Spent) -> Spent:
        cost = None if self.cost is None or other.cost is None else self.cost - other.cost
        return Spent(self.usage - other.usage, cost, self.tool_calls - other.tool_calls)

    @property
    def nothing(self) -> bool:
        """No tokens and no calls (a None cost then says only that the price was unknown)."""
        return self.usage == Usage() and self.tool_calls == 0 and self.cost in (0.0, None)

    def to_json(self) -> dict[str, Any]:
        """As plain JSON values (how a durable run records it with a call's result)."""
        return {"usage": asdict(self.usage), "cost": self.cost, "tool_calls": self.tool_calls}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spent:
        """What `to_json` wrote.

        Raises:
            KeyError, TypeError: `data` is not what `to_json` writes.
        """
        usage = {k: v for k, v in data["usage"].items() if k in _USAGE_FIELDS}
        cost = data["cost"]
        return cls(Usage(**usage), None if cost is None else float(cost), int(data["tool_calls"]))


def _count(value: Any) -> int:
    """A token count from the wire; anything that is not a count is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of a run, as logged in `RunResult.tool_calls`."""

    round: int
    name: str
    input: Any
    """The input the model sent (an object, unless the model sent something else)."""
    tool_use_id: str
    is_error: bool
    output: str
    """What the model was sent (block content rendered as text)."""
    duration: float
    """Seconds the tool ran."""
    ran: bool = True
    """False when the call was answered without running its tool (cut off, refused,
    denied, cancelled before it started, ...); what a tool's `max_uses` counts."""


class SubAgentCall(NamedTuple):
    """A call of a sub-agent (`Agent.as_tool`) whose run waits for a call inside it."""

    name: str
    """The sub-agent's tool name."""
    tool_use_id: str
    """The id of the call, in the run that made it."""


def sub_agent_path(value: Any) -> tuple[SubAgentCall, ...]:
    """`value` (sub-agent calls, or their JSON form: `[name, tool_use_id]` pairs) as a path."""
    return tuple(SubAgentCall(*call) for call in value)


@dataclass(frozen=True)
class ApprovalRequest:
    """A call that waits for a person's decision (`RunResult.approvals`)."""

    tool_use_id: str
    name: str
    """The tool the model called."""
    input: dict[str, Any]
    """The input the model sent."""
    reason: str
    """Why the call needs approval (which setting asked for it, or what its rule said)."""
    via: tuple[SubAgentCall, ...] = ()
    """The sub-agent calls the call is inside, outermost first: empty for a call of the
    run itself; `(SubAgentCall("researcher", "toolu_1"),)` for a call the `researcher`
    sub-agent's run made while answering the run's call `toolu_1`."""

    def __post_init__(self) -> None:
        """Read `via` back from JSON (lists) as well."""
        object.__setattr__(self, "via", sub_agent_path(self.via))


@dataclass
class RunResult(Generic[OutputT]):
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
    pending: list[dict[str, Any]] = field(default_factory=list)
    """Calls of external tools the run handed back (`stop_reason="tool_use"`, or
    `"approval_required"` when calls of the same turn also wait for approval), as the
    `tool_use` blocks the model sent; `messages` then ends with their assistant message."""
    held: list[dict[str, Any]] = field(default_factory=list)
    """The `tool_result` blocks of the same turn's own tool calls, kept for the user
    message that will answer every call of that turn (see `Agent.run`'s
    `external_tools`)."""
    approvals: list[ApprovalRequest] = field(default_factory=list)
    """Calls waiting for a decision (`stop_reason="approval_required"`), in the model's
    order; answer them with `Agent.resume(result.state, decisions=...)`."""
    state: dict[str, Any] | None = None
    """When calls wait (approval or external tools): everything needed to continue the run
    with `Agent.resume`, as plain JSON values (`json.dumps` takes it as it is). None
    otherwise."""
    output: OutputT = field(default=None)  # type: ignore[assignment]  # set by every run
    """The run's validated output, of the agent's (or the run's) `output_type`; the final
    text for `str`, the default. None in a partial result and when calls are handed back
    (`stop_reason="tool_use"`)."""
    cost: float | None = None
    """What the run's requests cost in US dollars (cache reads and writes priced as
    such), from the `genai-prices` table; None when the table does not know the model or
    the provider (see `agentloop.pricing`)."""
    stop_sequence: str | None = None
    """Which of the request's `stop_sequences` the last response stopped at (when its
    stop reason is "stop_sequence"); None otherwise, and from a Chat Completions server,
    which does not say."""
    container: str | None = None
    """The id of the code-execution container the run's responses last named: send it
    as the next request's `container` to reuse the container. None when none was named."""
    unenforced_limits: tuple[str, ...] = ()
    """The `UsageLimits` fields the run could not hold it to (`"input_tokens"`,
    `"output_tokens"`, `"total_tokens"`, `"cost_usd"`): those it set, once a response
    came without token counts (`usage.tokens_known` is False). Empty otherwise."""
    models: list[str] = field(default_factory=list)
    """The model that answered each round, in order: one entry per response the run
    kept (a round whose request failed has none), the model the response names, or the
    model its request named when it names none. A fallback's rounds name the fallback's
    model (see `agentloop.capabilities.Fallback`)."""
