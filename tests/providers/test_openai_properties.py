"""Properties of the Chat Completions conversion, hammered with hypothesis.

Any valid block history converts to Chat Completions messages that pass the format's
checks (the test server's) and read back to an equivalent history; a streamed response
assembles to the same calls however the server cuts it into chunks.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from agentloop.lint import lint_history
from agentloop.messages import parse_history
from agentloop.providers.base import BlockStart, BlockStop
from agentloop.providers.openai import (
    ERROR_PREFIX,
    PRESETS,
    ChatCompat,
    ChatStreamAssembler,
    to_chat_messages,
    wire_id,
)
from agentloop.testing.chat_request import template_problem
from agentloop.testing.chat_server import check_chat_request, read_chat_request

TEXT = st.text(min_size=1, max_size=20).filter(lambda t: t.strip() != "")
# A successful result that begins with the error prefix reads back as an error: the
# format has no flag, and the model cannot tell them apart either (see the docs).
RESULT_TEXT = st.text(max_size=20).filter(lambda t: not t.startswith(ERROR_PREFIX))
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
INPUT = st.dictionaries(st.text(min_size=1, max_size=6), JSON_VALUE, max_size=3)
COMPATS = st.sampled_from([ChatCompat(), *PRESETS.values(), ChatCompat(tool_call_id_length=9)])


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid block history: user first, calls answered in the next user turn, user last."""
    counter = iter(range(10**6))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": draw(TEXT)}
        if draw(st.booleans())
        else {
            "role": "user",
            "content": [
                {"type": "text", "text": t} for t in draw(st.lists(TEXT, min_size=1, max_size=2))
            ],
        }
    ]
    for _ in range(draw(st.integers(0, 4))):
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(TEXT)})  # unsigned: not sent
        texts = draw(st.lists(TEXT, max_size=2))
        blocks += [{"type": "text", "text": t} for t in texts]
        calls = [
            {
                "type": "tool_use",
                "id": f"toolu_{next(counter)}_{draw(st.sampled_from('abc'))}",
                "name": draw(st.sampled_from(["echo", "add", "look_up"])),
                "input": draw(INPUT),
            }
            for _ in range(draw(st.integers(0 if texts else 1, 3)))
        ]
        blocks += calls
        messages.append({"role": "assistant", "content": blocks})
        user: list[dict[str, Any]] = []
        for use in draw(st.permutations(calls)):
            is_error = draw(st.booleans())
            content = draw(TEXT if is_error else RESULT_TEXT)
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use["id"]}
            if content:
                block["content"] = content
            if is_error:
                block["is_error"] = True
            user.append(block)
        user += [
            {"type": "text", "text": t}
            for t in draw(st.lists(TEXT, min_size=0 if calls else 1, max_size=2))
        ]
        messages.append({"role": "user", "content": user})
    return messages


def turns(messages: list[dict[str, Any]], compat: ChatCompat) -> list[Any]:
    """What both formats carry: per turn, the text, the calls, the results with error flags.

    A user turn's texts are compared joined: the format sends them as one string.
    """
    out: list[Any] = []
    for message in messages:
        blocks = message["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if message["role"] == "assistant":
            text = "".join(b["text"] for b in blocks if b["type"] == "text")
            calls = [
                (wire_id(b["id"], compat), b["name"], b["input"])
                for b in blocks
                if b["type"] == "tool_use"
            ]
            if not text and not calls:
                continue
            if out and out[-1][0] == "assistant":
                out[-1] = ("assistant", out[-1][1] + text, out[-1][2] + calls)
            else:
                out.append(("assistant", text, calls))
        else:
            results = {
                wire_id(b["tool_use_id"], compat): (b.get("content", ""), b.get("is_error", False))
                for b in blocks
                if b["type"] == "tool_result"
            }
            texts = [b["text"] for b in blocks if b["type"] == "text"]
            if out and out[-1][0] == "user":
                out[-1][1].update(results)
                out[-1][2].extend(texts)
            else:
                out.append(("user", results, texts))
    return [(t[0], t[1], "\n\n".join(t[2])) if t[0] == "user" else t for t in out]


@settings(max_examples=150, deadline=None)
@given(history=histories(), compat=COMPATS, system=st.none() | TEXT)
def test_any_valid_history_round_trips_through_chat_completions(
    history: list[dict[str, Any]], compat: ChatCompat, system: str | None
) -> None:
    messages = parse_history(history)
    lint_history(messages)  # the strategy makes valid histories
    chat = to_chat_messages(messages, system=system, compat=compat)
    body = {"model": "m", "messages": chat}
    assert (
        check_chat_request(body, id_length=compat.tool_call_id_length, single_system=True) is None
    )
    assert template_problem(body) is None  # every content is a string
    read = read_chat_request(body)
    assert read.get("system") == system
    lint_history(parse_history(read["messages"]))
    assert turns(read["messages"], ChatCompat()) == turns(history, compat)
    # Call order is kept, and every result is answered in it.
    for one in read["messages"]:
        if one["role"] == "user" and isinstance(one["content"], list):
            results = [b for b in one["content"] if b["type"] == "tool_result"]
            assert results == one["content"][: len(results)]


# --------------------------------------------------------------------------- streaming


@st.composite
def streamed(
    draw: st.DrawFn,
) -> tuple[str, list[tuple[str, str, dict[str, Any]]], list[tuple[int, dict[str, Any]]]]:
    """A response (text, calls) and chunks carrying it, cut anywhere, with each chunk's call."""
    text = draw(st.text(max_size=30))
    calls = [
        (
            f"call_{i}_{draw(st.integers(0, 99))}",
            draw(st.sampled_from(["echo", "add"])),
            draw(INPUT),
        )
        for i in range(draw(st.integers(0, 4)))
    ]
    chunks: list[tuple[int, dict[str, Any]]] = []  # (call number or -1, delta)
    if text:
        cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=4)))
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            if a < b:
                chunks.append((-1, {"content": text[a:b]}))
    for n, (call_id, name, value) in enumerate(calls):
        arguments = json.dumps(value)
        if draw(st.booleans()):  # the whole call in one chunk
            part = {
                "index": n,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            chunks.append((n, {"tool_calls": [part]}))
            continue
        cuts = sorted(set(draw(st.lists(st.integers(1, max(len(arguments) - 1, 1)), max_size=5))))
        pieces = [arguments[a:b] for a, b in zip([0, *cuts], [*cuts, len(arguments)], strict=True)]
        pieces = [p for p in pieces if p] or [arguments]
        with_id = draw(st.integers(0, len(pieces) - 1))
        with_name = draw(st.integers(0, len(pieces) - 1))
        id_everywhere = draw(st.booleans())
        for k, piece in enumerate(pieces):
            part: dict[str, Any] = {"index": n, "function": {"arguments": piece}}
            if k == with_id or id_everywhere:
                part["id"] = call_id
                part["type"] = "function"
            if k == with_name:
                part["function"]["name"] = name
            chunks.append((n, {"tool_calls": [part]}))
    return text, calls, chunks


@settings(max_examples=200, deadline=None)
@given(case=streamed(), finish=st.sampled_from(["tool_calls", "stop"]))
def test_the_accumulator_assembles_any_chunking(case: Any, finish: str) -> None:
    text, calls, chunks = case
    events: list[tuple[int, Any]] = []  # (chunks fed so far, event)
    fed = 0

    async def record(event: Any) -> None:
        events.append((fed, event))

    async def main() -> Any:
        nonlocal fed
        assembler = ChatStreamAssembler(record)
        for _, delta in chunks:
            fed += 1
            await assembler.feed({"choices": [{"index": 0, "delta": delta}]})
        fed += 1
        await assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        return await assembler.finish()

    response = anyio.run(main)
    assert response.text == (text if text.strip() else "")  # whitespace alone: no text block
    assert [(u.id, u.name, u.input) for u in response.tool_uses] == calls
    assert response.stop_reason == ("tool_use" if calls else "end_turn")
    assert response.call_errors == {}
    stops = [(at, e) for at, e in events if isinstance(e, BlockStop) and e.block.type == "tool_use"]
    assert [e.block.id for _, e in stops] == [c[0] for c in calls]
    assert all(e.complete for _, e in stops)
    for n, (at, _) in enumerate(stops):
        last_piece = max(k + 1 for k, (owner, _) in enumerate(chunks) if owner == n)
        following = [k + 1 for k, (owner, _) in enumerate(chunks) if owner > n]
        # Closed only once its arguments are complete, and as soon as the next call (or
        # the finish chunk) shows they are.
        assert at >= last_piece
        assert at == (min(following) if following else len(chunks) + 1)
    starts = [e for _, e in events if isinstance(e, BlockStart) and e.block.type == "tool_use"]
    assert [e.block.id for e in starts] == [c[0] for c in calls]
