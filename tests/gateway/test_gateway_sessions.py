"""Gateway sessions across processes and time, and the gateway's own keys.

Real gateway processes on a real SQLite file and a real `redis-server`; the upstream is
the scripted Messages server, which lints every history it receives.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import pytest
import redis
from _gateway import ROOT, GatewayProcess, Upstream, dump, install_plugin, start_gateway
from support import redis_server

from agentloop.testing import reply, tool_call

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("gateway-site") / "site")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


def hidden_turn_script(key: str) -> tuple[dict[str, Any], list[Any]]:
    call = tool_call("lookup", {"key": key})
    return call, [reply(call), reply(f"It is value-of-{key}."), reply("Anything else?")]


async def turn(gateway: GatewayProcess, messages: list[Any], key: str = "sk-client-a") -> Any:
    async with gateway.client(key) as client:
        return await client.messages.create(model="m", max_tokens=100, messages=messages)


def follow_up(messages: list[Any], answer: Any) -> list[Any]:
    return [
        *messages,
        {"role": "assistant", "content": dump(answer.content)},
        {"role": "user", "content": "And?"},
    ]


def restored(body: dict[str, Any], call: dict[str, Any]) -> bool:
    """Whether the upstream got the hidden turn (the gateway's call and its result)."""
    messages = body["messages"]
    return (
        len(messages) == 5
        and messages[1]["content"] == [call]
        and messages[2]["content"][0]["tool_use_id"] == call["id"]
    )


async def test_a_restarted_gateway_finds_the_hidden_turn_in_sqlite(
    upstream: Upstream, site: Path, tmp_path: Path
) -> None:
    db = tmp_path / "state" / "sessions.db"
    call, script = hidden_turn_script("r")
    upstream.script(*script)
    first = start_gateway(upstream.url, site, tmp_path, store=f"sqlite:///{db}")
    assert db.exists(), "created on first use"
    messages: list[Any] = [{"role": "user", "content": "r?"}]
    answer = await turn(first, messages)
    assert first.stop() == 0, first.output()
    second = start_gateway(upstream.url, site, tmp_path, store=f"sqlite:///{db}")
    try:
        await turn(second, follow_up(messages, answer))
    finally:
        assert second.stop() == 0, second.output()
    assert restored(upstream.bodies[2], call)


async def test_two_gateways_share_sessions_through_redis(
    upstream: Upstream, site: Path, tmp_path: Path
) -> None:
    call, script = hidden_turn_script("s")
    upstream.script(*script)
    with redis_server() as url:
        one = start_gateway(upstream.url, site, tmp_path, store=url)
        two = start_gateway(upstream.url, site, tmp_path, store=url)
        try:
            messages: list[Any] = [{"role": "user", "content": "s?"}]
            answer = await turn(one, messages)
            await turn(two, follow_up(messages, answer))
        finally:
            assert one.stop() == 0, one.output()
            assert two.stop() == 0, two.output()
    assert restored(upstream.bodies[2], call)


async def test_replicas_share_a_secret_file_and_never_keep_one_in_redis(
    upstream: Upstream, site: Path, tmp_path: Path
) -> None:
    call, script = hidden_turn_script("f")
    upstream.script(*script)
    secret = tmp_path / "secret"
    secret.write_text("a long random secret\n")
    args = ["--secret-file", str(secret)]
    with redis_server() as url:
        one = start_gateway(upstream.url, site, tmp_path, store=url, args=args)
        redis.Redis.from_url(url).flushall()
        two = start_gateway(upstream.url, site, tmp_path, store=url, args=args)
        try:
            messages: list[Any] = [{"role": "user", "content": "f?"}]
            answer = await turn(one, messages)
            await turn(two, follow_up(messages, answer))
            assert not redis.Redis.from_url(url).exists("agentloop:gateway:secret")
        finally:
            assert one.stop() == 0, one.output()
            assert two.stop() == 0, two.output()
    assert restored(upstream.bodies[2], call)


async def test_a_session_past_its_ttl_is_gone(
    upstream: Upstream, site: Path, tmp_path: Path
) -> None:
    db = tmp_path / "ttl.db"
    _, script = hidden_turn_script("t")
    upstream.script(*script)
    gateway = start_gateway(
        upstream.url, site, tmp_path, store=f"sqlite:///{db}", args=["--session-ttl", "1"]
    )
    try:
        messages: list[Any] = [{"role": "user", "content": "t?"}]
        answer = await turn(gateway, messages)
        with sqlite3.connect(db) as read:
            (expires,) = read.execute("SELECT max(expires) FROM snapshots").fetchone()
        assert 0 < expires - time.time() <= 1.0
        await anyio.to_thread.run_sync(_wait_past, expires)
        asked = follow_up(messages, answer)
        await turn(gateway, asked)
        assert upstream.bodies[2]["messages"] == asked, "forwarded as the client sent it"
        await anyio.to_thread.run_sync(_wait_for_purge, db)
        assert _rows(db) == 0
    finally:
        assert gateway.stop() == 0, gateway.output()


def _wait_past(moment: float) -> None:
    """Let the TTL pass: the passing of time is what is tested."""
    while time.time() <= moment:
        time.sleep(moment - time.time() + 0.01)


def _wait_for_purge(db: Path, timeout: float = 10) -> None:
    """Poll the file until the gateway's own purge has deleted the expired rows."""
    deadline = time.monotonic() + timeout
    while _rows(db) and time.monotonic() < deadline:
        time.sleep(0.05)


def _rows(db: Path) -> int:
    with sqlite3.connect(db) as read:
        return int(read.execute("SELECT count(*) FROM snapshots").fetchone()[0])


async def test_gateway_keys_admit_clients_and_its_own_key_goes_upstream(
    upstream: Upstream, site: Path, tmp_path: Path
) -> None:
    env = {"ANTHROPIC_API_KEY": "sk-upstream", "AGENTLOOP_GATEWAY_KEYS": "gk-one, gk-two"}
    gateway = start_gateway(upstream.url, site, tmp_path, env=env)
    upstream.script(reply("welcome"), reply("welcome too"))
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    try:
        answer = await turn(gateway, body["messages"], key="gk-two")  # Authorization: Bearer
        assert answer.content[0].text == "welcome"
        async with httpx2.AsyncClient() as http:
            ok = await http.post(
                gateway.url + "/v1/messages", json=body, headers={"x-api-key": "gk-one"}
            )
            none = await http.post(gateway.url + "/v1/messages", json=body)
        assert ok.status_code == 200
        assert none.status_code == 401
        assert none.json()["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await turn(gateway, body["messages"], key="sk-client-a")
        assert caught.value.status_code == 401
        assert caught.value.body["error"]["type"] == "authentication_error"
    finally:
        assert gateway.stop() == 0, gateway.output()
    assert [r.headers["authorization"] for r in upstream.recorded] == ["Bearer sk-upstream"] * 2


def test_an_upstream_key_without_gateway_keys_is_refused_at_startup(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOOP_")}
    env["ANTHROPIC_API_KEY"] = "sk-upstream"
    env["PYTHONPATH"] = str(ROOT)  # this checkout, from any working directory
    done = subprocess.run(
        [sys.executable, "-m", "agentloop.gateway", *("--upstream", "http://127.0.0.1:9")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "AGENTLOOP_GATEWAY_KEYS" in done.stderr


@pytest.mark.parametrize("problem", ["port-in-use", "bad-upstream"])
def test_a_gateway_that_cannot_work_says_so_in_one_line_at_startup(
    problem: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLOOP_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = str(ROOT)  # this checkout, from any working directory
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        upstream = "not-a-url" if problem == "bad-upstream" else "http://127.0.0.1:9"
        if problem == "bad-upstream":
            port = 0
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentloop.gateway",
                *("--upstream", upstream, "--port", str(port), "--store", "memory://"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("agentloop: error: ")
    assert ("not-a-url" if problem == "bad-upstream" else f"127.0.0.1:{port}") in line
