"""Hidden turns never reach a conversation they do not belong to.

The gateway served in this process; the upstream is the scripted Messages server.
"""

from __future__ import annotations

import itertools
from typing import Any

import anthropic
import pytest
from _gateway import dump, gateway_on

from agentloop import tool
from agentloop.gateway.app import SESSION_HEADER, GatewayConfig
from agentloop.testing import MessagesServer, reply, tool_call

pytestmark = pytest.mark.timeout(60)


async def test_two_conversations_showing_the_same_text_never_share_hidden_turns() -> None:
    secrets = itertools.count(1)

    @tool
    def secret_lookup() -> str:
        """Look the secret up."""
        return f"secret-{next(secrets)}"

    shown = "Here is what I found."
    upstream = MessagesServer(
        [
            reply(tool_call("secret_lookup")),
            reply(shown),
            reply(tool_call("secret_lookup")),
            reply(shown),
            reply("Continued."),
            reply("Continued too."),
        ]
    ).start()
    config = GatewayConfig(upstream=upstream.base_url, store="memory://", tools=[secret_lookup])
    start: list[Any] = [{"role": "user", "content": "Find the secret."}]
    try:
        async with gateway_on(config) as url:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-shared", max_retries=0)
            async with client:
                one = await client.messages.create(model="m", max_tokens=50, messages=start)
                two = await client.messages.create(model="m", max_tokens=50, messages=start)
                assert dump(one.content) == dump(two.content) == [{"type": "text", "text": shown}]
                follow = [
                    *start,
                    {"role": "assistant", "content": dump(two.content)},
                    {"role": "user", "content": "And?"},
                ]
                raw = await client.messages.with_raw_response.create(
                    model="m", max_tokens=50, messages=follow
                )
                again = await client.messages.with_raw_response.create(
                    model="m", max_tokens=50, messages=follow
                )
    finally:
        upstream.stop()
    for continued in upstream.recorded[4:]:
        sent = str(continued.body["messages"])
        assert "secret-1" not in sent and "secret-2" not in sent
        assert continued.body["messages"] == follow, "forwarded as the client sent it"
    for answer in (raw, again):
        assert answer.headers[SESSION_HEADER] == "ambiguous"
