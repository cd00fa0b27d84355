"""The AI SDK endpoint: `useChat`'s request in, the run as a UI message stream out.

A request starts a run from the chat's `UIMessage`s. When the chat's last run paused
for approval and the page's last assistant message answers its calls
(`addToolApprovalResponse`, state `approval-responded`), the paused run resumes
instead, and its stream continues that assistant message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentloop.approval import Approve, Deny

from .history import ui_message_history
from .paused import PausedRun
from .serving import Emit, UIEndpoint, sse
from .vercel import STREAM_VERSION, UIMessageChunks

__all__ = ("VercelAIEndpoint",)


class VercelAIEndpoint(UIEndpoint):
    """An ASGI app answering `useChat` (`DefaultChatTransport`): POST the chat, read chunks.

    ```python
    from fastapi import FastAPI
    from agentloop.ui import VercelAIEndpoint

    app = FastAPI()
    app.mount("/api/chat", VercelAIEndpoint(agent))
    ```
    """

    headers = (
        *UIEndpoint.headers,
        (b"x-vercel-ai-ui-message-stream", STREAM_VERSION.encode()),
    )

    async def produce(self, request: Any, emit: Emit) -> None:
        """Run (or resume) the chat the request holds, emitting UI message chunks."""
        try:
            await self._produce(request, emit)
        finally:
            emit(b"data: [DONE]\n\n")

    async def _produce(self, request: Any, emit: Emit) -> None:
        if not isinstance(request, Mapping) or not isinstance(request.get("messages"), list):
            chunks = UIMessageChunks()
            problem = ValueError("the request body is not a chat (an object with `messages`)")
            for chunk in chunks.start() + chunks.error(problem):
                emit(sse(chunk))
            return
        thread = str(request.get("id") or "chat")
        messages = request["messages"]
        paused = self.paused.take(thread)
        decisions = _decisions(paused, messages) if paused is not None else None
        if paused is not None and decisions is not None:
            approved = {i: isinstance(d, Approve) for i, d in decisions.items()}
            chunks = UIMessageChunks(announced=paused.approvals, answered=approved)
            run = self.agent.start(state=paused.state, decisions=decisions, deps=self.deps)
        else:
            chunks = UIMessageChunks(message_id=None)
            try:
                history = ui_message_history(messages)
            except Exception as exc:
                for chunk in chunks.start() + chunks.error(exc):
                    emit(sse(chunk))
                return
            run = self.agent.start(None, history=history, deps=self.deps)
        for chunk in chunks.start():
            emit(sse(chunk))

        def on_event(event: Any) -> None:
            for chunk in chunks(event):
                emit(sse(chunk))

        _, failure = await self.drive(thread, run, on_event)
        if failure is not None:
            for chunk in chunks.error(failure):
                emit(sse(chunk))


def _decisions(paused: PausedRun, messages: list[Any]) -> dict[str, Approve | Deny] | None:
    """The decisions the chat's last assistant message gives; None if it gives none.

    A waiting call left without a response is denied: the run goes on either way.
    """
    last = messages[-1] if messages else None
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        return None
    responses: dict[str, Mapping[str, Any]] = {}
    for part in last.get("parts") or ():
        approval = part.get("approval") if isinstance(part, Mapping) else None
        if isinstance(approval, Mapping) and isinstance(approval.get("approved"), bool):
            responses[str(part.get("toolCallId"))] = approval
    if not any(call_id in responses for call_id in paused.approvals):
        return None
    decisions: dict[str, Approve | Deny] = {}
    for call_id in paused.approvals:
        response = responses.get(call_id)
        if response is None:
            decisions[call_id] = Deny("The user did not decide.")
        elif response["approved"]:
            decisions[call_id] = Approve()
        else:
            decisions[call_id] = Deny(str(response.get("reason") or "The user denied it."))
    return decisions
