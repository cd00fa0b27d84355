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
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
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

from agentloop.gateway.app import Gateway, GatewayConfig
from agentloop.testing import Fault, MessagesServer, RecordedRequest

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
) -> GatewayProcess:
    """`python -m agentloop.gateway` with the test tools; returns once /healthz answers 200."""
    port = free_port()
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
    wait_until_healthy(gateway)
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
