"""The streamed answer: one SSE message for a whole run, with pings while tools run.

Its HTTP status is decided by the first upstream answer; an error after that is the
API's `error` event. A client that goes away cancels the run, unless the run is durable:
then it goes on without the client (whose retry gets the answer).

The events come from the call's own `Agent.run_stream`, or from a durable run's stream
(`DurableAgent.run_stream`), turned into SSE the same way. A durable run's stream may say
that a model request was sent again (`StepRestarted`, when the process running it died and
another took the run over): if the client already got some of that round, it would get
two versions of it, so the answer ends there with an `error` event instead.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import asdict
from typing import Any, Protocol

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentloop.errors import APIConnectionError
from agentloop.events import Event, ModelResponded, ModelStreamEvent, StepRestarted
from agentloop.logs import get_logger
from agentloop.providers.base import MessageStart, ModelResponse
from agentloop.result import RunResult
from agentloop.run import cancelled_on_exit

from .calls import Call, continued_trace
from .durable import given_up_when
from .errors import json_answer
from .failures import client_failure
from .upstream import client_headers
from .visible import PING, VisibleStream, sse

__all__ = ("ClientTooSlow", "RunEvents", "StreamResponse", "cancel_on_disconnect")

_log = get_logger()

_Item = tuple[str, Any]


class RunEvents(Protocol):
    """A run's events as they come, then its result (`RunStream`, `DurableStream`)."""

    @property
    def result(self) -> RunResult[Any] | None:
        """The run's result once its events are over."""
        ...

    def __aiter__(self) -> AsyncIterator[Event]: ...


class ClientTooSlow(Exception):
    """A streaming client read nothing while its answer's buffer stayed full too long."""

    def __init__(self, message: str, *, result: RunResult | None = None) -> None:
        super().__init__(message)
        self.result = result
        """The run's partial result (what the gateway's tools did is kept for a retry)."""


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
        durable: Callable[[], AbstractAsyncContextManager[RunEvents]] | None = None,
        watch: Callable[[], Awaitable[None]] | None = None,
        headers: Mapping[str, str] | None = None,
        buffer: int = 256,
        patience: float = 30.0,
    ) -> None:
        """Answer `call`; `finish` stores a finished run, `keep_partial` a failed one.

        `durable` opens the events of the durable run that answers `call` (instead of
        the call's own run): a client going away leaves that run going, and the answer
        ends when the run does, or when `watch` raises (`StoreUnavailable`: the run's
        database stopped answering). `headers` are added to the answer's.

        At most `buffer` events wait for a client that reads slower than the upstream
        writes (the upstream is read no faster meanwhile); one that leaves the buffer full
        for `patience` seconds is dropped (`ClientTooSlow`): its connection closed, the
        run cancelled (a durable run goes on without it), its usage logged.
        """
        self.call = call
        self.finish = finish
        self.keep_partial = keep_partial
        self.deps = deps
        self.ping_interval = ping_interval
        self.durable = durable
        self.watch = watch
        self.extra_headers = dict(headers or {})
        self.buffer = buffer
        self.patience = patience
        self.writer = anyio.CancelScope()
        """Around the writing to the client, cancelled when the client is dropped."""
        self.cancel_run: Callable[[], None] | None = None
        """Cancels the call's own run (a durable run goes on)."""
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the call, writing its events (and pings) as they come."""
        send_items, items = anyio.create_memory_object_stream[_Item](self.buffer)
        # The items are kept until the run ends: a durable run goes on without its client.
        with items:
            async with anyio.create_task_group() as group:
                group.start_soon(self._run, send_items)
                with self.writer:
                    async with anyio.create_task_group() as writing:
                        gone = group if self.durable is None else writing
                        writing.start_soon(cancel_on_disconnect, receive, gone.cancel_scope)
                        try:
                            await self._write(items, scope, send)
                        finally:
                            writing.cancel_scope.cancel()
                if self.durable is None and not self.writer.cancel_called:
                    group.cancel_scope.cancel()  # (a dropped client's run ends by itself)

    def _watched(self) -> AbstractAsyncContextManager[None]:
        """Where the run's events are read: given up when `watch` raises."""
        return given_up_when(self.watch) if self.watch is not None else nullcontext()

    def _events(self, on_event: Callable[[Event], Awaitable[None]]) -> Any:
        """The events of the run answering the call.

        The call's own run hands each event to `on_event` and waits for it, so a client
        that reads slowly slows the run's reading of the upstream down (its own events
        are only drained); a durable run's stream is read at the reader's pace.
        """
        if self.durable is not None:
            return self.durable()
        call = self.call
        run = call.agent.start(
            None,
            history=call.history,
            deps=self.deps,
            external_tools=call.client_tools,
            on_event=on_event,
        )
        return cancelled_on_exit(run)  # as `Agent.run_stream`

    async def _run(self, send_items: Any) -> None:
        """Run the call, passing the writer what the run's events say.

        Items: `headers` (the client-readable headers of an upstream answer, from its
        `MessageStart`), `data` (SSE bytes), then `end` or `error`.
        """
        call = self.call
        view = VisibleStream(call.client_names, reply_id=call.reply_id, model=call.model)
        passing = _PassOn(view, send_items, self.patience, self._drop)
        responses = passing.responses
        pushed = self.durable is None  # (see `_events`)
        with send_items:
            try:
                with continued_trace(call):
                    async with self._watched(), self._events(passing) as stream:
                        self.cancel_run = getattr(stream, "cancel", None) if pushed else None
                        async for event in stream:
                            if not pushed:
                                await passing(event)
                result = stream.result
                assert result is not None
                if passing.dropped and pushed:
                    # Cancelled: what the upstream was asked so far is spent all the same.
                    usage = asdict(result.usage)
                    _log.warning("gateway.client_dropped", request_id=call.request_id, usage=usage)
                    await self.keep_partial(call, ClientTooSlow("dropped", result=result))
                    return
                # A durable run goes on without a dropped client, and is stored when it ends.
                await self.finish(call, result, responses)
                await passing.send(("end", passing.view.finish(responses, result)))
            except Exception as exc:
                await self.keep_partial(call, exc)
                await passing.send(("error", exc))

    def _drop(self) -> None:
        """Stop writing to a client too slow to read its answer; cancel its run.

        The connection closes; a durable run goes on.
        """
        _log.warning(
            "gateway.client_too_slow",
            request_id=self.call.request_id,
            buffer=self.buffer,
            waited=self.patience,
        )
        self.writer.cancel()
        if self.cancel_run is not None:
            self.cancel_run()

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
                *((k.encode(), v.encode()) for k, v in self.extra_headers.items()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

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
                failure = client_failure(self.call, value)
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


class _PassOn:
    """Hands the writer what each run event says; keeps each whole model response."""

    def __init__(
        self, view: VisibleStream, send_items: Any, patience: float, drop: Callable[[], None]
    ) -> None:
        self.view = view
        self.send_items = send_items
        self.patience = patience
        self.drop = drop
        """Called once, when the client is dropped."""
        self.dropped = False
        self.responses: list[ModelResponse] = []
        self.shown: set[int] = set()
        """The rounds the client got something of (other than a ping)."""

    async def send(self, item: _Item) -> None:
        """Hand the writer `item`, waiting while its buffer is full.

        Once the buffer has stayed full for `patience` seconds, the client is dropped
        (`drop`) and nothing more is handed on.
        """
        if self.dropped:
            return
        with anyio.move_on_after(self.patience):
            await self.send_items.send(item)
            return
        self.dropped = True
        self.drop()

    async def __call__(self, event: Event) -> None:
        """Pass `event` on.

        Raises:
            APIConnectionError: the model request of a round the client got some of was
                sent again (`StepRestarted`).
        """
        if isinstance(event, ModelResponded):
            self.responses.append(event.response)
        elif isinstance(event, ModelStreamEvent):
            if isinstance(event.event, MessageStart):
                await self.send(("headers", client_headers(event.event.headers)))
            data = self.view.feed(event.round, event.event)
            if data:
                if data != PING:
                    self.shown.add(event.round)
                await self.send(("data", data))
        elif isinstance(event, StepRestarted) and event.tool_use_id is None:
            # A call's restart changes nothing the client sees: the gateway's calls and
            # their results are hidden.
            if event.round in self.shown:
                raise APIConnectionError(
                    f"the model request of round {event.round} was sent again after the "
                    "process running it stopped, and this answer already had part of the "
                    "first attempt; send the request again for the whole answer"
                )


async def cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel `scope` when the client disconnects (its body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _no_receive() -> Any:
    return {"type": "http.disconnect"}
