"""Every exception agentloop raises, drawn in one place.

Two channels leave a run. What the *model* sees: a tool raises `ToolError` and the model
gets an `is_error` tool_result with exactly that message. What the *caller* sees: every
other class below, all subclasses of `AgentloopError`.

```
ToolError                      raised by a tool or an output validator: the model gets the message
└── ModelRetry                 deprecated name of ToolError
AgentloopError
├── ConfigurationError         a mistake in how agentloop was set up
│   ├── DuplicateToolError     two tools share one name
│   └── VersionMismatchError   a durable run under way belongs to another application version
├── HistoryError               a history the API would reject (the linter's verdict)
├── ProviderError              the model API failed; the SDK exception is the __cause__
│   ├── MissingAPIKeyError     no credentials at all, raised before any request
│   ├── AuthenticationError    the API refused the credentials
│   ├── CreditBalanceError     the account has no credit left
│   ├── RateLimitError         429 after the client's retries
│   ├── OverloadedError        529 after the client's retries
│   ├── APIConnectionError     no (whole) answer: refused, dropped, timed out, cut short
│   ├── InvalidResponseError   an answer that cannot be read (malformed JSON)
│   ├── BadRequestError        4xx: the request itself was refused
│   ├── ServerError            5xx after the client's retries
│   └── BatchRequestError      a message batch's request was canceled or expired
├── RunError                   a run ended early; carries the partial RunResult
│   ├── ToolCallFailed         on_tool_error="stop" and a tool call failed
│   ├── UsageLimitExceeded     a run went (or its next request would go) over its UsageLimits
│   ├── OutputValidationError  the model gave no valid output within `output_retries`
│   ├── GuardrailTripped       a guardrail refused the run's input or output, or ended it at a call
│   └── RecoveryLimitExceeded  a durable run's process died too often: its engine gave up on it
├── ResumeError                a paused run cannot be resumed as asked; nothing was changed
│   ├── InvalidStateError      the state is not a run state, or does not hold together
│   │   ├── StateVersionError  written by an incompatible version of agentloop
│   │   └── TamperedStateError changed after the run wrote it (its checksum fails)
│   └── DecisionError          a decision or result for an unknown call, one missing, a bad one
└── SessionError               a session store failed or holds something unreadable
    └── SessionConflict        the session changed since the run loaded it; nothing stored
```

Errors raised while a run is under way carry the partial `RunResult` as `.result` (its
history is valid to send again and its usage counts every request made).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .result import RunResult

__all__ = (
    "APIConnectionError",
    "AgentloopError",
    "AuthenticationError",
    "BadRequestError",
    "BatchRequestError",
    "ConfigurationError",
    "CreditBalanceError",
    "DecisionError",
    "DuplicateToolError",
    "GuardrailTripped",
    "HistoryError",
    "InvalidResponseError",
    "InvalidStateError",
    "MissingAPIKeyError",
    "ModelRetry",
    "OutputValidationError",
    "OverloadedError",
    "ProviderError",
    "RateLimitError",
    "RecoveryLimitExceeded",
    "ResumeError",
    "RunError",
    "ServerError",
    "SessionConflict",
    "SessionError",
    "StateVersionError",
    "TamperedStateError",
    "ToolCallFailed",
    "ToolError",
    "UsageLimitExceeded",
    "VersionMismatchError",
    "api_error",
)


class ToolError(Exception):
    """Raise inside a tool to send the model an error it can act on.

    The model receives a tool_result with `is_error: true` whose content is exactly
    `message`. Use it for expected failures ("city not found, try a country code"); any
    other exception is reported to the model by type and message only.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelRetry(ToolError):
    """Deprecated: raise `ToolError`, which does the same from a tool or an output validator.

    It still works as a `ToolError`, and warns once made.
    """

    def __init__(self, message: str) -> None:
        warnings.warn(
            "ModelRetry is deprecated: raise ToolError(message), which sends the model "
            "back from a tool and from an output validator alike",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(message)


class AgentloopError(Exception):
    """Base class of every error agentloop raises to its caller."""

    result: RunResult | None = None
    """The partial result of the run this error ended, when it ended one."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as it is, attributes included, without calling __init__ (whose
        # keyword-only arguments differ by class): a durable engine records a run's error
        # and raises it again in the process that asks for the run's result.
        return (_restore, (type(self), self.args, self.__dict__))


def _restore(cls: type[AgentloopError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An error `AgentloopError.__reduce__` pickled."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigurationError(AgentloopError):
    """agentloop was set up in a way that cannot work (a bad tool, a bad option)."""


class DuplicateToolError(ConfigurationError):
    """Two tools were registered under one name; the model addresses tools by name."""


class VersionMismatchError(ConfigurationError):
    """A durable run is under way on another application version than this process's.

    A workflow engine hands a run only to a process of the version that started it (DBOS
    recovers and dequeues the runs of its own `application_version`), so no process of
    this version would ever finish it: waiting for it would hang. The message names both
    versions and how to drain the old one (see "Rolling upgrades" in the durable docs).
    """

    def __init__(self, message: str, *, run_id: str, run_version: str, version: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        """The run."""
        self.run_version = run_version
        """The application version the run belongs to."""
        self.version = version
        """This process's application version."""


class HistoryError(AgentloopError, ValueError):
    """A history breaks a rule the Messages API enforces.

    The message uses the API's own wording and paths (`messages.3.content.1: ...`), with
    consecutive messages of one role counted as one, as the API counts them.
    """

    def __init__(self, message: str, *, path: str = "", index: int | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        """Where the problem is, as the API would write it (`messages.2.content.0`)."""
        self.index = index
        """Index of the offending message in the list that was checked (not merged)."""


class ProviderError(AgentloopError):
    """The model API failed. The SDK's own exception is kept as `__cause__`."""

    tool_use_streamed: bool = False
    """Whether the failed response had streamed a whole `tool_use` block to the run
    before it failed: a streamed run may have started that call already, so the request
    is not sent again (`agentloop.capabilities.Retries` and `Fallback` give up on such a
    failure)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        request_id: str | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        """HTTP status, when the API answered at all."""
        self.request_id = request_id
        """The API's request id, for support tickets."""
        self.body = body
        """The decoded error body, when there was one."""
        self.headers: Mapping[str, str] = dict(headers or {})
        """The error answer's HTTP headers, names lower-cased (`retry-after`,
        `request-id`, ...); empty when there was no HTTP answer."""


class MissingAPIKeyError(ProviderError):
    """No API key or other credentials were configured; no request was sent."""


class AuthenticationError(ProviderError):
    """The API refused the credentials (401) or their permissions (403)."""


class CreditBalanceError(ProviderError):
    """The account's credit balance is exhausted; add credits before retrying."""


class RateLimitError(ProviderError):
    """429: too many requests or tokens, still so after the client's retries."""


class OverloadedError(ProviderError):
    """529: the API is overloaded, still so after the client's retries."""


class APIConnectionError(ProviderError):
    """The API could not be reached or did not answer in time."""


class InvalidResponseError(ProviderError):
    """The API's answer could not be read (for example malformed JSON)."""


class BadRequestError(ProviderError):
    """4xx: the API refused the request itself (its message says why); not retried."""


class ServerError(ProviderError):
    """5xx: the API failed, still so after the client's retries."""


class BatchRequestError(ProviderError):
    """A request of a message batch came back without a response: canceled or expired."""


class RunError(AgentloopError):
    """A run ended before the model finished; `result` holds what was done."""

    def __init__(self, message: str, *, result: RunResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class ToolCallFailed(RunError):
    """A tool call failed under `on_tool_error="stop"`.

    The history in `result.messages` is complete: every tool_use of the last turn has its
    tool_result, so it can be sent again as is.
    """


class UsageLimitExceeded(RunError):
    """A run went over one of its `UsageLimits`, or its next request certainly would have.

    `result` is the partial run (`stop_reason="usage_limit"`): its usage counts every
    request made, and its history is valid to send again, every `tool_use` answered.
    """

    def __init__(
        self,
        message: str,
        *,
        limit: str,
        bound: float,
        value: float,
        sent: bool = True,
        result: RunResult | None = None,
    ) -> None:
        super().__init__(message, result=result)
        self.limit = limit
        """The `UsageLimits` field that was gone over (`"input_tokens"`, `"cost_usd"`, ...)."""
        self.bound = bound
        """That field's value."""
        self.value = value
        """The total that went over `bound`; for a request that was not sent, the least
        it would have reached."""
        self.sent = sent
        """False when the request that would have gone over was not sent."""


class ResumeError(AgentloopError):
    """`Agent.resume` cannot continue the paused run as asked.

    Raised before anything happens: no call ran, no request was sent, and the state
    given is unchanged, so the caller can fix what is wrong and resume again.
    """


class InvalidStateError(ResumeError):
    """The state is not a run state (`RunResult.state`), or its parts do not hold together."""


class StateVersionError(InvalidStateError):
    """The state was written by a version of agentloop whose states this one cannot read."""


class TamperedStateError(InvalidStateError):
    """The state changed after the run wrote it: its checksum does not match its content.

    The checksum catches accidents and edits (a state cut short, edited by hand, mixed
    up by a store); it is not a signature against someone who recomputes it.
    """


class DecisionError(ResumeError):
    """The decisions or results do not answer the waiting calls as they must.

    A decision or result for an id that is not waiting, a waiting call left without one,
    a decision for an external call (or a result for one that waits for approval), or an
    edited input the tool refuses.
    """


class SessionError(AgentloopError):
    """A session store failed, or holds data this version cannot read."""

    def __init__(self, message: str, *, result: RunResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class SessionConflict(SessionError):
    """Another run appended to (or cleared) the session since this run loaded it.

    Nothing of this run was stored; `result` holds the run's result, so nothing is lost:
    load the session again and run again (or store what you choose).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str,
        expected: int,
        actual: int,
        result: RunResult | None = None,
    ) -> None:
        super().__init__(message, result=result)
        self.session_id = session_id
        """The session that changed."""
        self.expected = expected
        """The version the run loaded."""
        self.actual = actual
        """The version the session had when the run tried to append."""


class OutputValidationError(RunError):
    """The model gave no valid output: every try failed validation, or the run ended first.

    `result` holds the partial run: its history is valid to send again (the last invalid
    answer is in it, its failure answered) and `result.output` is None.
    """

    def __init__(
        self, message: str, *, problems: str = "", result: RunResult | None = None
    ) -> None:
        super().__init__(message, result=result)
        self.problems = problems
        """What was wrong with the last try, as the model was (or would have been) told."""


class GuardrailTripped(RunError):
    """A guardrail refused the run's input or output, or ended the run at a tool call.

    See `agentloop.capabilities.guardrails`; a tool guardrail ends the run only when made
    with `end_run=True`.

    `result` is the partial run (`stop_reason="error"`): its history is valid to send
    again, and no tool ran after the trip.
    """

    def __init__(self, message: str, *, guardrail: str, result: RunResult | None = None) -> None:
        super().__init__(f"guardrail {guardrail!r} tripped: {message}", result=result)
        self.guardrail = guardrail
        """The name of the guardrail that tripped."""
        self.message = message
        """What it said (or, when its check failed, what went wrong)."""


class RecoveryLimitExceeded(RunError):
    """A durable run was started again and again without finishing, and its engine gave up.

    Each time its process died (a crashing tool, memory), the engine recovered the run;
    after `max_recovery_attempts` recoveries it stops trying and leaves the run as it is
    (DBOS: its workflow status is `MAX_RECOVERY_ATTEMPTS_EXCEEDED`). The engine's own
    error is the `__cause__`. `result` holds the run as its recorded steps leave it, when
    they can be read back. Once the cause is fixed, `DBOS.resume_workflow(run_id)` runs it
    again from its last recorded step.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        max_recovery_attempts: int,
        result: RunResult | None = None,
    ) -> None:
        super().__init__(message, result=result)
        self.run_id = run_id
        """The run given up on."""
        self.max_recovery_attempts = max_recovery_attempts
        """The recoveries its engine allowed (`DurableAgent(max_recovery_attempts=...)`)."""


def api_error(
    status: int | None,
    body: Any = None,
    *,
    message: str = "",
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ProviderError:
    """The agentloop error for an API's error answer: an HTTP status and its error body.

    The one mapping from the wire to this tree, shared by every provider and by the test
    doubles in `agentloop.testing`, so they cannot drift apart. `body` is the decoded
    error body (`{"type": "error", "error": {"type": ..., "message": ...}}` or the
    Chat Completions shape `{"error": {"type"/"code": ..., "message": ...}}`); `message`
    is used when the body has none. `status` is None for an error event inside a stream.
    Bedrock's stream exceptions (`throttlingException`, ...) count as the API's types.
    """
    kind, detail = _error_fields(body)
    detail = detail or message or "no error message"
    family = _BEDROCK_STREAM_ERRORS.get(kind, kind)
    cls: type[ProviderError]
    if family == "billing_error" or status == 402 or "credit balance" in detail.lower():
        cls = CreditBalanceError
    elif status in (401, 403) or family in ("authentication_error", "permission_error"):
        cls = AuthenticationError
    elif status == 429 or family == "rate_limit_error":
        cls = RateLimitError
    elif status == 529 or family == "overloaded_error":
        cls = OverloadedError
    elif status is not None and 400 <= status < 500:
        cls = BadRequestError
    elif (status is not None and status >= 500) or family == "api_error":
        cls = ServerError
    elif family == "invalid_request_error":
        cls = BadRequestError
    else:
        cls = ProviderError
    if cls is CreditBalanceError and not detail.lower().startswith("credit balance"):
        detail = f"credit balance exhausted: {detail}"
    prefix = f"{status} {kind or 'error'}: " if status else f"{kind or 'error'}: "
    return cls(
        prefix + detail, status_code=status, request_id=request_id, body=body, headers=headers
    )


_BEDROCK_STREAM_ERRORS = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
    "modelTimeoutException": "api_error",
    "validationException": "invalid_request_error",
}
"""The Messages API error type each exception of a Bedrock stream stands for."""


def _error_fields(body: Any) -> tuple[str, str]:
    """The error type and message of an error body ("" where absent)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", ""
    kind = error.get("type") or error.get("code") or ""
    text = error.get("message") or ""
    return (str(kind) if isinstance(kind, (str, int)) else ""), (
        text if isinstance(text, str) else ""
    )
