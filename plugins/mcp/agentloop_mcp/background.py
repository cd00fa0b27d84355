"""An `MCPToolSource` kept open on its own event loop, for code that cannot hold `async with`.

Plugin hooks are synchronous and are called once, long before any run; MCP tools need a
live connection for every call. `BackgroundToolSource` runs the source on an event loop
in a daemon thread until `close()` (or the end of the process), and hands out tools that
forward each call to that loop, from whatever loop the agent runs on. Cancelling or
timing out a call on the agent's side cancels it on the server's side too. A call carries
its context and event loop (`Caller`), so a server's sampling request during it is answered
by the run's model on the run's own loop.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from agentloop import RunContext, Tool
from agentloop.messages import ContentBlock

from .config import MCPServer, load_config
from .sampling import Caller, calling
from .source import MCPProblem, MCPToolSource
from .tools import MCPTool

__all__ = ("BackgroundToolSource", "MCPToolInfo", "close_all", "list_config_tools", "shared_source")


class BackgroundToolSource:
    """An `MCPToolSource` on a background event loop; `start()` and `close()` are blocking.

    ```python
    source = BackgroundToolSource(load_config("mcp.json")).start()
    agent = Agent(tools=source.tools())   # usable from any event loop
    ...
    source.close()
    ```
    """

    def __init__(self, servers: Iterable[MCPServer], **options: Any) -> None:
        """Describe the source; `options` are `MCPToolSource`'s keyword options."""
        self.servers = tuple(servers)
        self._options = options
        self._thread: threading.Thread | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._tools: list[_BridgedTool] = []
        self._error: BaseException | None = None
        self.errors: list[MCPProblem] = []
        """The servers left out when the source opened, and why (see `MCPToolSource`)."""
        self.skipped: list[MCPProblem] = []
        """Tools left out of the listing, and why."""
        self._instructions: str | None = None

    def start(self) -> BackgroundToolSource:
        """Open the source on a new daemon thread; return once every server answered.

        Raises:
            MCPConnectError: with `strict=True`, a server could not be reached.
            DuplicateToolError: with `strict=True`, two servers offer the same tool name.
        """
        if self._thread is not None:
            return self
        ready = threading.Event()

        def main() -> None:
            try:
                anyio.run(self._main, ready)
            except BaseException as exc:  # handed to start()'s caller
                self._error = exc
            finally:
                ready.set()

        self._thread = threading.Thread(target=main, name="agentloop-mcp", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            self._thread = None
            raise self._error
        return self

    async def _main(self, ready: threading.Event) -> None:
        async with (
            MCPToolSource(self.servers, **self._options) as source,
            anyio.from_thread.BlockingPortal() as portal,
        ):
            self._portal = portal
            self.errors, self.skipped = list(source.errors), list(source.skipped)
            self._instructions = source.instructions()
            self._tools = [
                _BridgedTool(t, portal) for t in source.tools() if isinstance(t, MCPTool)
            ]
            ready.set()
            await portal.sleep_until_stopped()

    def instructions(self) -> str | None:
        """The instructions of servers declared with `instructions` (see `MCPToolSource`)."""
        return self._instructions

    def tools(self) -> list[Tool]:
        """The tools (sorted by name), callable from any event loop while the source is open."""
        return list(self._tools)

    def bridged(self) -> list[_BridgedTool]:
        """The tools as `tools()` gives them, typed with their server and name on it."""
        return list(self._tools)

    def close(self) -> None:
        """Close the source (connections closed, server processes stopped) and its thread."""
        portal, self._portal = self._portal, None
        thread, self._thread = self._thread, None
        if portal is not None:
            try:
                portal.call(portal.stop)
            except RuntimeError:
                pass  # its loop has ended already
        if thread is not None:
            thread.join(timeout=60)
        self._tools = []


class _BridgedTool(Tool):
    """A tool of a background source, called from another event loop."""

    def __init__(self, inner: MCPTool, portal: anyio.from_thread.BlockingPortal) -> None:
        super().__init__(
            self._forward,
            name=inner.name,
            description=inner.description,
            timeout=inner.timeout,
            eager=inner.eager,
            input_schema=inner.input_schema,
            requires_approval=inner.requires_approval,
        )
        self.inner = inner
        self.source = inner.source
        self.server: str = inner.server
        """The name of the server it belongs to."""
        self.mcp_name: str = inner.mcp_name
        """The tool's name on its server (without prefix)."""
        self.origin: str = inner.origin
        """Where the tool comes from, for listings (its server)."""
        self.__doc__ = inner.__doc__
        self._portal = portal

    def __repr__(self) -> str:
        return f"BridgedTool({self.name!r}, server={self.inner.server!r})"

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Check the input against the server's schema (see `MCPTool.validate`)."""
        return self.inner.validate(arguments)

    def __call__(self, **arguments: Any) -> Any:
        """Call the tool directly, with its arguments by name (a coroutine), in no run."""
        return self._forward(RunContext("", 0, tool_name=self.name), arguments)

    async def _forward(
        self, ctx: RunContext[Any], arguments: dict[str, Any]
    ) -> str | list[ContentBlock] | None:
        """Run the call on the source's loop and wait for it here."""
        caller = Caller(ctx, anyio.lowlevel.current_token())
        future = self._portal.start_task_soon(
            _as_caller, caller, self.inner.function, ctx, arguments
        )
        try:
            result: str | list[ContentBlock] | None = await anyio.to_thread.run_sync(
                future.result, abandon_on_cancel=True
            )
        except anyio.get_cancelled_exc_class():
            future.cancel()  # cancels the call on the source's loop, and so on the server
            raise
        return result


async def _as_caller(
    caller: Caller,
    call: Callable[[RunContext[Any], dict[str, Any]], Awaitable[Any]],
    ctx: RunContext[Any],
    arguments: dict[str, Any],
) -> Any:
    """`call(ctx, arguments)` on the source's loop, on behalf of `caller` (its run, its loop)."""
    calling.set(caller)  # this task's own context
    return await call(ctx, arguments)


# --------------------------------------------------------------------------- shared sources

_shared: dict[str, BackgroundToolSource] = {}
_lock = threading.Lock()


def shared_source(
    path: str | os.PathLike[str], *, strict: bool = False, **options: Any
) -> BackgroundToolSource:
    """The process-wide background source for config file `path`, started on first use.

    Every plugin manager that asks for the same file gets the same servers; they stop when
    the process exits (or at `close_all()`). A server that fails is left out and listed in
    the source's `errors`, unless `strict`. `options` are further `MCPToolSource` options
    (`elicitation=`, `sampling=`), used when the source starts.

    Raises:
        MCPConfigError: the file is missing or invalid.
        MCPConnectError: with `strict`, a server could not be reached.
    """
    key = f"{Path(path).resolve()}{' (strict)' if strict else ''}"
    with _lock:
        source = _shared.get(key)
        if source is None:
            source = BackgroundToolSource(load_config(path), strict=strict, **options).start()
            _shared[key] = source
        return source


def close_all() -> None:
    """Close every shared background source (also done when the process exits)."""
    with _lock:
        sources = list(_shared.values())
        _shared.clear()
    for source in sources:
        source.close()


atexit.register(close_all)


@dataclass(frozen=True)
class MCPToolInfo:
    """A tool of a config file's servers, as `list_config_tools` describes it."""

    name: str
    """The name the model sees (prefixed, made valid for the API)."""
    server: str
    """The server that offers it."""
    mcp_name: str
    """Its name on that server."""
    description: str
    input_schema: dict[str, Any]
    retryable: bool
    """Whether it is read-only or idempotent, so retried after a dropped connection."""


def list_config_tools(path: str | os.PathLike[str]) -> list[MCPToolInfo]:
    """Start a config file's servers, list their tools, and stop them again.

    For commands such as `agentloop tools --plugin mcp --mcp-config FILE`. Blocking; call
    it from synchronous code.

    A server that fails is left out of the list (and logged as `mcp.server_left_out`).

    Raises:
        MCPConfigError: the file is missing or invalid.
    """
    source = BackgroundToolSource(load_config(path)).start()
    try:
        infos = []
        for tool in source.tools():
            inner = tool.inner if isinstance(tool, _BridgedTool) else None
            if inner is not None:
                infos.append(
                    MCPToolInfo(
                        name=inner.name,
                        server=inner.server,
                        mcp_name=inner.mcp_name,
                        description=inner.description,
                        input_schema=inner.input_schema,
                        retryable=inner.retryable,
                    )
                )
        return infos
    finally:
        source.close()
