"""The run id of a durable gateway request: the same request maps to the same id, any
other request to another one."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.gateway import MemoryStore, Sessions
from agentloop.gateway.runs import RUN_ID_PREFIX, canonical_request, request_run_id

TOOL = {
    "name": "lookup",
    "description": "Look a key up.",
    "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}},
}


def request(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": "look up a"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"n": 1}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    }
    body.update(changes)
    return body


def run_id(
    body: dict[str, Any],
    *,
    credential: str = "sk-a",
    secret: bytes = b"s" * 32,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
) -> str:
    sessions = Sessions(MemoryStore(ttl=60), secret)
    return request_run_id(sessions, credential, canonical_request(body, headers, query))


def shuffled(value: Any, rng: random.Random) -> Any:
    """`value` with the keys of every object in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def test_a_retried_request_gets_the_same_run_id() -> None:
    first = run_id(request())
    assert first.startswith(RUN_ID_PREFIX)
    assert run_id(json.loads(json.dumps(request()))) == first
    assert run_id(shuffled(request(), random.Random(7))) == first


@pytest.mark.parametrize(
    "written",
    [
        pytest.param(request(stream=True), id="streamed"),
        pytest.param(request(stream=False), id="not-streamed"),
        pytest.param(request(max_tokens=1024.0), id="whole-float"),
        pytest.param(request(metadata=None), id="null-field"),
        pytest.param(
            request(system=[{"type": "text", "text": "Be brief.", "cache_control": None}]),
            id="null-in-system-block",
        ),
        pytest.param(
            request(
                system=[
                    {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
                ]
            ),
            id="cache-marker-in-system",
        ),
        pytest.param(
            request(tools=[{**TOOL, "cache_control": {"type": "ephemeral"}}]),
            id="cache-marker-on-tool",
        ),
        pytest.param(request(cache_control={"type": "ephemeral"}), id="automatic-caching"),
        pytest.param(
            request(
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "look up a"}]},
                    *request()["messages"][1:],
                ]
            ),
            id="text-as-block",
        ),
    ],
)
def test_how_a_request_is_written_does_not_change_its_run_id(written: dict[str, Any]) -> None:
    assert run_id(written) == run_id(request())


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(request(model="claude-opus-4-5"), id="model"),
        pytest.param(request(max_tokens=1025), id="max-tokens"),
        pytest.param(request(system="Be long."), id="system"),
        pytest.param(request(tools=[]), id="tools"),
        pytest.param(request(temperature=0.5), id="an-upstream-field"),
        pytest.param(request(metadata={"user_id": "u1"}), id="metadata"),
        pytest.param(
            request(messages=[*request()["messages"][:2], {"role": "user", "content": "x"}]),
            id="messages",
        ),
        pytest.param(
            request(
                messages=[
                    *request()["messages"][:1],
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"n": 1.5}}
                        ],
                    },
                    *request()["messages"][2:],
                ]
            ),
            id="tool-input",
        ),
        pytest.param(request(tools=[{**TOOL, "input_schema": {"type": "object"}}]), id="schema"),
    ],
)
def test_any_other_request_gets_another_run_id(other: dict[str, Any]) -> None:
    assert run_id(other) != run_id(request())


def test_headers_query_credential_and_secret_are_part_of_the_id() -> None:
    base = run_id(request(), headers={"anthropic-version": "2023-06-01"})
    assert run_id(request(), headers={"Anthropic-Version": "2023-06-01"}) == base
    beta = {"anthropic-version": "2023-06-01", "anthropic-beta": "some-beta-2025-01-01"}
    assert run_id(request(), headers=beta) != base
    assert run_id(request(), headers={"anthropic-version": "2023-06-01"}, query={"a": "1"}) != base
    assert run_id(request(), headers={"anthropic-version": "2023-06-01"}, credential="sk-b") != base
    assert run_id(request(), headers={"anthropic-version": "2023-06-01"}, secret=b"t" * 32) != base


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(["model", "messages", "x", "tools", "y"]), JSON),
    seed=st.integers(0, 1000),
)
def test_key_order_never_matters_and_a_changed_field_always_does(
    body: dict[str, Any], seed: int
) -> None:
    body = {**body, "model": "m"}
    assert canonical_request(shuffled(body, random.Random(seed))) == canonical_request(body)
    changed = {**body, "model": "m!"}
    assert canonical_request(changed) != canonical_request(body)
