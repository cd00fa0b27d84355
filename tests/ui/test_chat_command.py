"""`agentloop chat --web` in a subprocess: the page and its endpoint, offline without a key.

Without ANTHROPIC_API_KEY the page talks to the cortex plugin's offline demo model, as
`agentloop run` does; the page's files and a prompt's events are read over HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from support import free_port

from agentloop.plugins import ENV_VAR

pytest.importorskip("uvicorn", reason="uvicorn is not installed (pip install '.[ui]')")


async def _until_healthy(url: str, process: anyio.abc.Process) -> None:
    """Poll `url`/healthz until it answers (the command starts in a fresh interpreter,
    loading every plugin: slow on a busy machine); fail at once if the command exits."""
    async with httpx2.AsyncClient() as client:
        with anyio.fail_after(120):
            while process.returncode is None:
                try:
                    if (await client.get(url + "/healthz", timeout=1)).status_code == 200:
                        return
                except httpx2.TransportError:
                    pass
                await anyio.sleep(0.05)  # polling a real condition, under the deadline above
    raise AssertionError(f"agentloop chat exited with {process.returncode}")


async def test_the_page_and_an_offline_run(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    command = [sys.executable, "-m", "agentloop", "chat", "--web", "--port", str(port)]
    command += ["--cortex-root", str(tmp_path / "cortex")]
    process = await anyio.open_process(
        command,
        env={**env, ENV_VAR: "cortex"},
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await _until_healthy(url, process)
        async with httpx2.AsyncClient(base_url=url) as client:
            page = await client.get("/")
            script = await client.get("/static/chat.js")
            run_input = {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "u", "role": "user", "content": "I like tea"}],
            }
            answer = await client.post("/agui", json=run_input)
    finally:
        process.terminate()
        with anyio.fail_after(20):
            await process.wait()
        assert process.stderr is not None
        stderr = b""
        async for chunk in process.stderr:
            stderr += chunk
    assert page.status_code == 200 and "<title>agentloop chat</title>" in page.text
    assert script.status_code == 200 and "agui" in script.text
    events = [
        json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")
    ]
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    called = [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"]
    assert called[0] == "read_file"
    assert b"offline" in stderr and b"cortex" in stderr


def test_chat_without_web_says_what_to_add() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    done = subprocess.run(
        [sys.executable, "-m", "agentloop", "chat"],
        capture_output=True,
        text=True,
        env={**env, ENV_VAR: "cortex"},
        timeout=60,
    )
    assert done.returncode == 2
    assert "--web" in done.stderr
