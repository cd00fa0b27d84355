"""The streamed answer: one SSE message for a whole run, with pings while tools run.

Its HTTP status is decided by the first upstream answer; an error after that is the
API's `error` event. A client that goes away cancels the run.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentloop.events import Event, ModelResponded, ModelStreamEvent
from agentloop.logs import get_logger
from agentloop.providers.base import MessageStart, ModelResponse
from agentloop.result import RunResult

from .calls import Call, continued_trace
from .errors import answer_failure, json_answer
from .upstream import client_headers
from .visible import PING, VisibleStream, sse

__all__ = ("StreamResponse", "cancel_on_disconnect")

_log = get_logger()

_Item = tuple[str, Any]


class StreamResponse(Response):
    """One SSE message for the whole run, its status decided by the first upstream answer.

    The HTTP status is sent once the upstream's stream opened: an upstream error before
    that is answered as the API would (its status and error body); after it, as the
    API's `error` event.
    """

    def __init__(
        self,
        call: Call,
        *,
        finish: Callable[[Call, RunResult, list[ModelResponse]], Awaitable[Any]],
        keep_partial: Callable[[Call, Exception], Awaitable[None]],
        deps: Any,
        ping_interval: float,
    ) -> None:
        """Answer `call`; `finish` stores a finished run, `keep_partial` a failed one."""
        self.call = call
        self.finish = finish
        self.keep_partial = keep_partial
        self.deps = deps
        self.ping_interval = ping_interval
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the call, writing its events (and pings) as they come."""
        send_items, items = anyio.create_memory_object_stream[_Item](math.inf)
        async with anyio.create_task_group() as group:
            group.start_soon(self._run, send_items)
            group.start_soon(cancel_on_disconnect, receive, group.cancel_scope)
            try:
                await self._write(items, scope, send)
            finally:
                group.cancel_scope.cancel()

    async def _run(self, send_items: Any) -> None:
        """Run the call, passing the writer what the run's events say.

        Items: `headers` (the client-readable headers of an upstream answer, from its
        `MessageStart`), `data` (SSE bytes), then `end` or `error`.
        """
        call = self.call
        view = VisibleStream(call.client_names, reply_id=call.reply_id, model=call.model)
        responses: list[ModelResponse] = []
        with send_items:
            try:
                with continued_trace(call):
                    async with call.agent.run_stream(
                        None,
                        history=call.history,
                        deps=self.deps,
                        external_tools=call.client_tools,
                    ) as stream:
                        async for event in stream:
                            _pass_on(event, view, responses, send_items)
                result = stream.result
                assert result is not None
                await self.finish(call, result, responses)
                send_items.send_nowait(("end", view.finish(responses, result)))
            except Exception as exc:
                await self.keep_partial(call, exc)
                send_items.send_nowait(("error", exc))

    async def _write(self, items: Any, scope: Scope, send: Send) -> None:
        started = False
        interval = self.ping_interval
        request_id = self.call.request_id
        answered: dict[str, str] = {}  # the headers of the answer that opens the stream

        async def start() -> None:
            nonlocal started
            started = True
            headers = [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"request-id", request_id.encode()),
                *((k.encode(), v.encode("latin-1", "replace")) for k, v in answered.items()),
                *((k.encode(), v.encode()) for k, v in self.call.notes.items()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        async with items:
            while True:
                item: _Item | None = None
                with anyio.move_on_after(interval if started else math.inf):
                    try:
                        item = await items.receive()
                    except anyio.EndOfStream:
                        item = ("closed", None)
                if item is None:
                    await body(PING)
                    continue
                kind, value = item
                if kind == "headers":
                    if not started:
                        answered = value
                elif kind == "data":
                    if not started:
                        await start()
                    await body(value)
                elif kind == "end":
                    if not started:
                        await start()
                    await body(value, more=False)
                    return
                elif kind == "error":
                    failure = answer_failure(value, request_id)
                    _log.info(
                        "gateway.failed", status=failure.status, error=str(value), streamed=started
                    )
                    if not started:
                        response = json_answer(
                            failure.status, failure.body, request_id, failure.headers
                        )
                        await response(scope, _no_receive, send)
                        return
                    error = {"type": "error", "error": failure.body["error"]}
                    await body(sse("error", error), more=False)
                    return
                else:  # the run task ended without a word (cancelled)
                    if started:
                        await body(b"", more=False)
                    return


def _pass_on(
    event: Event, view: VisibleStream, responses: list[ModelResponse], send_items: Any
) -> None:
    """Hand the writer what one run event says; keep each whole model response."""
    if isinstance(event, ModelResponded):
        responses.append(event.response)
    elif isinstance(event, ModelStreamEvent):
        if isinstance(event.event, MessageStart):
            send_items.send_nowait(("headers", client_headers(event.event.headers)))
        data = view.feed(event.round, event.event)
        if data:
            send_items.send_nowait(("data", data))


async def cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel `scope` when the client disconnects (its body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _no_receive() -> Any:
    return {"type": "http.disconnect"}
