"""Claude Code, the real client, through `agentloop serve --plugin cortex`.

Claude Code is an npm package: `.ci/run` installs it when `npm` is present and points
`AGENTLOOP_CLAUDE_CODE` at it; otherwise a `claude` on the PATH is used, and the test is
skipped when there is neither. The upstream is a `MessagesServer` (which lints every
history it receives) answering as a function of the request: asked to remember
something, the model calls cortex's `append_file`, which the gateway runs and hides, and
Claude Code's own `Read` in the same turn, which the gateway hands back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _gateway import GatewayProcess, Upstream, wait_until_healthy
from support import free_port

from agentloop.testing import reply, tool_call

CLAUDE = os.environ.get("AGENTLOOP_CLAUDE_CODE") or shutil.which("claude")

pytestmark = pytest.mark.skipif(
    CLAUDE is None,
    reason="Claude Code is not installed (npm install @anthropic-ai/claude-code, "
    "or set AGENTLOOP_CLAUDE_CODE to its `claude`)",
)

_CLIENT_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL")


def _turns(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The user and assistant messages (Claude Code also sends mid-conversation system ones)."""
    return [m for m in body["messages"] if m.get("role") in ("user", "assistant")]


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def model(notes: Path, body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model: a pure function of the request (`notes` is the file to read)."""
    blocks = _blocks(_turns(body)[-1])
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        return reply(f"Noted, and I read the file ({len(results)} results).")
    words = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    names = {t.get("name") for t in body.get("tools") or []}
    if "remember" in words.lower() and {"append_file", "Read"} <= names:
        return reply(
            "Saving that.",
            tool_call("append_file", {"filename": "memory.md", "content": "- likes tea\n"}),
            tool_call("Read", {"file_path": str(notes)}),
        )
    return reply("Nothing else for now.")


def claude(project: Path, home: Path, gateway: str, *words: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=gateway,
        ANTHROPIC_API_KEY="sk-client-a",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    assert CLAUDE is not None
    done = subprocess.run(
        [CLAUDE, "-p", *words, "--allowedTools", "Read"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_claude_code_runs_through_the_gateway_with_hidden_cortex_tools(tmp_path: Path) -> None:
    project, home, cortex = tmp_path / "project", tmp_path / "home", tmp_path / "cortex"
    for folder in (project, home, cortex):
        folder.mkdir()
    (project / "notes.txt").write_text("tea notes\n")
    upstream = Upstream()
    upstream.script(function=partial(model, project / "notes.txt"))
    port = free_port()
    command = [sys.executable, "-m", "agentloop.gateway", "--upstream", upstream.url]
    command += ["--port", str(port), "--plugin", "cortex", "--cortex-root", str(cortex)]
    command += ["--store", f"sqlite:///{tmp_path / 'sessions.db'}"]
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    gateway = GatewayProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_until_healthy(gateway)
        first = claude(project, home, gateway.url, "Please remember that I like tea.")
        second = claude(project, home, gateway.url, "--continue", "Anything else?")
    finally:
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
        upstream.stop()

    assert "Noted, and I read the file (2 results)." in first
    assert "Nothing else for now." in second
    assert (cortex / "default" / "memory.md").read_text() == "- likes tea\n"

    bodies = upstream.bodies
    # Every request Claude Code made passed the upstream's history checks (else a 400 and a
    # failed `claude`); its own tools and the gateway's were both announced.
    asked = next(i for i, b in enumerate(bodies) if "Saving that." in json.dumps(b))
    calls = [b for b in _blocks(_turns(bodies[asked])[-2]) if b["type"] == "tool_use"]
    assert [c["name"] for c in calls] == ["append_file", "Read"]
    # The turn's results reached the model in the model's order: the hidden one the
    # gateway ran, then the one Claude Code ran.
    results = [b for b in _blocks(_turns(bodies[asked])[-1]) if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [c["id"] for c in calls]
    assert "Appended" in json.dumps(results[0]["content"])
    assert "tea notes" in json.dumps(results[1]["content"])
    # `--continue` sent Claude Code's transcript, which lacks the hidden call; the gateway
    # put the hidden turn back before the new prompt.
    last = _turns(bodies[-1])
    assert any(b.get("name") == "append_file" for m in last for b in _blocks(m))
    # Claude Code itself never saw the hidden call: its transcript names only `Read`.
    transcripts = "".join(p.read_text() for p in (home / ".claude").rglob("*.jsonl"))
    assert '"Read"' in transcripts
    assert "append_file" not in transcripts
