"""One supervisor per MCP server: the only task that opens, uses and closes its connection.

Tool calls never touch the MCP client. A call is a request sent through an anyio memory
channel with its own one-slot reply channel; the supervisor serves requests on the live
connection, each in a task of a task group nested inside that connection, and answers
each through its reply channel. Because the connection is entered and left in one task,
no cancel scope is ever exited in a task other than the one that entered it.

When the connection drops (the server process died, the HTTP server went away), the
supervisor closes it, settles the calls that were in flight, waits (with backoff) and
reconnects once for every call that is waiting. A call in flight during the drop is sent
again only if the tool says it is safe (`readOnlyHint` or `idempotentHint`), and only
once; any other gets an error saying it may or may not have run.

Under `protocol: auto` a server that also speaks the handshake era is reached on the
newest protocol, which gives a server no channel for requests of its own; a server that
asks anyway (sampling, elicitation, roots, as servers written in the usual style do) has
the call refused. The supervisor then lets the other calls finish, reconnects with the
initialize handshake, which has that channel, and sends the refused call again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel
import mcp.types as mcp_types
from agentloop import ToolError
from agentloop.logs import get_logger
from agentloop.progress import ProgressReporter
from anyio.streams.memory import MemoryObjectSendStream
from mcp import Client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from .capabilities import (
    ElicitationHandler,
    elicitation_callback,
    logging_callback,
    roots_callback,
)
from .config import MCPServer
from .protocols import known_mode, no_back_channel_message, remember_handshake
from .sampling import Caller, MCPSampling, in_call, sampling_callback
from .tasks import TasksExtension, task_alive
from .transport import (
    MCPConnectError,
    MCPRequestError,
    connection_lost,
    describe,
    garbled,
    no_back_channel,
    not_delivered,
    transport,
)

__all__ = ("MCPConnectError", "MCPRequestError", "ServerConnection")

_log = get_logger()

_CLIENT_INFO = mcp_types.Implementation(name="agentloop-mcp", version="0.1.0")

# The SDK logs through `logging` without a handler of its own, so with none configured
# Python's last-resort handler prints its warnings (a traceback per line a server writes
# that is not JSON-RPC, "Session termination failed" at exit) on stderr. A NullHandler
# keeps it silent until the application configures logging; configured handlers still
# get every record.
logging.getLogger("mcp").addHandler(logging.NullHandler())
_MAX_BACKOFF = 10.0
_MAX_PAGES = 100


@dataclass(frozen=True)
class _Failure:
    """An answer that is an error message for the model, not a result."""

    message: str


_Outcome = mcp_types.CallToolResult | _Failure


@dataclass(eq=False)
class _Request:
    """One tool call on its way to the supervisor, with the channel its answer goes to."""

    name: str
    arguments: dict[str, Any]
    retryable: bool
    reply: MemoryObjectSendStream[_Outcome]
    on_progress: ProgressReporter | None = None
    """Where the server's progress notifications for this call go (a streamed run)."""
    method: str | None = None
    """A `Client` method to call instead of `call_tool` (`read_resource`, ...)."""
    caller: Caller | None = None
    """Who made the call: the run a server's sampling request during it is counted in."""
    state: Literal["queued", "sent"] = "queued"
    """`sent` once it may have reached the server; `queued` requests are safe to send again."""
    drops: int = 0
    """How many dropped connections it was in flight on."""
    abandoned: bool = False
    """The caller stopped waiting (timeout, cancellation)."""
    switched: bool = False
    """Refused for want of a back-channel, and waiting for a handshake-era connection."""
    scope: anyio.CancelScope | None = field(default=None, repr=False)

    def abandon(self) -> None:
        """Stop the call: the worker running it (if any) is cancelled, which tells the server."""
        self.abandoned = True
        if self.scope is not None:
            self.scope.cancel()

    def answer(self, outcome: _Outcome | None) -> None:
        """Send the outcome (None: just close, the caller sees the end of the stream)."""
        if outcome is not None:
            try:
                self.reply.send_nowait(outcome)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.WouldBlock):
                pass  # the caller is gone
        self.reply.close()


class ServerConnection:
    """The supervisor of one MCP server: run `run()` as a task; call `call()` from anywhere.

    `tools` holds the server's tool listing (sorted by name), fetched when the first
    connection opens and again only when the server says its tools changed.
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        on_tools_changed: Callable[[ServerConnection], None],
        connect_timeout: float,
        reconnect_attempts: int,
        reconnect_backoff: float,
        sampling: MCPSampling | None = None,
        elicitation: ElicitationHandler | None = None,
    ) -> None:
        """Supervise `server`; `on_tools_changed(self)` is called after each refreshed listing."""
        self.server = server
        self.tools: list[mcp_types.Tool] = []
        self.connections = 0
        """How many connections were opened (for logs and tests)."""
        self.instructions: str | None = None
        """What the server said about using it (`instructions`), from the first connection."""
        self._on_tools_changed = on_tools_changed
        self._connect_timeout = server.connect_timeout or connect_timeout
        self._attempts = reconnect_attempts
        self._backoff = reconnect_backoff
        self._sampling = sampling_callback(server, sampling, self._callers)
        self._elicitation = elicitation_callback(server, elicitation)
        self._roots = roots_callback(server)
        self._send, self._receive = anyio.create_memory_object_stream[_Request](math.inf)
        self._in_flight: dict[_Request, None] = {}
        """Requests handed to a worker, in the order they came (a dict keeps it)."""
        self._retry: list[_Request] = []
        self._answered = 0
        self._tools_changed = anyio.Event()
        self._log = _log.bind(mcp_server=server.name)
        self._mode = known_mode(server)
        """The SDK's connect mode for the next connection (`legacy` once a server asked)."""
        self._version: str | None = None
        """The protocol version of the live connection."""
        self._handshake_refused = False
        """Whether a switch to the handshake era failed (the server speaks only the new one)."""
        self._switch: anyio.Event | None = None
        """Set when a refused call asks for a handshake-era connection."""
        self._ended = anyio.Event()
        """Set when a call ends (what a switch of era waits for)."""

    # ------------------------------------------------------------------ the caller's side

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        retryable: bool,
        on_progress: ProgressReporter | None = None,
        caller: Caller | None = None,
    ) -> mcp_types.CallToolResult:
        """Call tool `name` on the server and wait for its result.

        Cancelling the caller cancels the call on the server too. `on_progress` gets the
        server's progress notifications for the call; `caller` is the run the server's
        sampling requests during the call are answered for.

        Raises:
            ToolError: the call could not be made or did not finish; the message says why
                in words the model can act on.
        """
        send, receive = anyio.create_memory_object_stream[_Outcome](1)
        request = _Request(name, arguments, retryable, send, on_progress, caller=caller)
        with receive:
            try:
                self._send.send_nowait(request)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                send.close()
                raise ToolError(self._closed_message(name)) from None
            try:
                outcome = await receive.receive()
            except anyio.EndOfStream:
                raise ToolError(self._closed_message(name)) from None
            except anyio.get_cancelled_exc_class():
                request.abandon()
                raise
        if isinstance(outcome, _Failure):
            raise ToolError(outcome.message)
        return outcome

    async def fetch(self, method: str, **params: Any) -> Any:
        """The result of `Client.<method>(**params)` on the live connection.

        For requests other than tool calls: `list_resources`, `read_resource`,
        `list_prompts`, `get_prompt`.

        Raises:
            MCPRequestError: the server refused, or the connection is gone.
        """
        send, receive = anyio.create_memory_object_stream[Any](1)
        request = _Request(method, params, True, send, method=method)
        with receive:
            try:
                self._send.send_nowait(request)
                outcome = await receive.receive()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                raise MCPRequestError(self._closed_message(method)) from None
            except anyio.get_cancelled_exc_class():
                request.abandon()
                raise
        if isinstance(outcome, _Failure):
            raise MCPRequestError(outcome.message)
        return outcome

    def _callers(self) -> list[Caller]:
        """The callers of the tool calls in flight (sent to the server, not yet answered)."""
        return [
            r.caller
            for r in self._in_flight
            if r.caller is not None and r.state == "sent" and not r.abandoned
        ]

    def _closed_message(self, tool: str) -> str:
        return (
            f"The connection to MCP server '{self.server.name}' was closed before '{tool}' "
            "finished; it may or may not have run."
        )

    # ------------------------------------------------------------------ the supervisor

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the server's connection until cancelled; report started once it is usable.

        Raises:
            MCPConnectError: the first connection failed (before `task_status.started()`).
        """
        try:
            await self._supervise(task_status)
        finally:
            self._close()

    async def _supervise(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        connected, reason = await self._connection(ready=task_status.started, first=True)
        if not connected:
            raise MCPConnectError(
                f"cannot connect to MCP server '{self.server.name}' "
                f"({self.server.describe()}): {reason}",
                server=self.server.name,
                reason=f"cannot start or reach it ({self.server.describe()}): {reason}",
            )
        failures = 0
        while True:
            healthy = connected and self._answered > 0
            self._settle(reason)
            failures = 0 if healthy else failures + 1
            if self._switch is not None and self._switch.is_set():
                self._switch = None  # a switch of era, not a failure: reconnect at once
                failures = 0
            elif failures >= self._attempts:
                self._log.warning("mcp.unavailable", reason=reason, attempts=failures)
                self._fail_waiting(
                    f"MCP server '{self.server.name}' is unavailable ({reason}); "
                    "the call was not run. Try again later."
                )
                failures = 0
                await self._wait_for_demand()
            else:
                delay = min(self._backoff * 2 ** max(failures - 1, 0), _MAX_BACKOFF)
                self._log.warning("mcp.reconnecting", reason=reason, delay=delay)
                await anyio.sleep(delay)
            connected, reason = await self._connection(ready=None, first=False)
            if not connected and self._mode != self.server.mode:
                self._log.info("mcp.handshake_refused", reason=reason)
                self._mode, self._handshake_refused = self.server.mode, True
                self._refuse_switched()
                connected, reason = await self._connection(ready=None, first=False)

    async def _connection(
        self, *, ready: Callable[[], None] | None, first: bool
    ) -> tuple[bool, str]:
        """Open a connection, serve calls until it is lost; return (connected, why it ended)."""
        connected = False
        lost = anyio.Event()
        garbage: list[str] = []  # what the server wrote that was not a message
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self._connect_timeout) as scope:
                async with self._client(lost, garbage) as client:
                    if first:
                        self.tools = await self._list_tools(client)
                        self.instructions = client.instructions
                    scope.deadline = math.inf
                    connected = True
                    self.connections += 1
                    self._answered = 0
                    self._version = client.protocol_version
                    if self._mode == "auto" and self._version not in MODERN_PROTOCOL_VERSIONS:
                        remember_handshake(self.server)  # it ignored the probe: skip it next time
                    self._log.info(
                        "mcp.connected",
                        protocol_version=client.protocol_version,
                        connection=self.connections,
                    )
                    if ready is not None:
                        ready()
                    await self._serve(client, lost)
            if scope.cancelled_caught and not connected:
                return False, garbled(garbage) or f"no answer within {self._connect_timeout:g} s"
        except Exception as exc:
            return connected, garbled(garbage) or describe(exc)
        return connected, "the connection was lost"

    def _client(self, lost: anyio.Event, garbage: list[str]) -> Client:
        return Client(
            transport(self.server, lost, garbage),
            mode=self._mode,
            cache=None,
            message_handler=self._on_message,
            client_info=_CLIENT_INFO,
            sampling_callback=self._sampling,
            elicitation_callback=self._elicitation,
            list_roots_callback=self._roots,
            logging_callback=logging_callback(self.server, self._callers),
            log_level="info",  # the newest protocol sends logs only to who asks for them
            extensions=[TasksExtension()],
        )

    async def _serve(self, client: Client, lost: anyio.Event) -> None:
        self._switch = anyio.Event()
        pump = anyio.CancelScope()
        async with anyio.create_task_group() as group:
            retry, self._retry = self._retry, []
            for request in retry:
                self._start(group, client, request, lost)
            group.start_soon(self._pump, group, client, lost, pump)
            group.start_soon(self._on_switch, pump, lost)
            group.start_soon(self._watch_tools, client)
            await lost.wait()
            group.cancel_scope.cancel()

    async def _pump(
        self,
        group: anyio.abc.TaskGroup,
        client: Client,
        lost: anyio.Event,
        scope: anyio.CancelScope,
    ) -> None:
        with scope:
            async for request in self._receive:
                self._start(group, client, request, lost)

    async def _on_switch(self, pump: anyio.CancelScope, lost: anyio.Event) -> None:
        """When a call needs the handshake era: take no new call, let the others finish."""
        assert self._switch is not None
        await self._switch.wait()
        pump.cancel()  # new calls wait in the channel for the next connection
        while any(r.state == "sent" for r in self._in_flight):
            self._ended = anyio.Event()
            await self._ended.wait()
        self._mode = "legacy"
        remember_handshake(self.server)
        self._log.info("mcp.handshake_era", reason="the server asked the client a question")
        lost.set()

    def _start(
        self, group: anyio.abc.TaskGroup, client: Client, request: _Request, lost: anyio.Event
    ) -> None:
        if request.abandoned:
            request.answer(None)
            return
        self._in_flight[request] = None
        group.start_soon(self._work, client, request, lost)

    async def _work(self, client: Client, request: _Request, lost: anyio.Event) -> None:
        if request.abandoned:
            self._in_flight.pop(request, None)
            request.answer(None)
            return
        if lost.is_set():
            return  # still queued: served again after the reconnect
        outcome: _Outcome | None = None
        idle = self.server.idle_timeout
        in_call.set(request.caller)  # this task's own context: input asked within the call
        with anyio.CancelScope() as scope:
            request.scope = scope
            request.state = "sent"

            def alive() -> None:  # an answer, a progress notification, a task's poll
                if idle is not None:
                    scope.deadline = anyio.current_time() + idle

            alive()
            task_alive.set(alive)

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                alive()
                if request.on_progress is not None:
                    request.on_progress(progress, total, message)

            try:
                if request.method is not None:
                    outcome = await getattr(client, request.method)(**request.arguments)
                else:
                    outcome = await client.call_tool(
                        request.name,
                        request.arguments,
                        progress_callback=on_progress if self.server.progress else None,
                    )
            except MCPError as exc:
                if not_delivered(exc):
                    request.state = "queued"
                if connection_lost(exc):
                    lost.set()
                    return  # settled by the supervisor once the connection is closed
                if no_back_channel(exc):
                    if self._switch_era(request):
                        return  # sent again on the handshake-era connection
                    outcome = _Failure(self._no_back_channel(request.name))
                else:
                    outcome = _Failure(
                        f"MCP server '{self.server.name}' refused the call to '{request.name}': "
                        f"{exc.error.message} (code {exc.error.code})"
                    )
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                lost.set()
                return
            except Exception as exc:
                outcome = _Failure(
                    f"MCP server '{self.server.name}': the call to '{request.name}' failed: "
                    f"{describe(exc)}"
                )
        request.scope = None
        self._in_flight.pop(request, None)
        self._ended.set()  # one call fewer for a switch of era to wait for
        if scope.cancelled_caught and request.abandoned:
            request.answer(None)  # abandoned by its caller
            return
        if scope.cancelled_caught:
            outcome = _Failure(
                f"MCP server '{self.server.name}': '{request.name}' sent no answer and no "
                f"progress for {idle:g} s, so the call was cancelled."
            )
        self._answered += 1
        request.answer(outcome)

    def _switch_era(self, request: _Request) -> bool:
        """Ask for a handshake-era connection for a call a server refused; False if none."""
        if self.server.protocol != "auto" or self._version not in MODERN_PROTOCOL_VERSIONS:
            return False
        if self._handshake_refused or request.switched or self._switch is None:
            return False
        request.state = "queued"  # the server refused it: sent again after the switch
        request.switched = True
        request.scope = None
        self._switch.set()
        return True

    def _no_back_channel(self, tool: str) -> str:
        refused, version = self._handshake_refused, self._version
        return no_back_channel_message(self.server, tool, version, handshake_refused=refused)

    def _refuse_switched(self) -> None:
        """Answer the calls that waited for a handshake-era connection the server refused."""
        for request in [r for r in self._retry if r.switched]:
            self._retry.remove(request)
            request.answer(_Failure(self._no_back_channel(request.name)))

    def _settle(self, reason: str) -> None:
        """After a drop: send queued and retryable calls again; answer the others."""
        for request in self._in_flight:
            request.scope = None
            if request.abandoned:
                request.answer(None)
            elif request.state == "queued":
                self._retry.append(request)
            elif request.retryable and request.drops == 0:
                request.drops += 1
                request.state = "queued"
                self._retry.append(request)
            else:
                again = "" if request.drops == 0 else " again"
                request.answer(
                    _Failure(
                        f"The connection to MCP server '{self.server.name}' dropped{again} while "
                        f"'{request.name}' was running ({reason}). The call may or may not have "
                        "run: check its effect before calling it again."
                    )
                )
        self._in_flight.clear()

    def _fail_waiting(self, message: str) -> None:
        waiting, self._retry = self._retry, []
        while True:
            try:
                waiting.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        for request in waiting:
            request.answer(None if request.abandoned else _Failure(message))

    async def _wait_for_demand(self) -> None:
        """Wait for the next call; it is served after a fresh connection attempt."""
        self._retry.append(await self._receive.receive())

    def _close(self) -> None:
        """Close the request channel and every pending reply (callers see it was closed)."""
        self._send.close()
        pending = [*self._in_flight, *self._retry]
        while True:
            try:
                pending.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._receive.close()
        for request in pending:
            request.answer(None)
        self._in_flight.clear()
        self._retry.clear()

    # ------------------------------------------------------------------ the tool listing

    async def _list_tools(self, client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return sorted(tools, key=lambda t: t.name)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._tools_changed.set()
        elif isinstance(message, Exception):
            self._log.debug("mcp.transport_error", error=describe(message))
        await anyio.lowlevel.checkpoint()

    async def _watch_tools(self, client: Client) -> None:
        """Refresh the listing when the server says its tools changed."""
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            capability = client.server_capabilities.tools
            if capability is None or not capability.list_changed:
                return
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    async for _event in subscription:
                        await self._refresh(client)
            except (ListenNotSupportedError, SubscriptionLost, MCPError, TimeoutError) as exc:
                self._log.debug("mcp.listen_ended", error=describe(exc))
            return
        while True:  # earlier protocol versions send the notification unasked
            await self._tools_changed.wait()
            self._tools_changed = anyio.Event()
            await self._refresh(client)

    async def _refresh(self, client: Client) -> None:
        try:
            tools = await self._list_tools(client)
        except Exception as exc:
            self._log.warning("mcp.tools_refresh_failed", error=describe(exc))
            return
        self.tools = tools
        self._log.info("mcp.tools_changed", tools=[t.name for t in tools])
        self._on_tools_changed(self)
