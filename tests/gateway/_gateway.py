"""Helpers for the gateway tests: the gateway as a real process, or served in this one.

The gateway's own tools come from `tests/gateway_plugin`, a real distribution installed
into a private folder that only the gateway processes put on their path. Free ports,
Redis and uvicorn serving are tests/support.py's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

pytest.importorskip(
    "starlette",
    reason="the gateway extra is not installed (pip install 'agentloop-runner[gateway]')",
)

from support import free_port, serving

from agentloop import Capability, RunContext, Tool, tool
from agentloop.calls import ToolCall, ToolResult
from agentloop.capabilities import NextCall, NextRequest
from agentloop.gateway.app import Gateway, GatewayConfig
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.testing import Fault, MessagesServer, RecordedRequest, reply, tool_call

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "gateway_plugin"

CLIENT_TOOL = {
    "name": "client_tool",
    "description": "A tool the client runs itself.",
    "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
}

PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check", "-q")

_ENV_DROPPED = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "AGENTLOOP_GATEWAY_KEYS",
    "AGENTLOOP_GATEWAY_SECRET",
    "AGENTLOOP_PLUGINS",
)


def install_plugin(target: Path) -> Path:
    """Install the test tools' distribution into `target` (a private site folder)."""
    source = target.parent / "gateway_plugin_src"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = subprocess.run(
        [*PIP, "install", "--no-deps", "--target", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


class Upstream:
    """A `MessagesServer` (which lints every history) whose answers each test scripts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] | Callable[[dict[str, Any]], Any] = []
        self._mark = 0
        self.server = MessagesServer(self._answer).start()

    def _answer(self, body: dict[str, Any]) -> Any:
        with self._lock:
            if callable(self._items):
                return self._items(body)
            if not self._items:
                return Fault.http_error(500, "api_error", "the test scripted no more answers")
            return self._items.pop(0)

    def script(self, *items: Any, function: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """Answer the next requests with `items` in order (or with `function`)."""
        with self._lock:
            self._items = function if function is not None else list(items)
            self._mark = len(self.server.recorded)

    @property
    def url(self) -> str:
        return self.server.base_url

    @property
    def recorded(self) -> list[RecordedRequest]:
        """Requests received since the last `script`."""
        return self.server.recorded[self._mark :]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.recorded]

    def stop(self) -> None:
        self.server.stop()


@dataclass
class GatewayProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, api_key: str = "sk-client-a", **options: Any) -> anthropic.AsyncAnthropic:
        options.setdefault("max_retries", 0)
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=api_key, **options)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def start_gateway(
    upstream: str,
    site: Path,
    log_dir: Path,
    *,
    store: str = "memory://",
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
    port: int | None = None,
    healthy_within: float = 60,
) -> GatewayProcess:
    """`python -m agentloop.gateway` with the test tools; returns once /healthz answers 200.

    On `port` when given (a restarted replica keeps its address), else on a free one.
    """
    port = port or free_port()
    environment = {k: v for k, v in os.environ.items() if k not in _ENV_DROPPED}
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), environment.get("PYTHONPATH", "")) if p
    )
    environment.update(env or {})
    command = [sys.executable, "-m", "agentloop.gateway", "--upstream", upstream]
    command += ["--port", str(port), "--plugin", "gwtest", "--store", store, *args]
    log = log_dir / f"gateway-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=environment, stdout=out, stderr=subprocess.STDOUT)
    gateway = GatewayProcess(f"http://127.0.0.1:{port}", process, log)
    wait_until_healthy(gateway, healthy_within)
    return gateway


def wait_until_healthy(gateway: GatewayProcess, timeout: float = 60) -> None:
    """Poll /healthz until it answers 200 (the process must not exit meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            pytest.fail(
                f"the gateway exited with {gateway.process.returncode}:\n{gateway.output()}"
            )
        try:
            if httpx2.get(gateway.url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.05)
    gateway.stop(signal.SIGKILL)
    pytest.fail(f"the gateway did not become healthy:\n{gateway.output()}")


def dump(blocks: Sequence[Any]) -> list[dict[str, Any]]:
    """SDK content blocks as the JSON dicts a request would carry."""
    return [b.to_dict() if hasattr(b, "to_dict") else dict(b) for b in blocks]


@asynccontextmanager
async def gateway_on(config: GatewayConfig | Gateway) -> AsyncIterator[str]:
    """The gateway served by uvicorn in this task's task group; yields its URL."""
    gateway = config if isinstance(config, Gateway) else Gateway(config)
    async with serving(gateway.app()) as url:
        yield url


NOTE = "Keep the values confidential."


class Confidential(Capability):
    """A capability the gateway's runs are wrapped in: a note added to each request's
    system prompt, and every `value` in what a gateway tool returns masked."""

    async def wrap_request(
        self, ctx: RunContext[Any], request: ModelRequest, call_next: NextRequest
    ) -> ModelResponse:
        system = request.system
        assert system is None or isinstance(system, str), "the tests send a plain system"
        return await call_next(replace(request, system=f"{system or ''} {NOTE}".strip()))

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        result = await call_next(call)
        return replace(result, content=result.text.replace("value", "[masked]"))


def tool_result_text(body: dict[str, Any]) -> str | None:
    """The text of the first tool_result of a request's last message, if it has one."""
    content = body["messages"][-1]["content"]
    for block in content if isinstance(content, list) else []:
        if block.get("type") == "tool_result":
            inner = block.get("content")
            if isinstance(inner, list):
                return "".join(b.get("text", "") for b in inner)
            return str(inner)
    return None


def echo_lookup(body: dict[str, Any]) -> Any:
    """The upstream: calls `lookup` for key "k", then says what the tool answered."""
    answered = tool_result_text(body)
    if answered is None:
        return reply("Looking.", tool_call("lookup", {"key": "k"}))
    return reply(f"The table says: {answered}")


def charge_upstream(body: dict[str, Any]) -> Any:
    """A scripted upstream: a call of `charge` for order 42, then "Charged once."."""
    content = body["messages"][-1]["content"]
    if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
        return reply("Charged once.")
    return reply(tool_call("charge", {"order": 42}))


def held_charge(started: Any, release: Any, charges: list[int]) -> Tool:
    """A `charge` tool that records its order, sets `started`, and waits for `release`."""

    @tool
    async def charge(order: int) -> str:
        """Charge an order."""
        charges.append(order)
        started.set()
        await release.wait()
        return f"order {order} charged"

    return charge


def durable_on(
    postgres_url: str, upstream: str, charge: Tool, store_timeout: float
) -> GatewayConfig:
    """A `--durable` gateway's config on a fresh database of `postgres_url`'s cluster."""
    return GatewayConfig(
        upstream=upstream,
        store="memory://",
        tools=[charge],
        durable=f"dbos:{postgres_url}/agentloop_{uuid.uuid4().hex[:12]}",
        store_timeout=store_timeout,
    )
