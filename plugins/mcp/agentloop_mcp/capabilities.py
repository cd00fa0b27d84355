"""What the client offers servers: roots and elicitation, each only when set up.

A capability is announced to a server only when it can be answered: roots when the
server's declaration lists directories, elicitation when the tool source was given a
handler and the server's `elicitation` switch is on, sampling (see `sampling.py`) unless
the server's `sampling` switch is off. A server that asks for one anyway is refused with
the protocol's error by the SDK. Progress is per call (see `connection.py`). Each function
here builds the SDK callback for one server. The server's log notifications are not a
capability: they are logged, and are `ToolLog` events of the runs whose calls they came
during.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as mcp_types
from agentloop import RunContext, ToolLog
from agentloop.logs import get_logger

from .config import MCPServer
from .form import ask_form
from .sampling import Caller, in_call

__all__ = (
    "ElicitationHandler",
    "elicitation_callback",
    "logging_callback",
    "roots_callback",
    "terminal_elicitation",
)

_log = get_logger()

ElicitationHandler = Callable[
    [str, mcp_types.ElicitRequestParams], Awaitable[mcp_types.ElicitResult]
]
"""`await handler(server_name, params)`: ask the user what a server wants to know."""


def roots_callback(server: MCPServer) -> Any:
    """The `roots/list` answer for `server`'s `roots` (directories), or None for none."""
    if not server.roots:
        return None
    roots = [
        mcp_types.Root(uri=Path(root).expanduser().resolve().as_uri(), name=Path(root).name)
        for root in server.roots
    ]

    async def list_roots(context: Any) -> mcp_types.ListRootsResult:
        return mcp_types.ListRootsResult(roots=roots)

    return list_roots


_LEVELS = {"debug": "debug", "info": "info", "notice": "info", "warning": "warning"}


def logging_callback(server: MCPServer, callers: Callable[[], Sequence[Caller]]) -> Any:
    """The callback that sends `server`'s log notifications to the logger and to runs.

    Each is an `mcp.server_log` event of the `agentloop` logger at the server's level
    (notice as info; error and above as error), with the server's name, its logger's name
    and the data; and a `ToolLog` event of the run whose call it came during. A
    notification does not say which call it belongs to (unless the SDK delivers it inside
    the call, as the 2026-07-28 protocol can), so it goes to each run with a call in
    flight on the server (`callers()`), named after that run's first such call; with no
    call in flight it is only logged.
    """

    async def log(params: mcp_types.LoggingMessageNotificationParams) -> None:
        level = _LEVELS.get(params.level, "error")
        getattr(_log, level)(
            "mcp.server_log",
            mcp_server=server.name,
            level_sent=params.level,
            logger_name=params.logger,
            data=params.data,
        )
        exact = in_call.get()
        runs: dict[str, tuple[Caller, RunContext[Any]]] = {}
        for caller in [exact] if exact is not None else callers():
            if caller.ctx is not None:
                runs.setdefault(caller.ctx.run_id, (caller, caller.ctx))
        for caller, ctx in runs.values():
            event = ToolLog(
                ctx.round,
                ctx.tool_use_id,
                ctx.tool_name,
                params.level,
                params.data,
                params.logger,
                f"mcp:{server.name}",
            )
            await caller.emit(event)

    return log


def elicitation_callback(server: MCPServer, handler: ElicitationHandler | None) -> Any:
    """The elicitation callback for `server`, or None when it is not offered."""
    if handler is None or not server.elicitation:
        return None

    async def elicit(
        context: Any, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        try:
            return await handler(server.name, params)
        except Exception as exc:
            _log.warning("mcp.elicitation_failed", mcp_server=server.name, error=str(exc))
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the client could not ask: {exc}"
            )

    return elicit


async def terminal_elicitation(
    server: str, params: mcp_types.ElicitRequestParams
) -> mcp_types.ElicitResult:
    """Ask on the terminal: the server's message, then each field of its form.

    Each field shows its type, bounds, choices and default, and is asked again until the
    answer fits its schema; Enter takes the default (or skips an optional field),
    `!decline` declines, `!cancel` or end of input (Ctrl-D) cancels.
    """
    return await anyio.to_thread.run_sync(_ask, server, params)


def _ask(server: str, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
    out = sys.stderr
    print(f"\nMCP server '{server}' asks: {params.message}", file=out)
    if isinstance(params, mcp_types.ElicitRequestURLParams):
        print(f"  open {params.url} (press Enter when done, Ctrl-D to cancel)", file=out)
        try:
            input()
        except EOFError:
            return mcp_types.ElicitResult(action="cancel")
        return mcp_types.ElicitResult(action="accept")
    return ask_form(params.requested_schema or {}, out, input)
