"""The AG-UI endpoint: a `RunAgentInput` in, the run's AG-UI events out as SSE.

A request starts a run from its messages, with the front end's `tools` announced as
external tools (their calls come back to the page: `RUN_FINISHED` lists them as pending,
and the page sends their results as tool messages next time). A request answering a
paused run (`resume` entries for the interrupts of calls waiting for approval, or tool
messages for pending calls) resumes it instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentloop.approval import Approve, Deny
from agentloop.errors import ToolError

from .agui import AGUIEvents
from .history import agui_history
from .paused import PausedRun
from .serving import Emit, UIEndpoint, sse

__all__ = ("AGUIEndpoint",)


class AGUIEndpoint(UIEndpoint):
    """An ASGI app answering AG-UI's `HttpAgent`: POST a `RunAgentInput`, read SSE events.

    ```python
    from fastapi import FastAPI
    from agentloop.ui import AGUIEndpoint

    app = FastAPI()
    app.mount("/agent", AGUIEndpoint(agent))
    ```
    """

    async def produce(self, request: Any, emit: Emit) -> None:
        """Run (or resume) what the `RunAgentInput` asks, emitting AG-UI events."""
        problem = _input_problem(request)
        if problem is not None:
            emit(sse({"type": "RUN_ERROR", "message": problem, "code": "invalid_input"}))
            return
        thread, run_id = str(request["threadId"]), str(request["runId"])
        messages = request.get("messages") or []
        paused = self.paused.take(thread)
        answers = _answers(paused, request, messages) if paused is not None else None
        if paused is not None and answers is not None:
            decisions, results = answers
            approved = {i: isinstance(d, Approve) for i, d in decisions.items()}
            events = AGUIEvents(
                thread, run_id, announced=paused.approvals + paused.external, answered=approved
            )
            for chunk in events.start():
                emit(sse(chunk))
            run = self.agent.start(
                state=paused.state, decisions=decisions, results=results, deps=self.deps
            )
        else:
            events = AGUIEvents(thread, run_id)
            for chunk in events.start():
                emit(sse(chunk))
            try:
                history = agui_history(messages)
            except Exception as exc:
                for chunk in events.error(exc):
                    emit(sse(chunk))
                return
            tools = [_definition(t) for t in request.get("tools") or () if isinstance(t, Mapping)]
            run = self.agent.start(None, history=history, deps=self.deps, external_tools=tools)

        def on_event(event: Any) -> None:
            for chunk in events(event):
                emit(sse(chunk))

        _, failure = await self.drive(thread, run, on_event)
        if failure is not None:
            for chunk in events.error(failure):
                emit(sse(chunk))


def _input_problem(request: Any) -> str | None:
    if not isinstance(request, Mapping):
        return "the request body is not a JSON object (an AG-UI RunAgentInput)"
    for key in ("threadId", "runId"):
        if not isinstance(request.get(key), str) or not request[key]:
            return f"the RunAgentInput has no {key}"
    for key in ("messages", "tools", "resume"):
        if request.get(key) is not None and not isinstance(request[key], list):
            return f"the RunAgentInput's {key} is not a list"
    return None


def _answers(
    paused: PausedRun, request: Mapping[str, Any], messages: list[Any]
) -> tuple[dict[str, Approve | Deny], dict[str, Any]] | None:
    """The decisions and results the request gives the paused run; None if it gives none.

    An interrupt left unanswered is denied, and a pending call of the page's tools
    without a tool message gets an error result: the run goes on either way.
    """
    entries = {
        str(e.get("interruptId")): e for e in request.get("resume") or () if isinstance(e, Mapping)
    }
    tool_messages = {
        str(m.get("toolCallId")): m
        for m in messages
        if isinstance(m, Mapping) and m.get("role") == "tool"
    }
    answered = [i for i in paused.approvals if i in entries]
    answered += [i for i in paused.external if i in tool_messages]
    if not answered:
        return None
    decisions: dict[str, Approve | Deny] = {}
    for call_id in paused.approvals:
        decisions[call_id] = _decision(entries.get(call_id))
    results: dict[str, Any] = {}
    for call_id in paused.external:
        message = tool_messages.get(call_id)
        if message is None:
            results[call_id] = ToolError("The page sent no result for this call.")
        elif message.get("error"):
            results[call_id] = ToolError(str(message["error"]))
        else:
            content = message.get("content")
            results[call_id] = content if isinstance(content, str) else str(content or "")
    return decisions, results


def _decision(entry: Mapping[str, Any] | None) -> Approve | Deny:
    """An interrupt's answer: resolved with `{"approved": true}` approves, else a denial."""
    if entry is None:
        return Deny("The user did not decide.")
    payload = entry.get("payload")
    if entry.get("status") == "resolved" and isinstance(payload, Mapping):
        if payload.get("approved") is True:
            edited = payload.get("input")
            return Approve(input=dict(edited)) if isinstance(edited, Mapping) else Approve()
        return Deny(str(payload.get("reason") or "The user denied it."))
    if entry.get("status") == "resolved" and payload is True:
        return Approve()
    return Deny("The user denied it.")


def _definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A front-end tool (AG-UI `Tool`) as a Messages-API tool definition."""
    parameters = tool.get("parameters")
    schema = dict(parameters) if isinstance(parameters, Mapping) else {"type": "object"}
    return {
        "name": str(tool.get("name", "")),
        "description": str(tool.get("description", "")),
        "input_schema": schema,
    }
