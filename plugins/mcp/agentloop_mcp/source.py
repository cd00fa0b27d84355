"""The tool source: MCP servers' tools as agentloop tools, for as long as it is open.

`async with MCPToolSource(servers) as source:` starts one supervisor task per server (in a
task group the source owns), waits until every server answered with its tool list or
failed, and names the tools (prefix, then characters the API does not allow replaced by
`_`). A server that fails to start or times out is left out and listed in
`source.errors`; tools whose names collide (in one server once made valid, or with an
earlier server's) are left out and listed in `source.skipped`; the rest work
(`strict=True` makes any of these fatal).
Leaving the block stops the supervisors, which close their connections and stop the
server processes. `source.tools()` is the current listing, sorted by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import anyio
import anyio.abc
import mcp.types as mcp_types
from agentloop import ConfigurationError, Tool
from agentloop.errors import DuplicateToolError
from agentloop.logs import get_logger

from .capabilities import ElicitationHandler
from .config import MCPConfigError, MCPServer
from .connection import MCPConnectError, MCPRequestError, ServerConnection
from .sampling import MCPSampling
from .tools import MCPResourceTool, MCPTool

__all__ = ("MCPProblem", "MCPToolSource")

_log = get_logger()
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class MCPProblem:
    """A server left out of a tool source, or one of its tools left out, and why."""

    server: str
    """The server's name."""
    reason: str
    """Why, in words for a person (without the server's name)."""
    tool: str | None = None
    """The tool left out (its name on the server); None when the whole server is."""

    def __str__(self) -> str:
        if self.tool is None:
            return f"MCP server '{self.server}' left out: {self.reason}"
        return f"MCP server '{self.server}': tool {self.tool!r} left out: {self.reason}"


class MCPToolSource:
    """The tools of one or more MCP servers, live while the source is open.

    ```python
    async with MCPToolSource([MCPServer.stdio("my-server"), MCPServer.http(url)]) as source:
        agent = Agent(tools=[*my_tools, *source.tools()])
        result = await agent.run("...")
    ```
    """

    def __init__(
        self,
        servers: Iterable[MCPServer],
        *,
        connect_timeout: float = 30.0,
        reconnect_attempts: int = 3,
        reconnect_backoff: float = 0.25,
        strict: bool = False,
        sampling: MCPSampling | Literal[False] | None = None,
        elicitation: ElicitationHandler | None = None,
    ) -> None:
        """Describe the source; nothing connects before `async with`.

        Args:
            servers: The servers whose tools to offer.
            connect_timeout: Seconds a server may take to start and answer.
            reconnect_attempts: Reconnections tried, with backoff, after a dropped
                connection before the waiting calls are answered with an error (the next
                call tries again).
            reconnect_backoff: Seconds before the first reconnection; doubled after each
                failed attempt (at most 10 s).
            strict: Fail to open when any server fails (rather than leaving it out and
                listing it in `errors`).
            sampling: How servers' sampling requests are answered. None (the default):
                by the model of the run whose tool call they come with, counted in its
                usage, within `MCPSampling`'s default limits per server; `False`: offered
                to no server. Servers whose `sampling` switch is off are never offered it.
            elicitation: Ask the user what servers want to know with this handler
                (servers whose `elicitation` switch is off are not offered it).

        Raises:
            MCPConfigError: two servers share a name, or an option is out of range.
        """
        self.servers: tuple[MCPServer, ...] = tuple(servers)
        """The servers, as given."""
        names = [s.name for s in self.servers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise MCPConfigError(
                f"MCP server name(s) used twice: {', '.join(repeated)}; give each a name="
            )
        if connect_timeout <= 0 or reconnect_attempts < 0 or reconnect_backoff < 0:
            raise MCPConfigError(
                "connect_timeout must be > 0, reconnect_attempts and reconnect_backoff >= 0"
            )
        self._connections = [
            ServerConnection(
                server,
                on_tools_changed=self._on_tools_changed,
                connect_timeout=connect_timeout,
                reconnect_attempts=reconnect_attempts,
                reconnect_backoff=reconnect_backoff,
                sampling=None if sampling is False else sampling or MCPSampling(),
                elicitation=elicitation,
            )
            for server in self.servers
        ]
        self.strict = strict
        """Whether any server's failure is fatal when the source opens."""
        self.errors: list[MCPProblem] = []
        """The servers left out when the source opened, and why (empty when all work)."""
        self.skipped: list[MCPProblem] = []
        """Tools left out of the listing (a name the API cannot take, ...), and why."""
        self._tools: dict[str, list[MCPTool]] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._stack: AsyncExitStack | None = None
        self._version = 0
        self._changed = anyio.Event()

    async def __aenter__(self) -> MCPToolSource:
        """Start every server and fetch its tools; a server that fails is left out.

        Raises:
            MCPConnectError: with `strict`, a server could not be started or reached (each
                one is named).
            DuplicateToolError: with `strict`, two tools share a name (after prefixing).
        """
        if self._stack is not None:
            raise ConfigurationError("this MCPToolSource is open already")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            group = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(group.cancel_scope.cancel)
            self.errors, self.skipped = [], []
            connected = await self._start(group)
            self._tools = self._accept(connected)
            await self._add_resource_tools(connected)
        except BaseException:
            await stack.aclose()  # exits the group cleanly; the error is raised as it is
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop the supervisors: connections closed, server processes stopped."""
        stack, self._stack = self._stack, None
        self._tools = {}
        if stack is not None:
            # Not handed the body's exception: the group would wrap it in an ExceptionGroup.
            await stack.aclose()

    async def _start(self, group: anyio.abc.TaskGroup) -> list[ServerConnection]:
        """Start every supervisor at once; the connected ones, in the servers' order."""
        failures: dict[str, MCPConnectError] = {}

        async def start(connection: ServerConnection) -> None:
            try:
                await group.start(self._supervise, connection)
            except MCPConnectError as exc:
                failures[connection.server.name] = exc

        async with anyio.create_task_group() as starting:
            for connection in self._connections:
                starting.start_soon(start, connection)
        if failures and self.strict:
            raise MCPConnectError("; ".join(sorted(str(e) for e in failures.values())))
        for name, exc in failures.items():
            self._leave_out(name, exc.reason)
        return [c for c in self._connections if c.server.name not in failures]

    async def _supervise(
        self,
        connection: ServerConnection,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one supervisor in a scope of its own, so one server can be left out alone."""
        with anyio.CancelScope() as scope:
            self._scopes[connection.server.name] = scope
            await connection.run(task_status=task_status)

    def _accept(self, connected: list[ServerConnection]) -> dict[str, list[MCPTool]]:
        """Each server's named tools; a tool whose name another server has is left out.

        With `strict`, a clash raises instead.
        """
        named: dict[str, list[MCPTool]] = {}
        owners: dict[str, MCPTool] = {}
        for connection in connected:
            tools, skipped = self._name_tools(connection)
            kept = []
            for tool in tools:
                first = owners.get(tool.name)
                if first is None:
                    kept.append(tool)
                    owners[tool.name] = tool
                    continue
                reason = _clash(first, tool)
                if self.strict:
                    raise DuplicateToolError(reason)
                _log.info("mcp.tool_skipped", mcp_server=tool.server, tool=tool.mcp_name)
                skipped.append(MCPProblem(tool.server, reason, tool=tool.mcp_name))
            named[connection.server.name] = kept
            self.skipped += skipped
        return named

    async def _add_resource_tools(self, connected: list[ServerConnection]) -> None:
        """The `read_resource` tool of each server declared with `resources_tool`."""
        for connection in connected:
            server = connection.server
            if not server.resources_tool or server.name not in self._tools:
                continue
            name = _UNSAFE.sub("_", f"{server.prefix or server.name}_read_resource")
            try:
                resources = await _list_resources(connection)
            except MCPRequestError as exc:
                self.skipped.append(
                    MCPProblem(server.name, f"cannot list its resources: {exc}", "read_resource")
                )
                continue
            try:
                templates = await _list_templates(connection)
            except MCPRequestError:  # templates are optional: a server may not list them
                templates = []
            tool = MCPResourceTool(connection, name, resources, templates)
            try:
                _check_collisions({**self._tools, server.name: [*self._tools[server.name], tool]})
            except DuplicateToolError as exc:
                self.skipped.append(MCPProblem(server.name, str(exc), "read_resource"))
                continue
            self._tools[server.name] = sorted(
                [*self._tools[server.name], tool], key=lambda t: t.name
            )

    def _leave_out(self, server: str, reason: str) -> None:
        problem = MCPProblem(server, reason)
        # Info, not warning: `errors` is how the source reports it (the command prints it).
        _log.info("mcp.server_left_out", mcp_server=server, reason=reason)
        self.errors.append(problem)
        scope = self._scopes.get(server)
        if scope is not None:
            scope.cancel()  # its connection closes, its process stops

    def tools(self) -> list[Tool]:
        """Every server's tools, sorted by name: the listing as it is now.

        The listing changes only when a server announces a change to its tools
        (`notifications/tools/list_changed`), so agents built from it send the same tool
        definitions request after request. Build a new agent (or registry) to pick up a
        change.

        Raises:
            ConfigurationError: the source is not open.
        """
        if self._stack is None:
            raise ConfigurationError(
                "the MCP tool source is not open: use `async with MCPToolSource(...) as source`"
            )
        every = [t for tools in self._tools.values() for t in tools]
        return sorted(every, key=lambda t: t.name)

    def instructions(self) -> str | None:
        """The instructions of the servers declared with `instructions=True`.

        For a system prompt: each under a heading naming its server; None when there are
        none. Join it to your own system prompt, separated by a blank line.
        """
        parts = [
            f"## MCP server {c.server.name}\n\n{c.instructions.strip()}"
            for c in self._connections
            if c.server.instructions and c.instructions and c.server.name in self._tools
        ]
        return "\n\n".join(parts) or None

    # ------------------------------------------------------------ resources and prompts

    async def list_resources(self, server: str) -> list[mcp_types.Resource]:
        """The resources a server lists (every page).

        Raises:
            MCPRequestError: the server refused or is gone; ConfigurationError: no such
                server is open.
        """
        return await _list_resources(self._connection(server))

    async def list_resource_templates(self, server: str) -> list[mcp_types.ResourceTemplate]:
        """The resource templates a server lists (every page): URIs with `{placeholders}`.

        Raises:
            MCPRequestError: the server refused or is gone; ConfigurationError: no such
                server is open.
        """
        return await _list_templates(self._connection(server))

    async def read_resource(
        self, server: str, uri: str
    ) -> list[mcp_types.TextResourceContents | mcp_types.BlobResourceContents]:
        """The contents of one of a server's resources.

        Raises:
            MCPRequestError: the server refused (an unknown URI, say) or is gone.
        """
        result = await self._connection(server).fetch("read_resource", uri=uri)
        return list(result.contents)

    async def list_prompts(self, server: str) -> list[mcp_types.Prompt]:
        """The prompts a server lists (every page).

        Raises:
            MCPRequestError: the server refused or is gone.
        """
        connection = self._connection(server)
        found: list[mcp_types.Prompt] = []
        cursor: str | None = None
        for _ in range(100):
            page = await connection.fetch("list_prompts", cursor=cursor)
            found.extend(page.prompts)
            cursor = page.next_cursor
            if not cursor:
                break
        return found

    async def get_prompt(
        self, server: str, name: str, arguments: dict[str, str] | None = None
    ) -> mcp_types.GetPromptResult:
        """One of a server's prompts, filled in with `arguments`.

        Raises:
            MCPRequestError: the server refused (an unknown prompt, a missing argument).
        """
        return await self._connection(server).fetch(  # type: ignore[no-any-return]
            "get_prompt", name=name, arguments=arguments
        )

    def _connection(self, server: str) -> ServerConnection:
        if self._stack is None or server not in self._tools:
            open_ = ", ".join(sorted(self._tools)) or "none"
            raise ConfigurationError(f"no open MCP server named {server!r} (open: {open_})")
        return next(c for c in self._connections if c.server.name == server)

    @property
    def version(self) -> int:
        """Goes up by one each time a server's change of tools changes the listing."""
        return self._version

    async def wait_changed(self, version: int) -> int:
        """Wait until the listing has changed since `version` (see `version`); the new one.

        ```python
        version = source.version
        while True:
            agent = Agent(tools=source.tools())
            ...  # serve with this agent until the tools change
            version = await source.wait_changed(version)
        ```
        """
        while self._version <= version:
            await self._changed.wait()
        return self._version

    def _name_tools(self, connection: ServerConnection) -> tuple[list[MCPTool], list[MCPProblem]]:
        """The server's tools under the names the model sees, and the tools left out."""
        server = connection.server
        tools: dict[str, MCPTool] = {}
        clashed: dict[str, MCPTool] = {}
        skipped: list[MCPProblem] = []
        for spec in connection.tools:
            if not server.offers(spec.name):
                continue
            name = _UNSAFE.sub("_", f"{server.prefix}_{spec.name}" if server.prefix else spec.name)
            reason = _unusable(spec, name)
            if reason is not None:
                _log.info(  # reported through `skipped`, like `errors`
                    "mcp.tool_skipped", mcp_server=server.name, tool=spec.name, reason=reason
                )
                skipped.append(MCPProblem(server.name, reason, tool=spec.name))
                continue
            if name in tools or name in clashed:
                first = tools.pop(name, None) or clashed[name]
                clashed[name] = first
                reason = (
                    f"its name becomes {name!r} once made valid for the API, as "
                    f"{first.mcp_name!r}'s does; both are left out (exclude one of them)"
                )
                if self.strict:
                    raise DuplicateToolError(f"MCP server '{server.name}': tool {reason}")
                skipped += [
                    MCPProblem(server.name, reason, tool=t)
                    for t in {first.mcp_name, spec.name}
                    if not any(p.tool == t and p.reason == reason for p in skipped)
                ]
                continue
            tools[name] = MCPTool(connection, spec, name)
        return sorted(tools.values(), key=lambda t: t.name), skipped

    def _on_tools_changed(self, connection: ServerConnection) -> None:
        if self._stack is None:
            return
        name = connection.server.name
        try:
            tools, skipped = self._name_tools(connection)
            kept = [t for t in self._tools.get(name, []) if isinstance(t, MCPResourceTool)]
            tools = sorted([*tools, *kept], key=lambda t: t.name)
            named = {**self._tools, name: tools}
            _check_collisions(named)
        except ConfigurationError as exc:
            _log.warning("mcp.tools_change_rejected", mcp_server=name, error=str(exc))
            return
        self._tools = named
        self.skipped = [p for p in self.skipped if p.server != name] + skipped
        self._version += 1
        self._changed.set()
        self._changed = anyio.Event()


async def _list_resources(connection: ServerConnection) -> list[mcp_types.Resource]:
    found: list[mcp_types.Resource] = []
    cursor: str | None = None
    for _ in range(100):
        page = await connection.fetch("list_resources", cursor=cursor)
        found.extend(page.resources)
        cursor = page.next_cursor
        if not cursor:
            break
    return found


async def _list_templates(connection: ServerConnection) -> list[mcp_types.ResourceTemplate]:
    found: list[mcp_types.ResourceTemplate] = []
    cursor: str | None = None
    for _ in range(100):
        page = await connection.fetch("list_resource_templates", cursor=cursor)
        found.extend(page.resource_templates)
        cursor = page.next_cursor
        if not cursor:
            break
    return found


def _unusable(spec: mcp_types.Tool, name: str) -> str | None:
    """Why a listed tool cannot be offered to the model, or None."""
    if not 0 < len(name) <= 128:
        return f"its name is {len(name)} characters long, over the 128 the API allows"
    if spec.execution is not None and spec.execution.task_support == "required":
        return (
            "it must run as a task (task augmentation) of the 2025-11-25 protocol, which this "
            "client does not do (it runs the 2026-07-28 protocol's tasks)"
        )
    return None


def _clash(first: MCPTool, tool: MCPTool) -> str:
    """Why `tool` is left out: another server's tool has its name."""
    return (
        f"tool name {tool.name!r} is offered by MCP server '{first.server}' "
        f"(as {first.mcp_name!r}) and by MCP server '{tool.server}' (as {tool.mcp_name!r}); "
        f"the model addresses tools by name, so give one of them a prefix"
    )


def _check_collisions(named: dict[str, list[MCPTool]]) -> None:
    """Raise `DuplicateToolError` naming both servers when two offer one tool name."""
    owner: dict[str, MCPTool] = {}
    for tools in named.values():
        for tool in tools:
            first = owner.setdefault(tool.name, tool)
            if first is not tool:
                raise DuplicateToolError(_clash(first, tool))
