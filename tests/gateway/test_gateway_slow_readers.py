"""A streaming client that reads nothing holds a bounded buffer, then is dropped.

The gateway is served in this process; the upstream streams a long answer (megabytes of
text) that the client never reads. The gateway keeps a few events for it, stops reading
the upstream meanwhile, and once the buffer has stayed full for its patience closes the
client's connection, cancels the run (and its upstream request) and logs its usage.
"""

from __future__ import annotations

import json
import socket
import time

import anyio
import pytest
from _gateway import gateway_on
from structlog.testing import capture_logs

from agentloop.gateway.app import GatewayConfig
from agentloop.testing import MessagesServer, RawResponse, reply, sse_events

pytestmark = pytest.mark.timeout(120)

PATIENCE = 1.0
TEXT = "x" * (8 << 20)  # 8 MiB the client never reads


def request(port: int) -> bytes:
    body = json.dumps(
        {
            "model": "m",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "Write a lot."}],
        }
    ).encode()
    head = (
        f"POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nx-api-key: sk-a\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def closed_after(sock: socket.socket, deadline: float) -> None:
    """Read `sock` until the server has closed it (what it wrote before is read too)."""
    sock.settimeout(deadline)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass


async def test_a_client_that_reads_nothing_is_dropped_and_its_run_cancelled() -> None:
    upstream = MessagesServer([RawResponse(sse=sse_events(reply(TEXT), chunk=4096))]).start()
    config = GatewayConfig(
        upstream=upstream.base_url,
        store="memory://",
        stream_buffer=8,
        slow_client_timeout=PATIENCE,
    )
    try:
        with capture_logs() as logs:
            async with gateway_on(config) as url:
                port = int(url.rsplit(":", 1)[1])

                def read_nothing() -> None:
                    with socket.socket() as sock:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                        sock.connect(("127.0.0.1", port))
                        sock.sendall(request(port))
                        # Nothing is read until the gateway has given up on this client.
                        deadline = time.monotonic() + 60
                        while not any(e["event"] == "gateway.client_dropped" for e in logs):
                            assert time.monotonic() < deadline, "the client was never dropped"
                            time.sleep(0.05)
                        closed_after(sock, 30)

                await anyio.to_thread.run_sync(read_nothing)
    finally:
        upstream.stop()
    events = [e["event"] for e in logs]
    assert "gateway.client_too_slow" in events
    assert "run.cancelled" in events, "the run, and its upstream request, were cancelled"
    (entry,) = [e for e in logs if e["event"] == "gateway.client_dropped"]
    assert entry["usage"] is not None and "input_tokens" in entry["usage"]
