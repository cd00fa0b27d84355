"""The gateway never holds a client for long: upstream waits are capped and a silent
upstream stream is given up.

The gateway served in this process; the upstream is the scripted Messages server.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import pytest
from _gateway import gateway_on

from agentloop import tool
from agentloop.gateway.app import GatewayConfig
from agentloop.testing import Fault, MessagesServer, reply, tool_call

pytestmark = pytest.mark.timeout(60)

ASK: list[Any] = [{"role": "user", "content": "k?"}]


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def test_a_hidden_round_waits_a_short_retry_after_and_hands_a_long_one_on() -> None:
    call = tool_call("lookup", {"key": "k"})
    upstream = MessagesServer(
        [
            reply(call),
            Fault.rate_limited(retry_after=0.1),
            reply("Found it."),
            reply(call),
            Fault.rate_limited(retry_after=30),
        ]
    ).start()
    config = GatewayConfig(
        upstream=upstream.base_url, store="memory://", tools=[lookup], retry_wait_limit=5
    )
    try:
        async with gateway_on(config) as url:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
            async with client:
                answer = await client.messages.create(model="m", max_tokens=50, messages=ASK)
                started = time.monotonic()
                with pytest.raises(anthropic.RateLimitError) as caught:
                    await client.messages.create(model="m", max_tokens=50, messages=ASK)
                waited = time.monotonic() - started
    finally:
        upstream.stop()
    assert answer.content[-1].type == "text" and answer.content[-1].text == "Found it."
    assert caught.value.response.headers["retry-after"] == "30"
    assert caught.value.body["error"]["type"] == "rate_limit_error"
    assert waited < 5, "the gateway did not wait for the 30 s retry-after"
    assert len(upstream.requests) == 5, "the long retry-after was never retried"
