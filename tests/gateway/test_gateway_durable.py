"""Durable requests (`agentloop serve --durable dbos:URL`) with real processes.

The gateway runs as a subprocess in front of a scripted upstream. Its `ledger` tool
writes a line under the call's idempotency key, then waits for the test on a TCP
rendezvous; the test SIGKILLs the gateway while the tool waits, starts it again, and
the client sends the same request again. Durable, the retry attaches to the run: the
answer arrives, the ledger holds one line, the upstream was asked once per round.
Streamed, the first request gets round one's text live before the crash, and its retry
attaches all the same. Without `--durable` (the negative control), the retry runs the
tool again.
"""

from __future__ import annotations

import math
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, closing, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import anyio
import anyio.abc
import httpx2
import pytest
from _gateway import (
    CLIENT_TOOL,
    NOTE,
    Confidential,
    GatewayProcess,
    Upstream,
    echo_lookup,
    gateway_on,
    install_plugin,
    start_gateway,
    tool_result_text,
)

from agentloop import Capability, tool
from agentloop.durable.dbos_fleet import LEASES_TABLE
from agentloop.errors import ConfigurationError
from agentloop.gateway.app import Gateway, GatewayConfig
from agentloop.gateway.durable import DBOS_FILE, dbos_url
from agentloop.testing import Fault, MessagesServer, reply, tool_call

pytestmark = [pytest.mark.timeout(240), pytest.mark.durable]

LEDGER_ENV = "AGENTLOOP_GWTEST_LEDGER"
QUESTION = [{"role": "user", "content": "Charge order 42."}]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("durable-site") / "site")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("durable-logs")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.stop()


def texts(blocks: Any) -> list[str]:
    return [b.text for b in blocks if b.type == "text"]


def answered_tools(body: dict[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


@dataclass
class Rendezvous:
    """The test's side of the ledger tool's wait.

    The first call is held until `release` is set or, without one, never let go (until
    the gateway dies, which closes the connection); the others go on at once.
    """

    arrived: list[anyio.Event] = field(default_factory=lambda: [anyio.Event() for _ in range(3)])
    release: anyio.Event | None = None
    calls: int = 0

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()  # "started": the ledger line is written
            index = self.calls
            self.calls += 1
            self.arrived[index].set()
            if index == 0:
                if self.release is None:
                    with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                        await stream.receive()
                    return
                await self.release.wait()
            with suppress(anyio.BrokenResourceError):
                await stream.send(b"go\n")


def charge_script(upstream: Upstream, port: int) -> None:
    """The upstream calls the ledger tool (waiting on `port`), then answers its result."""

    def answer(body: dict[str, Any]) -> Any:
        if answered_tools(body):
            return reply("Charged once.")
        return reply("Charging.", tool_call("ledger", {"entry": "charge-42", "port": port}))

    upstream.script(function=answer)


@dataclass
class Crash:
    message: Any
    run_ids: list[str | None]
    ledger: list[str]
    upstream_requests: int
    tool_runs: int
    gateway: GatewayProcess
    before_the_crash: list[str] = field(default_factory=list)
    """The text a streaming first request got before the gateway died."""


async def crash_mid_tool(
    upstream: Upstream, site: Path, logs: Path, tmp: Path, args: list[str], *, stream: bool = False
) -> Crash:
    """Ask, SIGKILL the gateway while its tool waits, start it again, ask again.

    With `stream`, both requests stream (the first one's run then streams too).
    """
    ledger = tmp / "ledger.txt"
    options = {
        "store": f"sqlite:///{tmp / 'sessions.db'}",
        "env": {LEDGER_ENV: str(ledger)},
        "args": ["--plugin", "gwledger", *args],
    }
    rendezvous = Rendezvous()
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        charge_script(upstream, listener.extra(anyio.abc.SocketAttribute.local_port))
        first = await anyio.to_thread.run_sync(
            partial(start_gateway, upstream.url, site, logs, **options)
        )
        failures: list[Exception] = []
        first_done = anyio.Event()
        before_the_crash: list[str] = []
        heard = anyio.Event()  # a streaming first request got round one's text

        async def ask_first() -> None:
            try:
                async with first.client() as client:
                    if not stream:
                        await client.messages.create(model="m", max_tokens=50, messages=QUESTION)
                    else:
                        async with client.messages.stream(
                            model="m", max_tokens=50, messages=QUESTION
                        ) as streamed:
                            async for event in streamed:
                                if event.type == "text":
                                    before_the_crash.append(event.text)
                                elif event.type == "content_block_stop":
                                    heard.set()
            except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
                failures.append(exc)
            first_done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(listener.serve, rendezvous.handle)
            group.start_soon(ask_first)
            with anyio.fail_after(60):
                await rendezvous.arrived[0].wait()
                if stream:
                    await heard.wait()
            # The tool's effect happened and the tool waits: the gateway dies now.
            first.stop(signal.SIGKILL)
            with anyio.fail_after(60):
                await first_done.wait()
            assert len(failures) == 1, "the first request must have failed with the gateway"
            second = await anyio.to_thread.run_sync(
                partial(start_gateway, upstream.url, site, logs, **options)
            )
            with anyio.fail_after(120):
                async with second.client() as client:
                    if not stream:
                        raw = await client.messages.with_raw_response.create(
                            model="m", max_tokens=50, messages=QUESTION
                        )
                        message = await raw.parse()
                        run_id = raw.headers.get("agentloop-run-id")
                    else:
                        async with client.messages.stream(
                            model="m", max_tokens=50, messages=QUESTION
                        ) as streamed:
                            message = await streamed.get_final_message()
                            run_id = streamed.response.headers.get("agentloop-run-id")
            group.cancel_scope.cancel()
    return Crash(
        message=message,
        run_ids=[run_id],
        ledger=ledger.read_text().splitlines(),
        upstream_requests=len(upstream.recorded),
        tool_runs=rendezvous.calls,
        gateway=second,
        before_the_crash=before_the_crash,
    )


async def test_a_retry_after_a_crash_attaches_to_the_durable_run(
    upstream: Upstream, site: Path, logs: Path, tmp_path: Path
) -> None:
    durable = f"dbos:sqlite:///{tmp_path / 'dbos.sqlite'}"
    crash = await crash_mid_tool(upstream, site, logs, tmp_path, ["--durable", durable])
    try:
        assert texts(crash.message.content) == ["Charging.", "Charged once."]
        # The call under way at the crash ran again, under the same idempotency key:
        # its effect happened once.
        assert crash.tool_runs == 2
        assert len(crash.ledger) == 1, crash.ledger
        key, entry = crash.ledger[0].split(" ", 1)
        assert entry == "charge-42"
        run_id = crash.run_ids[0]
        assert run_id is not None and key.startswith(run_id + ":toolu_")
        # Round one was recorded before the crash; only round two went upstream after it.
        assert crash.upstream_requests == 2

        # A retry of the finished request gets the recorded answer, JSON or streamed,
        # with no new upstream request and no new tool run.
        async with crash.gateway.client() as client:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=50, messages=QUESTION
            )
            again = await raw.parse()
            async with client.messages.stream(
                model="m", max_tokens=50, messages=QUESTION
            ) as stream:
                streamed = await stream.get_final_message()
        assert again.model_dump() == crash.message.model_dump()
        assert raw.headers.get("agentloop-run-id") == run_id
        assert texts(streamed.content) == ["Charging.", "Charged once."]
        assert streamed.id == crash.message.id
        assert streamed.usage.output_tokens == crash.message.usage.output_tokens
        assert len(upstream.recorded) == 2
        assert (tmp_path / "ledger.txt").read_text().splitlines() == crash.ledger
    finally:
        assert crash.gateway.stop() == 0, crash.gateway.output()


async def test_a_streamed_request_streams_until_the_crash_and_its_retry_attaches(
    upstream: Upstream, site: Path, logs: Path, tmp_path: Path
) -> None:
    durable = f"dbos:sqlite:///{tmp_path / 'dbos.sqlite'}"
    args = ["--durable", durable]
    crash = await crash_mid_tool(upstream, site, logs, tmp_path, args, stream=True)
    try:
        # The first request got round one live, while the gateway's tool still waited.
        assert "".join(crash.before_the_crash) == "Charging."
        # The retry attached to the recovered run (its whole answer at the end).
        assert texts(crash.message.content) == ["Charging.", "Charged once."]
        assert crash.tool_runs == 2 and len(crash.ledger) == 1, crash.ledger
        run_id = crash.run_ids[0]
        assert run_id is not None and crash.ledger[0].startswith(run_id + ":toolu_")
        assert crash.upstream_requests == 2
        assert [body.get("stream") for body in upstream.bodies] == [True, True]
    finally:
        assert crash.gateway.stop() == 0, crash.gateway.output()


async def test_without_durable_a_retry_after_a_crash_runs_the_tool_again(
    upstream: Upstream, site: Path, logs: Path, tmp_path: Path
) -> None:
    crash = await crash_mid_tool(upstream, site, logs, tmp_path, [])
    try:
        assert texts(crash.message.content) == ["Charging.", "Charged once."]
        assert crash.tool_runs == 2
        # Two runs, two idempotency keys: the effect happened twice.
        assert len(crash.ledger) == 2, crash.ledger
        assert len({line.split(" ", 1)[0] for line in crash.ledger}) == 2
        assert crash.upstream_requests == 3
        assert crash.run_ids == [None]
    finally:
        assert crash.gateway.stop() == 0, crash.gateway.output()


# --------------------------------------------------------------------------- in this process


THINKING = {"type": "thinking", "thinking": "The table first.", "signature": "sig-1"}


@asynccontextmanager
async def durable_gateway(
    tmp: Path,
    answer: Callable[[dict[str, Any]], Any],
    calls: list[str],
    capabilities: Sequence[Capability] = (),
) -> AsyncIterator[tuple[str, MessagesServer]]:
    """A durable gateway served here, with a `lookup` tool that counts its calls."""

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        calls.append(key)
        return f"value-of-{key}"

    upstream = MessagesServer(answer).start()
    config = GatewayConfig(
        upstream=upstream.base_url,
        store=f"sqlite:///{tmp / 'sessions.db'}",
        tools=[lookup],
        durable=f"dbos:sqlite:///{tmp / 'dbos.sqlite'}",
        capabilities=capabilities,
    )
    try:
        async with gateway_on(config) as url:
            yield url, upstream
    finally:
        upstream.stop()


def blocks(message: Any) -> list[dict[str, Any]]:
    """The content blocks of an SDK message as the wire has them."""
    return [{k: v for k, v in b.to_dict().items() if k != "parsed_output"} for b in message.content]


async def test_a_streaming_client_gets_the_same_message_as_a_json_client(tmp_path: Path) -> None:
    def answer(body: dict[str, Any]) -> Any:
        if answered_tools(body):
            return reply(THINKING, "Now yours.", tool_call("client_tool", {"x": 1}))
        return reply(THINKING, "Looking.", tool_call("lookup", {"key": "a"}))

    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [CLIENT_TOOL],
        "messages": QUESTION,
    }
    calls: list[str] = []
    async with durable_gateway(tmp_path, answer, calls) as (url, upstream):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
        raw = await client.messages.with_raw_response.create(**request)
        message = await raw.parse()
        async with client.messages.stream(**request) as stream:
            streamed = await stream.get_final_message()
        await client.close()
        assert len(upstream.recorded) == 2  # the stream was the same run: answered as recorded
    assert calls == ["a"]
    assert [b["type"] for b in blocks(message)] == [
        "thinking",
        "text",
        "thinking",
        "text",
        "tool_use",
    ]
    assert blocks(message)[-1]["input"] == {"x": 1}
    assert message.stop_reason == "tool_use"
    assert blocks(streamed) == blocks(message)
    assert (streamed.id, streamed.stop_reason) == (message.id, message.stop_reason)
    assert streamed.usage.model_dump() == message.usage.model_dump()
    assert raw.headers["agentloop-run-id"].startswith("gw-")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_capability_wraps_each_step_of_a_durable_request(
    tmp_path: Path, stream: bool
) -> None:
    calls: list[str] = []
    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 50,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "What is k?"}],
    }
    async with durable_gateway(tmp_path, echo_lookup, calls, [Confidential()]) as (url, upstream):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
        if stream:
            async with client.messages.stream(**request) as streamed:
                message = await streamed.get_final_message()
        else:
            message = await client.messages.create(**request)
        await client.close()
        first, second = upstream.requests
    assert calls == ["k"]
    # The capability sees, and changes, the request as the client's fields make it.
    assert (first["model"], first["max_tokens"], first["system"]) == ("m", 50, f"Be brief. {NOTE}")
    assert second["system"] == f"Be brief. {NOTE}"
    assert tool_result_text(second) == "[masked]-of-k"
    assert texts(message.content)[-1] == "The table says: [masked]-of-k"


@pytest.mark.parametrize(
    ("executor_ids", "runs"),
    [
        pytest.param(("gw-a", "gw-b"), 1, id="own-ids"),
        pytest.param((None, None), 1, id="default-ids"),
    ],
)
async def test_gateways_sharing_a_database_recover_only_their_own_runs(
    upstream: Upstream,
    site: Path,
    logs: Path,
    tmp_path: Path,
    postgres: str,
    executor_ids: tuple[str | None, str | None],
    runs: int,
) -> None:
    """A gateway starting next to another one that has a run under way leaves that run alone.

    Without `--durable-executor-id` each gateway has an id of its own (`launch`'s), so
    neither recovers the other's run.
    """
    database = f"{postgres}/agentloop_{uuid.uuid4().hex[:12]}"
    release = anyio.Event()
    held = Rendezvous(release=release)
    gateways: list[GatewayProcess] = []

    def start(name: str, executor_id: str | None) -> GatewayProcess:
        args = ["--plugin", "gwledger", "--durable", f"dbos:{database}"]
        if executor_id is not None:
            args += ["--durable-executor-id", executor_id]
        store = f"sqlite:///{tmp_path / name}.db"
        env = {LEDGER_ENV: str(tmp_path / "ledger.txt")}
        gateway = start_gateway(upstream.url, site, logs, store=store, env=env, args=args)
        gateways.append(gateway)
        return gateway

    try:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            charge_script(upstream, listener.extra(anyio.abc.SocketAttribute.local_port))
            first = await anyio.to_thread.run_sync(start, "first", executor_ids[0])
            messages: list[Any] = []
            answered = anyio.Event()

            async def ask() -> None:
                async with first.client() as client:
                    messages.append(
                        await client.messages.create(model="m", max_tokens=50, messages=QUESTION)
                    )
                answered.set()

            async with anyio.create_task_group() as group:
                group.start_soon(listener.serve, held.handle)
                group.start_soon(ask)
                with anyio.fail_after(60):
                    await held.arrived[0].wait()
                # The first gateway's run waits in its tool call; the second one starts.
                second = await anyio.to_thread.run_sync(start, "second", executor_ids[1])
                if runs == 2:
                    with anyio.fail_after(60):
                        await held.arrived[1].wait()
                release.set()
                if runs == 1:  # (both-local: two runs of one id collide; no answer is due)
                    with anyio.fail_after(60):
                        await answered.wait()
                    assert texts(messages[0].content) == ["Charging.", "Charged once."]
                # Stopped, the second gateway cannot recover anything any more.
                await anyio.to_thread.run_sync(second.stop)
                group.cancel_scope.cancel()
    finally:
        for gateway in gateways:
            gateway.stop(signal.SIGKILL)
    assert held.calls == runs
    if runs == 1:
        from dbos import DBOSClient

        client = DBOSClient(system_database_url=database)
        try:
            (status,) = client.list_workflows()
        finally:
            client.destroy()
        assert status.recovery_attempts == 1
        assert status.executor_id == (executor_ids[0] or status.executor_id)


async def test_a_durable_answer_names_the_upstreams_stop_sequence(tmp_path: Path) -> None:
    def answer(body: dict[str, Any]) -> Any:
        if answered_tools(body):
            stopped = reply("Charged. Receipt", stop_reason="stop_sequence")
            container = {"id": "container_3", "expires_at": "2026-01-01T00:00:00Z"}
            return {**stopped, "stop_sequence": "###", "container": container}
        return reply(tool_call("lookup", {"key": "42"}))

    request: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "stop_sequences": ["###"],
        "messages": QUESTION,
    }
    calls: list[str] = []
    async with durable_gateway(tmp_path, answer, calls) as (url, upstream):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
        message = await client.messages.create(**request)
        async with client.messages.stream(**request) as stream:
            streamed = await stream.get_final_message()
        await client.close()
        assert len(upstream.recorded) == 2  # the stream was the same run: answered as recorded
    assert calls == ["42"]
    for answered in (message, streamed):
        assert (answered.stop_reason, answered.stop_sequence) == ("stop_sequence", "###")
        assert answered.container is not None and answered.container.id == "container_3"


async def test_a_failed_request_is_tried_again_as_a_new_attempt(tmp_path: Path) -> None:
    failed = False

    def answer(body: dict[str, Any]) -> Any:
        nonlocal failed
        if not answered_tools(body):
            return reply("Looking.", tool_call("lookup", {"key": "a"}))
        if not failed:
            failed = True
            return Fault.http_error(400, "invalid_request_error", "not today")
        return reply("It is value-of-a.")

    calls: list[str] = []
    async with durable_gateway(tmp_path, answer, calls) as (url, upstream):
        async with httpx2.AsyncClient(base_url=url, timeout=60) as http:
            body = {"model": "m", "max_tokens": 50, "messages": QUESTION}
            headers = {"x-api-key": "sk-a"}
            first = await http.post("/v1/messages", json=body, headers=headers)
            second = await http.post("/v1/messages", json=body, headers=headers)
            third = await http.post("/v1/messages", json=body, headers=headers)
        # Round one and its failed round two; the new attempt's round two; nothing for
        # the third request.
        assert len(upstream.recorded) == 3
    assert first.status_code == 400
    assert first.json()["error"]["type"] == "invalid_request_error"
    assert second.status_code == 200, second.text
    # The new attempt goes on from the partial run kept for the retry (as without
    # --durable): the client gets what the model said since.
    assert [b["text"] for b in second.json()["content"]] == ["It is value-of-a."]
    run_id = second.headers["agentloop-run-id"]
    assert run_id.endswith("-2")
    # The finished attempt answers from then on.
    assert third.json() == second.json()
    assert third.headers["agentloop-run-id"] == run_id
    # The retry went on from the tool's kept result: the tool ran once.
    assert calls == ["a"]


async def test_a_retried_thread_request_gets_the_same_reply(tmp_path: Path) -> None:
    def answer(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["content"] == "And b?":
            return reply("Not b.")
        if answered_tools(body):
            return reply("It is value-of-a.")
        return reply(tool_call("lookup", {"key": "a"}))

    calls: list[str] = []
    async with durable_gateway(tmp_path, answer, calls) as (url, upstream):
        async with httpx2.AsyncClient(base_url=url, timeout=60) as http:
            body = {
                "model": "m",
                "max_tokens": 50,
                "messages": QUESTION,
                "thread": {"type": "create"},
            }
            headers = {"x-api-key": "sk-a", "anthropic-beta": "message-threads-2026-01-01"}
            first = await http.post("/v1/messages", json=body, headers=headers)
            again = await http.post("/v1/messages", json=body, headers=headers)
            follow_up = {
                "model": "m",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "And b?"}],
                "thread": {"type": "continue", "previous_message_id": first.json()["id"]},
            }
            upstream_before = len(upstream.recorded)
            continued = await http.post("/v1/messages", json=follow_up, headers=headers)
            assert len(upstream.recorded) == upstream_before + 1
            continued_body = upstream.recorded[-1].body
    assert first.status_code == again.status_code == continued.status_code == 200
    assert again.json() == first.json()
    assert first.json()["id"].startswith("msg_")
    assert calls == ["a"]
    # The continued thread has the whole conversation, the hidden turn included.
    assert [m["role"] for m in continued_body["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


# --------------------------------------------------------------------------- the option


@pytest.mark.parametrize(
    ("option", "store", "url"),
    [
        pytest.param("dbos", "sqlite:///data/gw.db", "sqlite:///data/" + DBOS_FILE, id="relative"),
        pytest.param("dbos", "sqlite:////srv/gw.db", "sqlite:////srv/" + DBOS_FILE, id="absolute"),
        pytest.param("dbos", "sqlite:///gw.db", "sqlite:///" + DBOS_FILE, id="here"),
        pytest.param("dbos", "redis://127.0.0.1:6379/0", "sqlite:///" + DBOS_FILE, id="redis"),
        pytest.param(
            "dbos:postgresql://u:p@db/gw", "memory://", "postgresql://u:p@db/gw", id="given"
        ),
    ],
)
def test_the_dbos_database_is_next_to_the_store_unless_given(
    option: str, store: str, url: str
) -> None:
    assert dbos_url(option, store) == url


@pytest.mark.parametrize("option", ["temporal", "dbos:", "DBOS"])
def test_a_bad_durable_option_is_refused(option: str) -> None:
    with pytest.raises(ConfigurationError, match="--durable"):
        dbos_url(option, "memory://")


def test_without_dbos_installed_serve_says_what_to_install(tmp_path: Path) -> None:
    # `sys.modules[name] = None` is how Python makes a module impossible to import.
    code = (
        "import sys; sys.modules['dbos'] = None\n"
        "from agentloop.cli import main\n"
        "raise SystemExit(main(['serve', '--upstream', 'http://127.0.0.1:9', '--port', '0',"
        " '--store', 'memory://', '--durable', 'dbos']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert "agentloop: error: --durable dbos needs DBOS: pip install" in done.stderr
    assert "agentloop-runner[gateway,dbos]" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("option", "error"),
    [
        pytest.param(["--durable-executor-id", "gw-a"], "--durable-executor-id", id="executor"),
        pytest.param(["--durable-lease", "5"], "--durable-lease", id="lease"),
    ],
)
def test_a_durable_option_without_durable_is_a_usage_error(
    tmp_path: Path, option: list[str], error: str
) -> None:
    command = [sys.executable, "-m", "agentloop.gateway", "--upstream", "http://127.0.0.1:9"]
    command += ["--store", "memory://", *option]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"agentloop: error: {error} needs --durable"


@pytest.mark.parametrize("lease", [0, -1.0, math.inf, math.nan, True])
def test_a_lease_that_never_ends_or_never_lasts_is_refused(lease: float) -> None:
    config = GatewayConfig(upstream="http://127.0.0.1:9", durable="dbos", durable_lease=lease)
    with pytest.raises(
        ConfigurationError, match="durable_lease must be a finite number of seconds > 0"
    ):
        Gateway(config)


async def test_the_gateways_lease_lasts_as_long_as_it_is_told(tmp_path: Path) -> None:
    # The lease a fleet's gateways judge each other by: 40 s here instead of the default
    # 15, renewed every third of that, and released when the gateway stops.
    database = tmp_path / "dbos.sqlite"
    config = GatewayConfig(
        upstream="http://127.0.0.1:9",
        durable=f"dbos:sqlite:///{database}",
        durable_executor_id="gw-lease",
        durable_lease=40.0,
    )

    def leases() -> list[tuple[str, float]]:
        with closing(sqlite3.connect(database)) as db:
            rows = db.execute(f"SELECT executor_id, expires_at FROM {LEASES_TABLE}").fetchall()
        return [(executor, expires - time.time()) for executor, expires in rows]

    async with gateway_on(config):
        [(executor, left)] = leases()
    assert executor == "gw-lease" and 30 < left <= 40
    [(_, left)] = leases()
    assert left < 0  # stopped: the lease ran out at once, for a live gateway to take over
