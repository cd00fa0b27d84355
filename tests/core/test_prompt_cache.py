"""The test server's prompt cache: requests billed under the API's caching rules, on the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from agentloop.testing import MessagesServer, reply
from agentloop.testing.caching import PromptCache, breakpoints, min_cacheable_tokens

MARK = {"type": "ephemeral"}
LONG = "All the rules of the house, written out at length. " * 100  # ~1300 tokens


class Clock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def server(clock: Clock) -> AsyncIterator[MessagesServer]:
    cache = PromptCache(clock=clock)
    async with MessagesServer(lambda body: reply("ok"), prompt_cache=cache) as server:
        yield server


def user(text: str, marker: dict[str, Any] | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if marker is not None:
        block["cache_control"] = marker
    return {"role": "user", "content": [block]}


def conversation(turns: int, marker: dict[str, Any] | None = MARK) -> list[dict[str, Any]]:
    """`turns` user/assistant exchanges and a last user message carrying `marker`."""
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages += [user(f"question {i}"), {"role": "assistant", "content": f"answer {i}"}]
    return [*messages, user(f"question {turns}", marker)]


async def usage(server: MessagesServer, **body: Any) -> dict[str, Any]:
    client = server.client()
    body.setdefault("model", "claude-sonnet-4-5")
    body.setdefault("max_tokens", 100)
    response = await client.messages.create(**body)
    return response.usage.to_dict(mode="json")


def split(found: dict[str, Any]) -> tuple[int, int, int]:
    """(written, read, uncached) input tokens."""
    return (
        found["cache_creation_input_tokens"],
        found["cache_read_input_tokens"],
        found["input_tokens"],
    )


async def test_a_growing_conversation_reads_what_it_wrote_and_writes_only_the_new_part(
    server: MessagesServer,
) -> None:
    system = [{"type": "text", "text": LONG}]
    first = await usage(server, system=system, messages=conversation(1))
    written, read, uncached = split(first)
    assert read == 0 and written > 1024 and uncached == 0
    second = await usage(server, system=system, messages=conversation(2))
    assert second["cache_read_input_tokens"] == written
    assert 0 < second["cache_creation_input_tokens"] < 50
    assert second["cache_creation"] == {
        "ephemeral_5m_input_tokens": second["cache_creation_input_tokens"],
        "ephemeral_1h_input_tokens": 0,
    }
    assert second["output_tokens"] == 5  # the script's own count is kept


async def test_tokens_after_the_last_breakpoint_are_plain_input(server: MessagesServer) -> None:
    system = [{"type": "text", "text": LONG, "cache_control": MARK}]
    first = await usage(server, system=system, messages=conversation(1, marker=None))
    written, read, uncached = split(first)
    assert read == 0 and written > 1024 and 0 < uncached < 50
    other = await usage(server, system=system, messages=[user("something else entirely")])
    assert split(other)[:2] == (0, written)


async def test_a_prefix_below_the_model_minimum_is_not_cached(server: MessagesServer) -> None:
    short = conversation(1)
    for _ in range(2):
        found = await usage(server, messages=short)
        assert found["cache_creation_input_tokens"] == found["cache_read_input_tokens"] == 0
        assert found["input_tokens"] > 0
    # Haiku 4.5 caches from 4096 tokens: the ~1300-token prompt is not enough there.
    system = [{"type": "text", "text": LONG}]
    found = await usage(server, model="claude-haiku-4-5", system=system, messages=short)
    assert split(found)[:2] == (0, 0)
    assert min_cacheable_tokens("claude-haiku-4-5-20251001") == 4096
    assert min_cacheable_tokens("claude-sonnet-4-5") == 1024


async def test_entries_expire_after_their_ttl_and_reads_refresh_them(
    server: MessagesServer, clock: Clock
) -> None:
    system = [{"type": "text", "text": LONG, "cache_control": MARK}]
    ask = [user("hi")]
    written = (await usage(server, system=system, messages=ask))["cache_creation_input_tokens"]
    clock.now += 299
    assert split(await usage(server, system=system, messages=ask))[:2] == (0, written)
    clock.now += 299  # 598 s after the write, 299 s after the read that refreshed it
    assert split(await usage(server, system=system, messages=ask))[:2] == (0, written)
    clock.now += 301
    assert split(await usage(server, system=system, messages=ask))[:2] == (written, 0)


async def test_a_one_hour_entry_outlives_five_minutes_and_is_reported_as_such(
    server: MessagesServer, clock: Clock
) -> None:
    system = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    first = await usage(server, system=system, messages=[user("hi")])
    assert (
        first["cache_creation"]["ephemeral_1h_input_tokens"]
        == (first["cache_creation_input_tokens"])
    )
    clock.now += 3000
    later = await usage(server, system=system, messages=[user("hi")])
    assert later["cache_read_input_tokens"] == first["cache_creation_input_tokens"]


async def test_the_lookback_reaches_twenty_blocks_back_and_no_further(
    server: MessagesServer,
) -> None:
    system = [{"type": "text", "text": LONG}]
    start = conversation(1)
    written = (await usage(server, system=system, messages=start))["cache_creation_input_tokens"]
    # Ten more exchanges add 20 blocks: the old entry is exactly 20 blocks back.
    within = await usage(server, system=system, messages=conversation(11))
    assert within["cache_read_input_tokens"] == written
    # Eleven more (22 blocks) from a prompt only this one has seen: nothing to read.
    fresh = [user("another start", MARK)]
    await usage(server, system=[{"type": "text", "text": LONG + "!"}], messages=fresh)
    far = [user("another start"), *conversation(11)[1:]]
    found = await usage(server, system=[{"type": "text", "text": LONG + "!"}], messages=far)
    assert found["cache_read_input_tokens"] == 0


async def test_automatic_caching_marks_the_last_cacheable_block(server: MessagesServer) -> None:
    system = [{"type": "text", "text": LONG}]
    first = await usage(server, system=system, messages=conversation(1, None), cache_control=MARK)
    assert split(first)[1:] == (0, 0) and first["cache_creation_input_tokens"] > 1024
    second = await usage(server, system=system, messages=conversation(2, None), cache_control=MARK)
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]


async def test_a_changed_tool_definition_invalidates_everything_after_it(
    server: MessagesServer,
) -> None:
    tool = {"name": "look", "description": LONG, "input_schema": {"type": "object"}}
    system = [{"type": "text", "text": "Be brief.", "cache_control": MARK}]
    first = await usage(server, tools=[tool], system=system, messages=[user("hi")])
    again = await usage(server, tools=[tool], system=system, messages=[user("hi")])
    assert again["cache_read_input_tokens"] == first["cache_creation_input_tokens"] > 0
    changed = {**tool, "description": LONG + " And one more rule."}
    other = await usage(server, tools=[changed], system=system, messages=[user("hi")])
    assert other["cache_read_input_tokens"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": str(i), "cache_control": MARK}
                            for i in range(5)
                        ],
                    }
                ]
            },
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
            id="five-markers",
        ),
        pytest.param(
            {
                "cache_control": MARK,
                "system": [{"type": "text", "text": "s", "cache_control": MARK}],
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": str(i), "cache_control": MARK}
                            for i in range(3)
                        ]
                        + [{"type": "text", "text": "last"}],
                    }
                ],
            },
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
            id="automatic-takes-a-slot",
        ),
        pytest.param(
            {
                "system": [{"type": "text", "text": "s", "cache_control": MARK}],
                "messages": [user("hi", {"type": "ephemeral", "ttl": "1h"})],
            },
            "ttl='1h' must not come after one with ttl='5m'",
            id="ttl-order",
        ),
    ],
)
async def test_breakpoints_the_api_refuses_get_its_400(
    server: MessagesServer, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await usage(server, **body)
    assert caught.value.status_code == 400
    assert message in str(caught.value)


def test_an_automatic_marker_on_an_explicitly_marked_block_takes_no_second_slot() -> None:
    messages = [user(str(i), MARK) for i in range(1)]
    body = {
        "cache_control": MARK,
        "system": [{"type": "text", "text": s, "cache_control": MARK} for s in "abc"],
        "messages": messages,
    }
    assert [b.index for b in breakpoints(body)] == [0, 1, 2, 3]
