"""What the gateway says when something fails: to a client, nothing it cannot see; to
whoever starts it, one line.

An upstream error in a round that carried the gateway's hidden turns keeps its status and
type but not its message (which may quote them); a history error is numbered as the
client sent its messages. The gateway served in this process (or, for its start-up, as
`python -m agentloop.gateway`); the upstream is the scripted Messages server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from _gateway import CLIENT_TOOL, ROOT, dump, gateway_on
from support import free_port

from agentloop import tool
from agentloop.gateway.app import GatewayConfig
from agentloop.gateway.errors import HIDDEN_ERROR
from agentloop.testing import Fault, MessagesServer, reply, tool_call

pytestmark = pytest.mark.timeout(60)

SECRET = "the vault code is 7431"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{SECRET} ({key})"


HIDDEN_CALL = tool_call("lookup", {"key": "vault"})
ASK: list[Any] = [{"role": "user", "content": "Open it."}]


def quoting(body: dict[str, Any]) -> Any:
    """An upstream that refuses the request, quoting what it was sent (as some do)."""
    quoted = str(body["messages"])[-400:]
    return Fault.http_error(400, "invalid_request_error", f"cannot process: {quoted}")


@asynccontextmanager
async def served(*script: Any) -> AsyncIterator[tuple[anthropic.AsyncAnthropic, MessagesServer]]:
    """The gateway and its upstream, which answers with `script` in order (a function in
    it is called with the request's body)."""
    items = list(script)

    def answer(body: dict[str, Any]) -> Any:
        item = items.pop(0)
        return item(body) if callable(item) else item

    upstream = MessagesServer(answer).start()
    config = GatewayConfig(upstream=upstream.base_url, store="memory://", tools=[lookup])
    try:
        async with gateway_on(config) as url:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
            async with client:
                yield client, upstream
    finally:
        upstream.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_upstream_error_in_a_hidden_round_keeps_its_status_and_type_not_its_text(
    stream: bool,
) -> None:
    async with served(reply(HIDDEN_CALL), quoting, quoting) as (client, upstream):
        # A stream has begun by then: the error is its `error` event.
        with pytest.raises(anthropic.APIStatusError) as caught:
            if stream:
                async with client.messages.stream(model="m", max_tokens=50, messages=ASK) as events:
                    await events.get_final_message()
            else:
                await client.messages.create(model="m", max_tokens=50, messages=ASK)
        # A first round carries only what the client sent: its error is passed on whole.
        other = [{"role": "user", "content": "Something else."}]
        with pytest.raises(anthropic.BadRequestError) as first:
            await client.messages.create(model="m", max_tokens=50, messages=other)
    assert SECRET in str(upstream.requests[1]["messages"]), "the hidden round was sent"
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["error"] == {"type": "invalid_request_error", "message": HIDDEN_ERROR}
    if not stream:
        assert caught.value.status_code == 400
        assert error["request_id"] == caught.value.request_id
    assert SECRET not in str(error) and "vault" not in str(error)
    assert "Something else." in first.value.body["error"]["message"]


async def test_an_unknown_tool_result_id_is_numbered_as_the_client_sent_its_messages() -> None:
    async with served(reply(HIDDEN_CALL), reply("Now yours.", tool_call("client_tool", {}))) as (
        client,
        upstream,
    ):
        answer = await client.messages.create(
            model="m", max_tokens=50, messages=ASK, tools=[CLIENT_TOOL]
        )
        sent = [
            *ASK,
            {"role": "assistant", "content": dump(answer.content)},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}],
            },
        ]
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="m", max_tokens=50, messages=sent, tools=[CLIENT_TOOL]
            )
    message = caught.value.body["error"]["message"]
    assert message.startswith("messages.2."), message
    assert "toolu_nope" in message
    assert len(upstream.requests) == 2, "the refused request never went upstream"


def gateway_command(*args: str) -> tuple[list[str], dict[str, str]]:
    """`python -m agentloop.gateway` with `args`, and an environment for this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLOOP_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = str(ROOT)
    upstream = ("--upstream", "http://127.0.0.1:9")
    return [sys.executable, "-m", "agentloop.gateway", *upstream, *args], env


@pytest.mark.parametrize("store", ["redis", "sqlite"])
def test_a_store_that_cannot_be_opened_at_startup_is_one_line_and_exit_2(
    store: str, tmp_path: Path
) -> None:
    # Nothing listens on the Redis port; the SQLite file's folder is a file.
    (tmp_path / "file").write_text("not a folder")
    url = {
        "redis": f"redis://127.0.0.1:{free_port()}/0",
        "sqlite": f"sqlite:///{tmp_path / 'file' / 'sessions.db'}",
    }[store]
    command, env = gateway_command("--port", "0", "--store", url)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"agentloop: error: the session store {url} cannot be opened: ")


def test_port_0_announces_the_port_the_gateway_listens_on(tmp_path: Path) -> None:
    command, env = gateway_command("--port", "0", "--store", "memory://")
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"on http://127\.0\.0\.1:(\d+) ", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        port = int(found.group(1))
        assert port != 0
        assert httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
