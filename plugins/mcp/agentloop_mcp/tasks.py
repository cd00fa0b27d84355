"""Tool calls a server runs as tasks: the `io.modelcontextprotocol/tasks` extension.

Every connection declares the extension, so a server on the 2026-07-28 protocol may answer
a `tools/call` with a task handle instead of its result. The SDK hands that handle to the
claim made here, inside the call's own task (`ServerConnection`'s worker): it polls
`tasks/get` at the server's `pollIntervalMs` until the task ends and returns the task's
`CallToolResult`, so the rest of the flow (content, errors, retries) is that of any call.
A call that is cancelled or times out while its task runs cancels the task on the server
(`tasks/cancel`).

The 2025-11-25 protocol's tasks (a `task` field on the call, then `tasks/result`) are
types only in the SDK, which reads every `tools/call` answer on that protocol as a
`CallToolResult`; a tool that must run as a task there is left out (see `source.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Literal

import anyio
import mcp.types as mcp_types
from agentloop.logs import get_logger
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim

__all__ = (
    "TASKS_EXTENSION",
    "TaskHandle",
    "TaskState",
    "TasksExtension",
    "finish_task",
    "task_alive",
)

_log = get_logger()

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier, declared in the client's capabilities."""

task_alive: ContextVar[Callable[[], None] | None] = ContextVar(
    "agentloop_mcp_task_alive", default=None
)
"""Set by the task that sends a call: what to call when its task answers a poll, so the
call's `idle_timeout` counts from the task's last sign of life."""

_DEFAULT_POLL = 1.0
"""Seconds between polls when the server suggests no interval."""
_CANCEL_WAIT = 5.0
"""Seconds a cancelled call waits for the server to take its `tasks/cancel`."""


class TaskHandle(mcp_types.Result):
    """A server's answer to a `tools/call` it runs as a task (`resultType: "task"`)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class TaskState(mcp_types.Result):
    """A `tasks/get` answer: the task's status, with its result or error once it ended."""

    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    """The call's `CallToolResult` (wire JSON), once `completed`."""
    error: dict[str, Any] | None = None
    """The JSON-RPC error (`code`, `message`), once `failed`."""


class _TaskParams(mcp_types.RequestParams):
    task_id: str


class _GetTask(mcp_types.Request[_TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskParams
    name_param = "taskId"  # the task id goes in the Mcp-Name header


class _CancelTask(mcp_types.Request[_TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskParams
    name_param = "taskId"  # the task id goes in the Mcp-Name header


async def finish_task(handle: TaskHandle, ctx: ClaimContext) -> mcp_types.CallToolResult:
    """Poll the task `handle` names until it ends; its result, or an error result saying why.

    Cancelled while it waits (the caller gave up, a timeout), it sends `tasks/cancel`.
    """
    params = _TaskParams(task_id=handle.task_id)
    log = _log.bind(tool=ctx.tool_name, task_id=handle.task_id)
    log.info("mcp.task_started", status=handle.status)
    state: TaskHandle | TaskState = handle
    interval = _seconds(handle.poll_interval_ms, _DEFAULT_POLL)
    try:
        while True:
            if state.status == "input_required":
                # Answering a task's questions (`tasks/update`) is not done here: stop it.
                await _cancel(ctx, params)
                return _error(
                    f"'{ctx.tool_name}' ran as a task that asked for input, which this client "
                    "does not answer for tasks; the task was cancelled."
                )
            await anyio.sleep(interval)
            state = await ctx.session.send_request(_GetTask(params=params), TaskState)
            alive = task_alive.get()
            if alive is not None:
                alive()
            interval = _seconds(state.poll_interval_ms, interval)
            if state.status in ("completed", "failed", "cancelled"):
                log.info("mcp.task_ended", status=state.status)
                return _outcome(state, ctx.tool_name)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await _cancel(ctx, params)
        raise


def _outcome(state: TaskState, tool: str) -> mcp_types.CallToolResult:
    """The call's result from a task that ended."""
    if state.status == "completed":
        return mcp_types.CallToolResult.model_validate(state.result or {"content": []})
    if state.status == "failed":
        error = state.error or {}
        return _error(
            f"'{tool}' ran as a task, which failed: {error.get('message', state.status_message)} "
            f"(code {error.get('code', '?')})"
        )
    why = f": {state.status_message}" if state.status_message else ""
    return _error(f"'{tool}' ran as a task, which the server cancelled{why}")


async def _cancel(ctx: ClaimContext, params: _TaskParams) -> None:
    """Ask the server to cancel the task; a server that does not answer in time is let be."""
    with anyio.move_on_after(_CANCEL_WAIT):
        try:
            await ctx.session.send_request(_CancelTask(params=params), mcp_types.Result)
        except Exception as exc:  # the connection is gone, or the task ended meanwhile
            _log.debug("mcp.task_cancel_failed", task_id=params.task_id, error=str(exc))
            return
    _log.info("mcp.task_cancelled", tool=ctx.tool_name, task_id=params.task_id)


def _error(message: str) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=message)], is_error=True
    )


def _seconds(milliseconds: int | None, default: float) -> float:
    return default if milliseconds is None or milliseconds < 0 else milliseconds / 1000


class TasksExtension(ClientExtension):
    """The client's side of the tasks extension: a claim on `tools/call` task handles."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        """The one claim: a `resultType: "task"` answer is finished by `finish_task`."""
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=finish_task)]
