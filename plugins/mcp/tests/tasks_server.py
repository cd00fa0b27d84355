"""An MCP server whose tools run as tasks (the `io.modelcontextprotocol/tasks` extension).

Built with the SDK's server side: an `Extension` answers a call of a task tool with a
task handle, and serves `tasks/get` and `tasks/cancel`. No task waits on a clock; each
ends on a condition the test brings about:

- `report(topic, polls=2)`: completed once it has been polled `polls` times;
- `broken()`: failed (a JSON-RPC error) at its first poll;
- `stuck(tag)`: working until the client cancels it;
- `wait_started(count)` and `wait_cancelled(count)` (plain tools) return once that many
  tasks were created or cancelled: the tests' rendezvous;
- `poll_gaps(task_id)`: the seconds between the polls of a task, as the server saw them.

A client that does not declare the extension gets error -32021 (Missing Required Client
Capability) for the task tools, as the extension's specification says.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timezone
from typing import Any

import anyio
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import RequestParams

POLL_INTERVAL_MS = 200


class TaskIdParams(RequestParams):
    task_id: str


class Tasks(Extension):
    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.polls: dict[str, list[float]] = {}
        self.arguments: dict[str, dict[str, Any]] = {}
        self.cancelled: list[str] = []
        self.changed = anyio.Event()
        self.ids = itertools.count(1)

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self.get),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel),
        ]

    def note_change(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        if params.name not in ("report", "broken", "stuck"):
            return await call_next(ctx)
        declared = ctx.session.client_capabilities
        if declared is None or self.identifier not in (declared.extensions or {}):
            # A task only for a client that said it takes one; these tools have no other way.
            raise MCPError(
                -32021,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {self.identifier: {}}}},
            )
        now = datetime.now(timezone.utc).isoformat()
        task_id = f"{params.name}-{next(self.ids)}"
        self.tasks[task_id] = {
            "taskId": task_id,
            "status": "working",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": 60_000,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        self.polls[task_id] = []
        self.arguments[task_id] = params.arguments or {}
        self.note_change()
        return {"resultType": "task", **self.tasks[task_id]}

    async def get(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        task = self.tasks[params.task_id]
        polls = self.polls[params.task_id]
        polls.append(time.monotonic())
        if task["status"] == "working" and params.task_id.startswith("report"):
            arguments = self.arguments[params.task_id]
            if len(polls) >= arguments.get("polls", 2):
                topic = arguments.get("topic", "?")
                text = f"report on {topic} after {len(polls)} polls"
                task["status"] = "completed"
                task["result"] = {"content": [{"type": "text", "text": text}]}
        elif task["status"] == "working" and params.task_id.startswith("broken"):
            task["status"] = "failed"
            task["error"] = {"code": -32000, "message": "the disk is full"}
        return task

    async def cancel(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        self.tasks[params.task_id]["status"] = "cancelled"
        self.cancelled.append(params.task_id)
        self.note_change()
        return {}


def build() -> MCPServer:
    tasks = Tasks()
    server = MCPServer("tasks", extensions=[tasks])

    @server.tool(structured_output=False)
    def report(topic: str, polls: int = 2) -> str:
        """Write a report on a topic (runs as a task)."""
        raise AssertionError("served as a task")

    @server.tool(structured_output=False)
    def broken() -> str:
        """Fail (runs as a task)."""
        raise AssertionError("served as a task")

    @server.tool(structured_output=False)
    def stuck(tag: str) -> str:
        """Never finish (runs as a task)."""
        raise AssertionError("served as a task")

    @server.tool(structured_output=False)
    async def wait_started(count: int) -> str:
        """Return once `count` tasks were created; their ids."""
        while len(tasks.tasks) < count:
            await tasks.changed.wait()
        return ",".join(tasks.tasks)

    @server.tool(structured_output=False)
    async def wait_cancelled(count: int) -> str:
        """Return once `count` tasks were cancelled; their ids."""
        while len(tasks.cancelled) < count:
            await tasks.changed.wait()
        return ",".join(tasks.cancelled)

    @server.tool(structured_output=False)
    def poll_gaps(task_id: str) -> str:
        """The seconds between the polls of a task."""
        times = tasks.polls[task_id]
        return ",".join(f"{b - a:.3f}" for a, b in itertools.pairwise(times))

    return server


if __name__ == "__main__":
    build().run()
