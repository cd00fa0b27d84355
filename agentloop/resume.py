"""Resuming a paused run: the caller's answers, checked before anything happens.

`plan` reads a run state (`agentloop.state`) and the caller's decisions and results, and
checks them all: every waiting call gets exactly one answer of the right kind, and an
edited input fits its tool. The run then finishes the paused turn through `Turn.resume`,
seeded with those answers, as the turn would have if it had never stopped.

A sub-agent's call whose run paused is answered by running it again: its tool
(`agentloop.subagents`) finds the sub-run's own plan among the answers and resumes it.
One flat dict of answers by tool_use id covers the calls of the run and of its sub-runs.
If a sub-run pauses again, so does the run, with the turn's other results held.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from .approval import Approve, Deny
from .calls import ToolCall, ToolResult, sendable, to_content
from .errors import ConfigurationError, DecisionError, HistoryError, InvalidStateError, ToolError
from .lint import check_result_content
from .messages import ToolResultBlock, parse_history
from .registry import AgentTool, ToolRegistry
from .state import PausedRun, PendingCall, load_state, waiting_calls
from .tools import describe_validation_error

__all__ = ("plan",)


def plan(
    state: Any,
    decisions: Mapping[str, Any] | None,
    results: Mapping[str, Any] | None,
    registry: ToolRegistry,
) -> PausedRun:
    """The paused run of `state`, with an answer for each waiting call (`PausedRun.answers`).

    Raises:
        InvalidStateError: (or a subclass) the state cannot be resumed.
        DecisionError: the decisions and results do not answer the waiting calls.
        ConfigurationError: an approved call names a tool this agent does not have.
    """
    paused = load_state(state)
    decisions = _mapping("decisions", decisions)
    results = _mapping("results", results)
    calls = [call for _, call in waiting_calls(paused.pending)]
    waiting = {p.tool_use_id: p for p in calls}
    if len(waiting) < len(calls):
        raise InvalidStateError(
            "two calls the run waits for (in it or in its sub-runs) have the same id, so "
            "answers by id cannot tell them apart"
        )
    _check_ids(waiting, decisions, "approval", "decisions", "results")
    _check_ids(waiting, results, "external", "results", "decisions")
    return _answered(paused, decisions, results, registry)


def _answered(
    paused: PausedRun,
    decisions: Mapping[str, Any],
    results: Mapping[str, Any],
    registry: ToolRegistry,
) -> PausedRun:
    """`paused` with the answer of each call it waits for (checked: each has one).

    A sub-agent's call is answered with its sub-run, answered the same way through the
    sub-agent's own tools.
    """
    answers: dict[str, ToolCall | ToolResult | PausedRun] = {}
    for call in paused.pending:
        id_ = call.tool_use_id
        if call.run is not None:
            tools = _sub_agent(call, registry).sub_tools
            answers[id_] = _answered(load_state(call.run), decisions, results, tools)
        elif id_ in decisions:
            answers[id_] = _decided(call, decisions[id_], registry)
        else:
            answers[id_] = _external_result(call, results[id_])
    return replace(paused, answers=answers)


def _sub_agent(call: PendingCall, registry: ToolRegistry) -> AgentTool:
    tool = registry.get(call.name)
    if not isinstance(tool, AgentTool):
        raise ConfigurationError(
            f"the paused run waits for its sub-agent '{call.name}', which is not a sub-agent "
            "(Agent.as_tool) of this agent; resume it with an agent configured as the one "
            "that ran it"
        )
    return tool


def _mapping(what: str, value: Mapping[str, Any] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DecisionError(f"{what} must be a dict by tool_use id, not {type(value).__name__}")
    return dict(value)


def _check_ids(
    waiting: Mapping[str, PendingCall],
    given: Mapping[str, Any],
    kind: str,
    what: str,
    other: str,
) -> None:
    for id_ in given:
        call = waiting.get(id_)
        if call is None:
            raise DecisionError(f"{what}: no call of this paused run waits with id {id_!r}")
        if call.kind != kind:
            raise DecisionError(
                f"{what}: call {id_!r} ('{call.name}') waits for {call.kind}; answer it in {other}"
            )
    missing = [p for p in waiting.values() if p.kind == kind and p.tool_use_id not in given]
    if missing:
        shown = ", ".join(f"{p.tool_use_id} ('{p.name}')" for p in missing)
        raise DecisionError(f"{what}: no answer for the waiting call(s) {shown}")


def _decided(call: PendingCall, decision: Any, registry: ToolRegistry) -> ToolCall | ToolResult:
    """The call to run for an `Approve`, or the model's answer for a `Deny`."""
    original = ToolCall(call.tool_use_id, call.name, call.input)
    if isinstance(decision, Deny):
        if not isinstance(decision.reason, str) or not decision.reason:
            raise DecisionError(f"Deny for {call.tool_use_id!r}: the reason must be some text")
        return ToolResult.error(original, f"Denied: {decision.reason}", ran=False)
    if not isinstance(decision, Approve):
        raise DecisionError(
            f"decision for {call.tool_use_id!r} must be Approve() or Deny(reason), not {decision!r}"
        )
    tool = registry.get(call.name)
    if tool is None:
        raise ConfigurationError(
            f"the paused run waits to call '{call.name}', which this agent does not have; "
            "resume it with an agent configured as the one that ran it (a tool given to "
            "the run alone is given to resume again: resume(..., tools=[...]))"
        )
    if decision.input is None:
        return original
    if not isinstance(decision.input, dict):
        raise DecisionError(
            f"Approve for {call.tool_use_id!r}: the edited input must be a dict of "
            f"arguments, not {type(decision.input).__name__}"
        )
    try:
        tool.validate(decision.input)
        json.dumps(decision.input, allow_nan=False)
    except ValidationError as exc:
        raise DecisionError(
            f"Approve for {call.tool_use_id!r}: {describe_validation_error(call.name, exc)}"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise DecisionError(
            f"Approve for {call.tool_use_id!r}: the edited input is not JSON ({exc})"
        ) from exc
    return ToolCall(call.tool_use_id, call.name, dict(decision.input))


def _external_result(call: PendingCall, value: Any) -> ToolResult:
    """The result the caller gave for an external call, as the turn's other results are.

    A `ToolError` answers `is_error` with its message; a `tool_result` block (or its wire
    dict) is taken as it is; any other value as a tool's return value would be.
    """
    original = ToolCall(call.tool_use_id, call.name, call.input)
    if isinstance(value, ToolError):
        return ToolResult.error(original, value.message)
    if isinstance(value, Mapping) and value.get("type") == "tool_result":
        try:
            parsed = parse_history([{"role": "user", "content": [dict(value)]}])[0].blocks[0]
        except Exception as exc:
            raise DecisionError(f"results[{call.tool_use_id!r}]: {exc}") from exc
        value = parsed
    if isinstance(value, ToolResultBlock):
        if value.tool_use_id != call.tool_use_id:
            raise DecisionError(
                f"results[{call.tool_use_id!r}] is a tool_result for {value.tool_use_id!r}"
            )
        if isinstance(value.content, tuple):
            try:
                check_result_content(value.content)
            except HistoryError as exc:
                raise DecisionError(f"results[{call.tool_use_id!r}]: {exc}") from exc
        return sendable(ToolResult.from_block(value, call.name))
    try:
        content = to_content(value)
    except Exception as exc:
        raise DecisionError(
            f"results[{call.tool_use_id!r}]: {type(value).__name__} cannot be sent to the "
            f"model ({exc})"
        ) from exc
    return sendable(ToolResult(call.tool_use_id, call.name, content))
