"""Events a streamed run yields, in the order they happen.

`Agent.run_stream()` turns the loop into a sequence of these typed values: the model's
deltas as they arrive, tool calls as they become ready and finish, and a `RunFinished`
carrying the same `RunResult` that `Agent.run()` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from .messages import ContentBlock, ToolUseBlock
from .providers.base import BlockDelta, BlockStart, MessageStart, ModelResponse, StreamEvent
from .result import RunResult, SubAgentCall, Usage, sub_agent_path

if TYPE_CHECKING:
    from .calls import ToolResult

__all__ = (
    "ApprovalRequested",
    "Event",
    "ModelResponded",
    "ModelStreamEvent",
    "OutputReady",
    "PartialOutput",
    "RequestRetry",
    "RequestStarted",
    "ResponseReplaced",
    "ResponseWatch",
    "RoundFinished",
    "RunFinished",
    "RunStarted",
    "StepRestarted",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallReady",
    "ToolCallStarted",
    "ToolInputDelta",
    "ToolLog",
    "ToolProgress",
    "ToolResultEvent",
    "ToolUserContent",
    "friendly_event",
)


@dataclass(frozen=True)
class RunStarted:
    """The run began."""

    run_id: str


@dataclass(frozen=True)
class RequestStarted:
    """A model request is about to be sent."""

    round: int
    """Which request of the run, from 1."""


@dataclass(frozen=True)
class RequestRetry:
    """A model request failed in a way worth retrying, and is sent again after `wait`.

    The provider retries a lost or refused connection, a timeout, 408, 409, 429 and 5xx
    answers (overloaded included) as often as the client's `max_retries` allows; a
    streamed request only until its first content arrived.
    """

    attempt: int
    """Which retry this is, from 1."""
    wait: float
    """Seconds waited before sending again: the API's `retry-after`, or the backoff."""
    reason: str
    """Why, in a few words: "connection refused", "429 rate limited", "529 overloaded"."""


@dataclass(frozen=True)
class TextDelta:
    """More text of a text block."""

    round: int
    index: int
    """Position of the block in the assistant message."""
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """More text of a thinking block."""

    round: int
    index: int
    thinking: str


@dataclass(frozen=True)
class ToolCallStarted:
    """The model began writing a tool call; its input follows as `ToolInputDelta`s."""

    round: int
    index: int
    tool_use_id: str
    name: str


@dataclass(frozen=True)
class ToolInputDelta:
    """A fragment of a tool call's input JSON (not valid JSON on its own)."""

    round: int
    index: int
    tool_use_id: str
    partial_json: str


@dataclass(frozen=True)
class ToolCallReady:
    """A tool call's input is complete; the call starts now unless it must wait."""

    round: int
    tool_use_id: str
    name: str
    input: dict[str, Any]
    eager: bool
    """Whether it starts before the model's message is complete."""


@dataclass(frozen=True)
class ApprovalRequested:
    """A tool call waits for a person's decision; it does not run in this run.

    The run ends after the turn's other calls with `stop_reason="approval_required"`;
    the call is in `RunResult.approvals`, and `Agent.resume` continues with the decision.
    """

    round: int
    tool_use_id: str
    name: str
    input: dict[str, Any]
    reason: str
    """Why it needs approval."""
    via: tuple[SubAgentCall, ...] = ()
    """The sub-agent calls it is inside, outermost first (see `ApprovalRequest.via`); the
    round is that of the outermost one."""

    def __post_init__(self) -> None:
        """Read `via` back from JSON (lists) as well."""
        object.__setattr__(self, "via", sub_agent_path(self.via))


@dataclass(frozen=True)
class ToolResultEvent:
    """A tool call finished (or was answered without running)."""

    round: int
    tool_use_id: str
    name: str
    is_error: bool
    output: str
    duration: float

    @classmethod
    def of(cls, round_: int, result: ToolResult) -> ToolResultEvent:
        """The event of `result`, a result of round `round_` (as sent: `tools.sendable`)."""
        return cls(
            round_, result.tool_use_id, result.name, result.is_error, result.text, result.duration
        )


@dataclass(frozen=True)
class ToolProgress:
    """A running tool call reported how far it got (`agentloop.progress.report_progress`)."""

    round: int
    tool_use_id: str
    name: str
    progress: float
    """How far it got; grows with each report of the call."""
    total: float | None = None
    """The value `progress` reaches at the end, when known."""
    message: str | None = None
    """What it is doing, in words."""


@dataclass(frozen=True)
class ToolUserContent:
    """Content a running tool call shows the user, and not the model (`RunContext.emit`).

    The model's tool_result does not hold it: a tool whose source marks some of its output
    for the user's eyes only reports that part this way, and the rest as its result.
    """

    round: int
    tool_use_id: str
    name: str
    content: tuple[ContentBlock, ...]
    """The blocks, in the order the tool gave them (text, images, documents)."""


@dataclass(frozen=True)
class ToolLog:
    """A log message from the service a tool works with, while a call of the run was running.

    A tool reports it with `RunContext.emit`: a server's log notification, say. `round`,
    `tool_use_id` and `name` are those of the run's call it came during.
    """

    round: int
    tool_use_id: str
    name: str
    level: str
    """The sender's level: `debug`, `info`, `notice`, `warning`, `error`, `critical`, ..."""
    data: Any
    """What was logged: a string or any JSON value."""
    logger: str | None = None
    """The name of the sender's logger, when it gave one."""
    source: str = ""
    """Who sent it, in the form of `Tool.source` (the plugin and its server, say)."""


@dataclass(frozen=True)
class ModelStreamEvent:
    """A streamed model event exactly as the provider reported it.

    For consumers that rebuild the model's own stream (a gateway, a proxy): message
    start, block start, delta and stop, with the block's index in the response. The
    friendlier `TextDelta`, `ToolCallStarted`, ... are derived from these.
    """

    round: int
    event: StreamEvent


@dataclass(frozen=True)
class ModelResponded:
    """A model response is complete, before its tool calls are answered.

    `response` carries the content verbatim, the usage of this request and the HTTP
    response headers (`ModelResponse.headers`) where the provider has them.
    """

    round: int
    response: ModelResponse


@dataclass(frozen=True)
class ResponseReplaced:
    """The response streamed so far in this round is void: the request was sent again.

    A capability sends a round's request again (`agentloop.capabilities.Retries`) or to
    another model (`Fallback`) after its response failed part way or was refused: drop
    what was shown of it (its deltas since the round's `RequestStarted`, or since the
    last `ResponseReplaced`). The response that streams next is the round's. It never
    follows a streamed tool call: a request is not sent again once one was.
    """

    round: int
    attempt: int
    """Which attempt at the round's request streams next (2 for the first replacement)."""


@dataclass(frozen=True)
class RoundFinished:
    """A model response is complete and its tool calls answered."""

    round: int
    stop_reason: str | None
    usage: Usage
    """This round's usage only."""


@dataclass(frozen=True)
class PartialOutput:
    """The typed output so far, partially validated, while the model writes it.

    Sent when the output's JSON has grown by half since the last check and what is there
    validates (pydantic's partial validation: an unfinished last item of a list or dict
    is left out; a required field not yet written means no event yet).
    """

    round: int
    output: Any


@dataclass(frozen=True)
class OutputReady:
    """The model's output passed validation (and the output validators): the run ends."""

    round: int
    output: Any


@dataclass(frozen=True)
class StepRestarted:
    """A step of a durable run is performed again: its earlier attempt's events are void.

    Only a durable run's stream (`agentloop.durable`) has these. When the worker running a
    step dies (or the step fails and is retried), the step runs again from its start, and
    the events its earlier attempt streamed (the model's deltas of that round, or a tool
    call's progress and result) did not make it into the run: drop what was shown for them.
    """

    round: int
    tool_use_id: str | None
    """The call whose tool runs again, or None for the model request of the round."""
    attempt: int
    """Which attempt this is; it grows with each one."""


@dataclass(frozen=True)
class RunFinished:
    """The run ended; `result` is what `Agent.run()` would have returned."""

    result: RunResult


Event = Union[  # noqa: UP007 (readable as a list)
    RunStarted,
    RequestStarted,
    RequestRetry,
    TextDelta,
    ThinkingDelta,
    ToolCallStarted,
    ToolInputDelta,
    ToolCallReady,
    ApprovalRequested,
    ToolProgress,
    ToolUserContent,
    ToolLog,
    ToolResultEvent,
    ModelStreamEvent,
    ModelResponded,
    ResponseReplaced,
    RoundFinished,
    PartialOutput,
    OutputReady,
    StepRestarted,
    RunFinished,
]
"""Any event of a streamed run."""


class ResponseWatch:
    """Watches the streamed events of one round's request for a response that starts over.

    A capability may send the request again (`Retries`, `Fallback`): the next response
    begins with its `MessageStart` (a provider that sends none begins with block 0), and
    a response's blocks begin in order. Both a streamed run's turn and a durable run's
    model step use it to say `ResponseReplaced` where that happens.
    """

    def __init__(self, round_: int) -> None:
        """A watch over the responses of round `round_`."""
        self.round = round_
        self.attempt = 1
        """Which response to the round's request is streaming."""
        self._last_block = -1  # the highest block index the response began
        self._message_started = False

    def replaced(self, event: StreamEvent) -> ResponseReplaced | None:
        """The `ResponseReplaced` to report before `event`, or None.

        One is reported when `event` opens another response after one that had begun a
        block (a response that showed nothing is dropped silently).
        """
        again = False
        if isinstance(event, MessageStart):
            again = self._message_started or self._last_block >= 0
            self._message_started = True
        elif isinstance(event, BlockStart):
            again = event.index <= self._last_block
        shown = again and self._last_block >= 0
        if again:
            self._last_block = -1
        if isinstance(event, BlockStart):
            self._last_block = event.index
        if not shown:
            return None
        self.attempt += 1
        return ResponseReplaced(self.round, self.attempt)


def friendly_event(round_: int, event: StreamEvent, tool_ids: dict[int, str]) -> Event | None:
    """The `TextDelta`, `ThinkingDelta`, `ToolCallStarted` or `ToolInputDelta` of `event`.

    `event` is a streamed model event of round `round_`; None when it makes none of them.
    `tool_ids` maps the index of each tool_use block begun so far to its id (this fills it).
    """
    if isinstance(event, BlockDelta):
        if event.kind == "text":
            return TextDelta(round_, event.index, event.value)
        if event.kind == "thinking":
            return ThinkingDelta(round_, event.index, event.value)
        if event.kind == "input_json" and event.index in tool_ids:
            return ToolInputDelta(round_, event.index, tool_ids[event.index], event.value)
    elif isinstance(event, BlockStart) and isinstance(event.block, ToolUseBlock):
        tool_ids[event.index] = event.block.id
        return ToolCallStarted(round_, event.index, event.block.id, event.block.name)
    return None
