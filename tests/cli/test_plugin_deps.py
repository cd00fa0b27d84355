"""The plugin of docs/plugins.md, installed as the page builds it, under the command.

Its files are taken from the page's code blocks, pip-installed into a private target
directory, and run by `agentloop run` and `agentloop serve` against `MessagesServer`: the
plugin's tool gets the plugin's own deps, with nothing passed on the command line. A
tool's unexpected exception is one line on stderr (`-v` adds the traceback).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import pytest
from support import free_port

from agentloop.plugins import ENV_VAR
from agentloop.testing import MessagesServer, reply, tool_call

ROOT = Path(__file__).resolve().parents[2]
FILE_BLOCK = re.compile(
    r"^```(?:python|toml)\s*$\n# (\S+)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL
)

# A plugin whose tool has a bug: its exception must not reach the terminal as a traceback.
BUGGY = """\
import agentloop


def divide(a: int, b: int) -> float:
    \"\"\"Divide a by b.\"\"\"
    return a / b


@agentloop.hookimpl
def agentloop_register_tools(register):
    register(divide)
"""


def pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the docs' acme-tools plugin and a buggy one, pip-installed."""
    root = tmp_path_factory.mktemp("plugin-deps")
    blocks = {m[1]: m[2] for m in FILE_BLOCK.finditer((ROOT / "docs" / "plugins.md").read_text())}
    acme = root / "acme-tools"
    (acme / "acme_tools").mkdir(parents=True)
    (acme / "acme_tools" / "__init__.py").write_text("")
    for name in ("pyproject.toml", "acme_tools/tools.py", "acme_tools/plugin.py"):
        (acme / name).write_text(blocks[name])
    buggy = root / "buggy"
    (buggy / "agentloop_buggy_example").mkdir(parents=True)
    (buggy / "agentloop_buggy_example" / "__init__.py").write_text(BUGGY)
    (buggy / "pyproject.toml").write_text(
        blocks["pyproject.toml"]
        .replace('"acme-tools"', '"agentloop-buggy-example"')
        .replace('acme = "acme_tools.plugin"', 'buggy = "agentloop_buggy_example"')
    )
    target = root / "site"
    # The dev extra brings setuptools: no isolated build environment to download.
    pip(
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(target),
        str(acme),
        str(buggy),
    )
    return target


def environment(site: Path, cwd: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.pop("ACME_ORDERS", None)
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, ENV_VAR: "acme,buggy", **extra}


def agentloop_run(
    site: Path, cwd: Path, script: list[object], *args: str
) -> tuple[subprocess.CompletedProcess[str], MessagesServer]:
    with MessagesServer(script) as server:
        env = environment(site, cwd, ANTHROPIC_API_KEY="k", ANTHROPIC_BASE_URL=server.base_url)
        done = subprocess.run(
            [sys.executable, "-m", "agentloop", "run", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=60,
        )
    return done, server


def test_the_docs_plugin_reads_its_own_deps_under_agentloop_run(site: Path, tmp_path: Path) -> None:
    (tmp_path / "orders.json").write_text('{"A1": "shipped"}')
    script = [reply(tool_call("lookup_order", {"order_id": "A1"})), reply("It has shipped.")]
    done, server = agentloop_run(site, tmp_path, script, "Where is order A1?", "--plugin", "acme")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "tool lookup_order <- shipped" in done.stdout
    assert done.stdout.rstrip().endswith("It has shipped.")
    result = server.requests[1]["messages"][-1]["content"][0]
    assert (result["content"], result.get("is_error")) == ("shipped", None)


def test_the_plugins_own_refusal_reaches_the_model(site: Path, tmp_path: Path) -> None:
    script = [reply(tool_call("lookup_order", {"order_id": "A1"})), reply("I cannot tell.")]
    done, server = agentloop_run(site, tmp_path, script, "Where is order A1?", "--plugin", "acme")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    result = server.requests[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert result["content"].startswith("the order book orders.json cannot be read: ")


def test_a_tools_exception_is_one_line_and_v_shows_the_traceback(
    site: Path, tmp_path: Path
) -> None:
    script = [reply(tool_call("divide", {"a": 1, "b": 0})), reply("Cannot divide by zero.")]
    done, server = agentloop_run(site, tmp_path, script, "1/0?", "--plugin", "buggy")
    # The run ended as the model decided: the failure was the model's to handle.
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "tool.exception" in line
    assert "error='ZeroDivisionError: division by zero'" in line
    assert "-v shows the traceback" in line
    result = server.requests[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert result["content"] == "Tool 'divide' failed: ZeroDivisionError: division by zero"

    verbose, _ = agentloop_run(site, tmp_path, script, "1/0?", "--plugin", "buggy", "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "Traceback (most recent call last)" in verbose.stderr
    assert "return a / b" in verbose.stderr


def wait_until_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Poll `url`/healthz until it answers 200; fail if the process exits or 60 s pass."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"agentloop serve exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx2.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.05)  # polling a real condition, with a deadline
    pytest.fail(f"agentloop serve did not become healthy:\n{log.read_text()}")


@pytest.fixture
def gateway(site: Path, tmp_path: Path) -> Iterator[tuple[str, MessagesServer]]:
    """`agentloop serve --plugin acme` in front of a `MessagesServer`, healthy."""
    (tmp_path / "orders.json").write_text('{"A1": "shipped"}')
    script = [reply(tool_call("lookup_order", {"order_id": "A1"})), reply("It has shipped.")]
    with MessagesServer(script) as upstream:
        port = free_port()
        command = [sys.executable, "-m", "agentloop", "serve", "--upstream", upstream.base_url]
        command += ["--port", str(port), "--store", "memory://", "--plugin", "acme"]
        with (tmp_path / "serve.log").open("wb") as log:
            process = subprocess.Popen(
                command, cwd=tmp_path, env=environment(site, tmp_path), stdout=log, stderr=log
            )
        try:
            wait_until_healthy(process, f"http://127.0.0.1:{port}", tmp_path / "serve.log")
            yield f"http://127.0.0.1:{port}", upstream
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


async def test_the_docs_plugin_reads_its_own_deps_under_agentloop_serve(
    gateway: tuple[str, MessagesServer],
) -> None:
    url, upstream = gateway
    client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-client", max_retries=0)
    message = await client.messages.create(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "Where is A1?"}]
    )
    await client.close()
    assert message.content[0].type == "text" and message.content[0].text == "It has shipped."
    result = upstream.requests[1]["messages"][-1]["content"][0]
    assert (result["content"], result.get("is_error")) == ("shipped", None)
