"""A run's result, or its failure, through the result of its workflow.

The workflow returns the run's result as JSON values (`agentloop.durable.records`); a run
that failed fails its workflow with an `ApplicationError` named after the agentloop error,
carrying the error's fields and the partial result. `result_of` turns either back into
what `Agent.run` gives or raises.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from agentloop import errors
from agentloop.durable.records import result_from_json
from agentloop.durable.temporal.carry import restored_result
from agentloop.errors import AgentloopError
from agentloop.result import RunResult

__all__ = ("ERROR_FIELDS", "error_of", "result_of")

ERROR_FIELDS = ("status_code", "request_id", "body", "headers", "limit", "bound", "value", "sent")
"""The attributes of an agentloop error that travel with a failed workflow (JSON values)."""


async def result_of(handle: WorkflowHandle[Any, Any], output_type: Any = str) -> RunResult[Any]:
    """The result of a run's workflow; its failure raised as the agentloop error it was.

    `output_type` is the agent's (`Agent.output_type`): the output is read back as one.
    """
    try:
        data = await handle.result()
    except WorkflowFailureError as exc:
        cause = exc.cause
        if not isinstance(cause, ApplicationError):
            raise
        error = error_of(cause)
        if error is None:
            raise
        details = cause.details[0] if cause.details else {}
        partial = details.get("result") if isinstance(details, dict) else None
        error.result = (
            None if partial is None else result_from_json(restored_result(partial), output_type)
        )
        raise error from exc
    return result_from_json(restored_result(data), output_type)


def error_of(failure: ApplicationError) -> AgentloopError | None:
    """The agentloop error `failure` is named after, with its fields; None if it names none."""
    error_class = getattr(errors, failure.type or "", None)
    if not (isinstance(error_class, type) and issubclass(error_class, AgentloopError)):
        return None
    details = failure.details[0] if failure.details else {}
    details = details if isinstance(details, dict) else {}
    error: AgentloopError = error_class(failure.message, **details.get("fields", {}))
    return error
