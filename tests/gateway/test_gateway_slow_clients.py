"""Slow clients cannot hold `agentloop serve`'s connections: slowloris and its kin.

The gateway runs as `python -m agentloop.gateway` with short limits; the clients are raw
sockets that trickle a request's head, stall its body, or open many connections.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from _gateway import ROOT, GatewayProcess, wait_until_healthy
from support import free_port

pytestmark = pytest.mark.timeout(120)

# Short, yet long enough for a loaded machine to answer a request that does arrive in time.
HEAD_TIMEOUT = 3.0
BODY_TIMEOUT = 1.0
PER_ADDRESS = 4


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The gateway with short limits; its host and port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLOOP_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = str(ROOT)
    port = free_port()
    command = [
        sys.executable, "-m", "agentloop.gateway", "--upstream", "http://127.0.0.1:9",
        "--port", str(port), "--store", "memory://",
        "--head-timeout", str(HEAD_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
        "--max-connections-per-address", str(PER_ADDRESS),
    ]  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stderr=out)
    try:
        wait_until_healthy(GatewayProcess(f"http://127.0.0.1:{port}", process, log), 120)
        yield "127.0.0.1", port
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()


def read_answer(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes the connection (`within` seconds)."""
    sock.settimeout(within)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def status_and_error(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def test_a_trickled_head_is_answered_408_and_closed(gateway: tuple[str, int]) -> None:
    with socket.create_connection(gateway) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\n")
        started = time.monotonic()
        # A header line every 0.2 s: each byte arrives well within any idle timeout.
        sock.settimeout(0.2)
        answer = b""
        for number in range(100):
            try:
                sock.sendall(f"x-trickle-{number}: 1\r\n".encode())
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if answer:
                answer += read_answer(sock, 10)
                break
        waited = time.monotonic() - started
    status, error = status_and_error(answer)
    assert status == 408 and error["type"] == "invalid_request_error"
    assert "head" in str(error["message"])
    assert waited < HEAD_TIMEOUT + 5, "closed at the head deadline, not at the trickle's end"


def test_a_stalled_body_is_answered_408(gateway: tuple[str, int]) -> None:
    with socket.create_connection(gateway) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: k\r\n"
            b'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"model"'
        )
        answer = read_answer(sock, BODY_TIMEOUT + 10)
    status, error = status_and_error(answer)
    assert status == 408 and "body" in str(error["message"])


def test_one_address_holds_a_bounded_number_of_connections(gateway: tuple[str, int]) -> None:
    idle = [socket.create_connection(gateway) for _ in range(PER_ADDRESS)]
    try:
        with socket.create_connection(gateway) as extra:
            status, error = status_and_error(read_answer(extra, 10))
        assert status == 429 and error["type"] == "rate_limit_error"
        # The idle ones are closed at the head deadline; the address is served again.
        for sock in idle:
            status, _ = status_and_error(read_answer(sock, HEAD_TIMEOUT + 10))
            assert status == 408
    finally:
        for sock in idle:
            sock.close()
    host, port = gateway
    assert httpx2.get(f"http://{host}:{port}/healthz", timeout=10).status_code == 200


def test_a_keep_alive_connection_gets_the_head_deadline_for_each_request(
    gateway: tuple[str, int],
) -> None:
    with socket.create_connection(gateway) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
        sock.settimeout(10)
        first = b""
        while not first.endswith(b'{"status":"ok"}'):  # the answer may come in parts
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        # The next request's head stalls half-way.
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        answer = read_answer(sock, HEAD_TIMEOUT + 10)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
