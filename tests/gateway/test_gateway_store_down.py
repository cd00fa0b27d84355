"""A durable gateway whose database goes down answers within its store timeout.

The gateway is served in this process with `--durable` on a PostgreSQL cluster of the
test's own, which the test stops while a run's tool call is under way and starts again:
the request in flight and a new one get a 500 `api_error` within a bounded time, and
the retry after PostgreSQL is back attaches to the run, whose tool ran once. A gateway
stopped while its database is still down lets its process exit (_store_down_child.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import anyio
import pytest
from _gateway import charge_upstream, durable_on, gateway_on, held_charge
from support import _postgres_bin, postgres_process

from agentloop.testing import MessagesServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.durable]

STORE_TIMEOUT = 2.0
BOUND = 5 * STORE_TIMEOUT
"""How long a client may wait for its error: 1.5 store timeouts, and room for a busy box."""

CHILD = Path(__file__).parent / "_store_down_child.py"
EXIT_BOUND = 60.0
"""How long the child may take to exit after its gateway stopped: DBOS's retries of the
stopped database wait a few seconds each by then, and the box may be busy."""

QUESTION: list[Any] = [{"role": "user", "content": "Charge order 42."}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_durable_gateway_answers_500_in_bounded_time_while_postgres_is_down(
    stream: bool,
) -> None:
    started, release = anyio.Event(), anyio.Event()
    charges: list[int] = []

    charge = held_charge(started, release, charges)
    upstream = MessagesServer(charge_upstream).start()
    with postgres_process() as postgres:
        config = durable_on(postgres.url, upstream.base_url, charge, store_timeout=STORE_TIMEOUT)
        try:
            async with gateway_on(config) as url:
                client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
                failures: list[tuple[anthropic.APIStatusError, float]] = []

                async def ask(messages: list[Any]) -> Any:
                    if stream:
                        async with client.messages.stream(
                            model="m", max_tokens=50, messages=messages
                        ) as events:
                            return await events.get_final_message()
                    return await client.messages.create(model="m", max_tokens=50, messages=messages)

                async def in_flight() -> None:
                    with pytest.raises(anthropic.APIStatusError) as caught:
                        await ask(QUESTION)
                    failures.append((caught.value, time.monotonic() - stopped))

                async with anyio.create_task_group() as group:
                    group.start_soon(in_flight)
                    with anyio.fail_after(60):
                        await started.wait()
                    await anyio.to_thread.run_sync(postgres.stop)
                    stopped = time.monotonic()
                    release.set()  # the call ends; its result cannot be recorded
                # A new request, while the database is still down.
                asked = time.monotonic()
                with pytest.raises(anthropic.APIStatusError) as new:
                    await ask([{"role": "user", "content": "Charge order 43."}])
                waited_new = time.monotonic() - asked
                await anyio.to_thread.run_sync(postgres.start)
                # The client's retry of the first request, once the database is back.
                retried = await ask(QUESTION)
                await client.close()
        finally:
            upstream.stop()
    ((error, waited),) = failures
    for failure in (error, new.value):
        body = failure.body
        assert isinstance(body, dict) and body["error"]["type"] == "api_error", body
        assert "durable runs' database" in body["error"]["message"]
    if not stream:
        assert error.status_code == new.value.status_code == 500
        assert error.body["request_id"] == error.request_id
    assert waited < BOUND and waited_new < BOUND, (waited, waited_new)
    assert [b.text for b in retried.content if b.type == "text"] == ["Charged once."]
    assert charges == [42], "the retry attached to the run: the call ran once"


def test_a_durable_gateway_stopped_while_postgres_is_down_lets_its_process_exit() -> None:
    """DBOS's threads retrying the stopped database do not keep the process alive."""
    if _postgres_bin() is None:
        pytest.skip("PostgreSQL's initdb not found (apt-get install postgresql)")
    with subprocess.Popen(
        [sys.executable, str(CHILD)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as child:
        try:
            assert child.stdout is not None
            lines = []
            for line in child.stdout:  # until the gateway stopped (the child's last line)
                lines.append(line.strip())
                if line.startswith("CLOSED"):
                    break
            assert lines[-2:-1] == ["ANSWERED InternalServerError"], lines
            assert lines[-1].startswith("CLOSED"), lines
            assert child.wait(timeout=EXIT_BOUND) == 0, "the process did not exit in time"
        finally:
            if child.poll() is None:
                child.kill()
