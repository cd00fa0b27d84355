"""What several test layers start: free ports, Redis, PostgreSQL, an ASGI app on uvicorn.

Each helper is a plain function or context manager (the layers' conftest.py files make
fixtures of them where they need one) and skips the test, saying what is missing, when
its server is not installed. Only the base install is imported here; uvicorn is imported
by `serving`, the one helper that needs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

REDIS_OPTIONS = ("--save", "", "--appendonly", "no", "--daemonize", "no")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (as the system hands one out)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- an ASGI app on uvicorn


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """The ASGI `app` (with a `/healthz`) served by uvicorn here; yields its URL."""
    uvicorn = pytest.importorskip(
        "uvicorn", reason="uvicorn is not installed (pip install 'agentloop-runner[gateway]')"
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        url = f"http://127.0.0.1:{port}"
        await anyio.to_thread.run_sync(wait_healthy_url, url)
        try:
            yield url
        finally:
            server.should_exit = True


def wait_healthy_url(url: str) -> None:
    """Poll `url`/healthz until it answers 200 (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx2.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError("the gateway did not start")


# ---------------------------------------------------------------- Redis


@dataclass
class RedisProcess:
    url: str
    process: subprocess.Popen[bytes]
    port: int = 0

    def stop(self) -> None:
        """Kill the server (SIGKILL: no chance to tidy up)."""
        self.process.kill()
        self.process.wait(10)

    def restart(self) -> None:
        """Kill the server and start a new one on its port (empty: nothing persists)."""
        self.stop()
        self.process = _start_redis(self.port)


def _start_redis(port: int) -> subprocess.Popen[bytes]:
    """`redis-server` on `port`, once it answers PING."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", *REDIS_OPTIONS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return process
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("redis-server did not start")
        time.sleep(0.02)


@contextmanager
def redis_process() -> Iterator[RedisProcess]:
    """A real `redis-server` on a free port, without persistence."""
    port = free_port()
    server = RedisProcess(f"redis://127.0.0.1:{port}/0", _start_redis(port), port)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(10)


@contextmanager
def redis_server() -> Iterator[str]:
    """A real `redis-server` on a free port, without persistence; its URL."""
    with redis_process() as server:
        yield server.url


# ---------------------------------------------------------------- PostgreSQL


def _postgres_bin() -> Path | None:
    """Where PostgreSQL's server programs are (Debian keeps them off PATH), if installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


@dataclass
class PostgresProcess:
    """A running throwaway cluster, which a test may stop and start again."""

    url: str
    """Its base URL (naming no database)."""
    ctl: list[str]
    """`pg_ctl -D DATA` (as the cluster's user)."""
    options: list[str]
    """What `start` passes to `pg_ctl start`."""

    def stop(self) -> None:
        """Stop the server at once (`immediate`: no chance to tidy up, like a crash)."""
        subprocess.run(
            [*self.ctl, "-m", "immediate", "stop"], check=True, capture_output=True, timeout=60
        )

    def start(self) -> None:
        """Start the server again on the same port and data; returns once it accepts."""
        subprocess.run(
            [*self.ctl, *self.options, "start"], check=True, capture_output=True, timeout=90
        )


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 in a temporary folder; its base URL.

    The URL names no database: each user creates one of its own. PostgreSQL refuses to
    run as root; as root, the cluster belongs to the `postgres` user the package creates.
    """
    with postgres_process() as server:
        yield server.url


@contextmanager
def postgres_process() -> Iterator[PostgresProcess]:
    """The cluster of `postgres_cluster`, with what it takes to stop and start it again."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip(
            "PostgreSQL's initdb not found under /usr/lib/postgresql or on PATH "
            "(apt-get install postgresql)"
        )
    root = Path(tempfile.mkdtemp(prefix="agentloop-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    port = free_port()
    try:
        subprocess.run(
            [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        server = PostgresProcess(
            f"postgresql://postgres@127.0.0.1:{port}",
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data)],
            ["-o", options, "-l", str(root / "log.txt"), "-w", "-t", "60"],
        )
        server.start()
        yield server
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def mypy_strict(files: list[Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """`mypy --strict`'s report on `files` (no summary line), run from `cwd`.

    From the checkout, mypy finds agentloop's settings and the cache `.ci/run` leaves.
    """
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    return done.stdout


def with_ctrl_c() -> None:
    """`preexec_fn` for a child that Ctrl-C must reach, as it reaches a terminal's
    foreground command: a shell's background job (CI started with `&`) ignores SIGINT,
    and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
