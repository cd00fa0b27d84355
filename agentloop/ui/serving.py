"""What both front-end endpoints share: the HTTP side, driving the run, keeping its end.

An endpoint is a plain ASGI app (mount it in Starlette, FastAPI, or any ASGI server):
it reads the request's JSON, starts a streamed run, and writes the protocol's events as
server-sent events while the run goes on. When the client goes away the run is
cancelled; whatever way it ends, a paused run is kept for the thread's next request
(`PausedRuns`) and the result, partial or final, is handed to `on_result`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from agentloop.agent import Agent
from agentloop.events import Event
from agentloop.result import RunResult
from agentloop.run import Run

from .paused import PausedRun, PausedRuns

__all__ = ("OnResult", "UIEndpoint")

OnResult = Callable[[str, RunResult[Any]], Awaitable[None]]
"""`on_result(thread, result)`: called with each run's result, partial when it failed or
was cancelled (the client went away)."""

Emit = Callable[[bytes], None]


class UIEndpoint:
    """The ASGI side of a front-end protocol; `AGUIEndpoint` and `VercelAIEndpoint` are it."""

    headers: tuple[tuple[bytes, bytes], ...] = (
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    )

    def __init__(
        self,
        agent: Agent[Any],
        *,
        deps: Any = None,
        paused: PausedRuns | None = None,
        on_result: OnResult | None = None,
    ) -> None:
        """An endpoint running `agent` for each request.

        Args:
            agent: The agent each request runs (its tools, approvals and limits).
            deps: The runs' `deps`, handed to the tools.
            paused: Where paused runs wait for the page's decision (default: a
                `PausedRuns` in this process's memory).
            on_result: Called with each run's result, final or partial.
        """
        self.agent = agent
        self.deps = deps
        self.paused = paused if paused is not None else PausedRuns()
        self.on_result = on_result

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        """Answer one HTTP request (ASGI): POST with the protocol's JSON body."""
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await _plain(send, 405, b"POST the protocol's JSON body here")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        await send({"type": "http.response.start", "status": 200, "headers": list(self.headers)})
        send_chunks, chunks = anyio.create_memory_object_stream[bytes](math.inf)
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
            group.start_soon(self._produce_into, request, send_chunks)
            async with chunks:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()

    async def _produce_into(self, request: Any, send_chunks: MemoryObjectSendStream[bytes]) -> None:
        with send_chunks:
            await self.produce(request, send_chunks.send_nowait)

    async def produce(self, request: Any, emit: Emit) -> None:
        """Run what `request` (the decoded body, None if it was not JSON) asks; `emit` bytes."""
        raise NotImplementedError

    async def drive(
        self, thread: str, run: Run[Any], on_event: Callable[[Event], None]
    ) -> tuple[RunResult[Any] | None, Exception | None]:
        """Drive `run`, handing each event to `on_event`; its result and its failure.

        The result is None when the run could not start (its options were refused).
        A cancellation (the client went away) goes on, after the partial result is kept.
        """
        entered = False
        failure: Exception | None = None
        try:
            async with run:
                entered = True
                async for event in run:
                    on_event(event)
        except Exception as exc:
            failure = exc
        finally:
            result = run.result if entered else None
            if result is not None:
                with anyio.CancelScope(shield=True):
                    await self._keep(thread, result)
        return result, failure

    async def _keep(self, thread: str, result: RunResult[Any]) -> None:
        paused = PausedRun.of(result)
        if paused is not None and result.stop_reason != "cancelled":
            self.paused.keep(thread, paused)
        if self.on_result is not None:
            await self.on_result(thread, result)


def sse(value: Any) -> bytes:
    """One server-sent event whose data is `value` as JSON."""
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


async def _cancel_on_disconnect(receive: Any, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _plain(send: Any, status: int, text: bytes) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"allow", b"POST")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})
