"""The run's contract, checked on generated inputs over HTTP (hypothesis).

Every run here is the real SDK talking to `MessagesServer` on 127.0.0.1, JSON and streamed:

- whatever a tool returns or raises, the run ends normally (a `BaseException` that is not
  an `Exception` propagates as itself), every call is answered, and the history lints
  clean and is sent back byte for byte by `run(history=result.messages)`;
- any history a caller passes is either sent byte for byte or refused with `HistoryError`
  before anything is sent;
- a run cancelled at any point (a cancel scope, `task.cancel()`, `stream.cancel()`, leaving
  the stream, a tool cancelling its caller; asyncio and trio) leaves a valid history, the
  usage of the responses that came in whole, and no call run twice.

One server per test: each example sets the answers it serves (`Switchboard`). Example
counts come from the hypothesis profile (tests/conftest.py):
`AGENTLOOP_HYPOTHESIS_PROFILE=long` runs many more (see docs/testing.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import datetime
import decimal
import itertools
import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from agentloop import (
    Agent,
    AnthropicProvider,
    HistoryError,
    RunContext,
    ToolError,
    lint_history,
    tool,
)
from agentloop.events import RoundFinished, RunFinished
from agentloop.messages import DocumentBlock, ImageBlock, TextBlock, parse_history
from agentloop.testing import MessagesServer, ScriptExhausted, reply, tool_call

# A function-scoped server is the point: one per test, its answers swapped per example.
FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


class Switchboard:
    """One `MessagesServer` for a whole test; each example says what it answers."""

    def __init__(self) -> None:
        self._answer: Callable[[dict[str, Any]], Any] = self._exhausted
        self.server = MessagesServer(lambda body: self._answer(body)).start()

    @staticmethod
    def _exhausted(body: dict[str, Any]) -> Any:
        raise ScriptExhausted("no answer left for this example")

    def serve(self, answers: Iterable[Any] | Callable[[dict[str, Any]], Any]) -> int:
        """Answer the next requests with `answers` (a list, or a function of the body).

        Returns how many requests came before, for `since`.
        """
        if callable(answers):
            self._answer = answers
        else:
            left = iter(list(answers))
            self._answer = lambda body: next(left, None) or self._exhausted(body)
        return len(self.server.requests)

    def since(self, start: int) -> list[dict[str, Any]]:
        """The request bodies received since `start`."""
        return self.server.requests[start:]

    def agent(self, client: Any, streamed: bool, **options: Any) -> Agent:
        """An agent over `client`, with nothing added to the messages it sends."""
        return Agent(provider=AnthropicProvider(client, stream=streamed), cache="off", **options)


@pytest.fixture
def switchboard() -> Iterator[Switchboard]:
    board = Switchboard()
    yield board
    board.server.stop()  # each example closes the client it made, in its own event loop


def wire(value: Any) -> str:
    """`value` as JSON text, key order kept: equal text means equal bytes on the wire."""
    return json.dumps(value, ensure_ascii=False)


def tool_use_ids(messages: list[dict[str, Any]]) -> list[str]:
    return [
        b["id"]
        for m in messages
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]


def check_history(messages: list[dict[str, Any]], calls: Iterable[Any]) -> None:
    """Valid to send; every tool_use answered, in the order of the tool-call log."""
    lint_history(parse_history(messages))
    json.dumps(messages, ensure_ascii=False).encode()  # JSON, and no lone surrogate in it
    assert [c.tool_use_id for c in calls] == tool_use_ids(messages)


async def sent_again(board: Switchboard, client: Any, messages: list[dict[str, Any]]) -> None:
    """`run(history=messages)` goes out as `messages`, byte for byte, and is answered."""
    start = board.serve([reply("again")])
    again = await board.agent(client, streamed=False).run(history=messages)
    assert again.text.endswith("again")  # joined to the last assistant message, if any
    (body,) = board.since(start)
    assert wire(body["messages"]) == wire(messages)


# --------------------------------------------------------------------------- tool values

SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc80", "\udce9", "\udfff"])
TEXT = st.lists(st.text(max_size=12) | SURROGATES, max_size=4).map("".join)
# What `os.fsdecode` makes of bytes that are not UTF-8: JSON carries each as an escape.
# (A high surrogate next to a low one would be read back as the pair's one character.)
LOW_SURROGATES = st.sampled_from(["\udc80", "\udce9", "\udcff"])
HUGE = st.sampled_from([300_000, 1_000_000]).map(lambda n: "é" * n)


class Unprintable:
    """Its `__str__` and `__repr__` fail."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Custom(BaseException):
    """A BaseException of the application's own."""


class Loose(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    value: Any


@dataclasses.dataclass
class Record:
    name: str
    data: Any


def cyclic_list() -> list[Any]:
    items: list[Any] = [1]
    items.append(items)
    return items


def cyclic_dict() -> dict[str, Any]:
    items: dict[str, Any] = {"a": 1}
    items["self"] = items
    return items


def broken_generator() -> Iterator[int]:
    yield 1
    raise ValueError("the generator broke")


SPECIAL: list[Callable[[], Any]] = [
    object,
    cyclic_list,
    cyclic_dict,
    Unprintable,
    lambda: [Unprintable()],
    lambda: (i for i in range(3)),
    broken_generator,
    lambda: Loose(value=object()),
    lambda: Loose(value=b"\xff\xfe"),
    lambda: Record("r", b"\x00\xff"),
    lambda: {"when": datetime.datetime(2026, 1, 1), "amount": decimal.Decimal("1.5")},
    lambda: {(1, 2): "tuple key"},
    lambda: len,
    lambda: int,
    lambda: TextBlock(text=""),
    lambda: [TextBlock(text=""), TextBlock(text="kept")],
    lambda: [TextBlock(text=""), TextBlock(text="")],
    lambda: ImageBlock(source={"type": "bogus"}),
    lambda: ImageBlock(source={"type": "base64", "media_type": "image/png"}),
    lambda: ImageBlock(source={"type": "base64", "media_type": "image/png", "data": b"\x89"}),
    lambda: ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBORw=="}),
    lambda: DocumentBlock(source={"type": "text", "media_type": "text/plain", "data": "doc"}),
    lambda: [TextBlock(text="see"), ImageBlock(source={"type": "url", "url": "https://x/y.png"})],
    lambda: [TextBlock(text="a\udce9")],
    lambda: [],
    lambda: (),
]

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**64)
    | st.floats()
    | TEXT
    | st.binary(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3)
        | st.frozensets(st.integers(), max_size=3)
        | st.builds(Record, st.text(max_size=4), inner)
    ),
    max_leaves=6,
)
RETURNED = VALUES | HUGE | st.sampled_from(SPECIAL).map(lambda make: make())
ERRORS = st.sampled_from([ValueError, KeyError, RuntimeError, OSError, ToolError])
BASE_EXCEPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit, Custom]
RAISED = (
    st.builds(lambda kind, text: kind(text), ERRORS, TEXT | HUGE)
    | st.builds(ToolError, st.binary(max_size=8) | st.integers() | st.none())
    | st.builds(UnprintableError)
    | st.builds(lambda kind: kind("from a tool"), st.sampled_from(BASE_EXCEPTIONS))
)


def hostile_tool(outcome: tuple[str, Any], is_async: bool) -> Any:
    """A tool `give` that returns or raises what `outcome` says, sync or async."""
    how, value = outcome

    def give() -> Any:
        if how == "raise":
            raise value
        return value

    if is_async:

        async def give_async() -> Any:
            await anyio.lowlevel.checkpoint()
            return give()

        return tool(give_async, name="give", description="Give.")
    return tool(give, name="give", description="Give.")


OUTCOMES = st.tuples(st.just("return"), RETURNED) | st.tuples(st.just("raise"), RAISED)


# asyncio lets a KeyboardInterrupt or SystemExit straight out of its loop, and leaves the
# client it was using unclosed: asyncio's behaviour, not the run's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
@FIXTURE
@given(outcome=OUTCOMES, is_async=st.booleans())
def test_whatever_a_tool_returns_or_raises_the_run_goes_on(
    switchboard: Switchboard, streamed: bool, outcome: tuple[str, Any], is_async: bool
) -> None:
    how, value = outcome
    give = hostile_tool(outcome, is_async)
    fatal = how == "raise" and not isinstance(value, Exception)

    async def main() -> None:
        async with switchboard.server.client() as client:
            switchboard.serve([reply("Here.", tool_call("give")), reply("done")])
            result = await switchboard.agent(client, streamed, tools=[give]).run("go")
            assert (result.stop_reason, result.text) == ("end_turn", "done")
            check_history(result.messages, result.tool_calls)
            (record,) = result.tool_calls
            if how == "raise":
                assert record.is_error
            if record.is_error:
                assert record.output.strip(), "an error result says what was wrong"
            if how == "return" and isinstance(value, str) and value.isascii():
                assert (record.output, record.is_error) == (value, False)
            await sent_again(switchboard, client, result.messages)

    if fatal:
        # On trio: asyncio lets a KeyboardInterrupt or SystemExit straight out of its loop,
        # past every task, and leaves anyio's worker threads running, so the test
        # process could never exit.
        with pytest.raises(type(value)) as info:
            anyio.run(main, backend="trio")
        assert type(info.value) is type(value)
    else:
        anyio.run(main)


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(cyclic_list(), id="cycle"),
        pytest.param(object(), id="object"),
        pytest.param({"raw": b"\xff"}, id="nested-bytes"),
        pytest.param(Unprintable(), id="unprintable"),
    ],
)
async def test_a_tool_value_pydantic_cannot_serialise_is_an_error_result_not_a_crash(
    serve: Any, streamed: bool, value: Any
) -> None:
    @tool
    def give() -> Any:
        """Give."""
        return value

    server = serve([reply(tool_call("give")), reply("done")])
    agent = Agent(provider=AnthropicProvider(server.client(), stream=streamed), tools=[give])
    result = await agent.run("go")
    assert result.text == "done"
    (record,) = result.tool_calls
    assert record.is_error
    assert "Tool 'give' ran, but its return value cannot be sent to the model" in record.output
    check_history(result.messages, result.tool_calls)


async def test_bytes_a_tool_returns_are_sent_as_text_or_base64(serve: Any) -> None:
    @tool
    def read(name: str) -> bytes:
        """Read a file."""
        return {"text": b"caf\xc3\xa9", "binary": b"\x89PNG\xff"}[name]

    server = serve(
        [reply(tool_call("read", {"name": "text"}), tool_call("read", {"name": "binary"})), "ok"]
    )
    result = await Agent(client=server.client(), tools=[read]).run("go")
    text, binary = result.tool_calls
    assert (text.output, text.is_error) == ("café", False)
    assert not binary.is_error
    assert binary.output.endswith(base64.b64encode(b"\x89PNG\xff").decode())
    assert binary.output.startswith("[5 bytes that are not UTF-8 text, in base64:]")


# --------------------------------------------------------------------------- histories

NON_BLANK = st.text(min_size=1, max_size=12).filter(str.strip)
ANY_TEXT = st.lists(NON_BLANK | LOW_SURROGATES, min_size=1, max_size=3).map("".join)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
INPUTS = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


@st.composite
def text_block(draw: st.DrawFn) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": draw(ANY_TEXT)}
    if draw(st.integers(0, 4)) == 0:
        block["citations"] = None  # as the API sends it back
    return block


@st.composite
def user_extra(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Content a user turn may carry besides tool results: text, images, documents."""
    kinds = draw(
        st.lists(st.sampled_from(["text", "text", "image", "url", "document"]), max_size=2)
    )
    blocks = []
    for kind in kinds:
        if kind == "text":
            blocks.append(draw(text_block()))
        elif kind == "image":
            blocks.append({"type": "image", "source": dict(PNG)})
        elif kind == "url":
            blocks.append({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}})
        else:
            source = {"type": "text", "media_type": "text/plain", "data": draw(NON_BLANK)}
            blocks.append({"type": "document", "source": source})
    return blocks


@st.composite
def result_block(draw: st.DrawFn, use_id: str) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id}
    content = draw(st.sampled_from(["none", "text", "blocks"]))
    if content == "text":
        block["content"] = draw(ANY_TEXT)
    elif content == "blocks":
        images = st.lists(st.just({"type": "image", "source": dict(PNG)}), max_size=1)
        block["content"] = [draw(text_block()), *draw(images)]
    if draw(st.booleans()):
        block["is_error"] = draw(st.booleans())
    return block


def split(draw: st.DrawFn, role: str, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One turn as one message, or as two consecutive messages of its role."""
    if len(blocks) > 1 and draw(st.booleans()):
        at = draw(st.integers(1, len(blocks) - 1))
        return [{"role": role, "content": blocks[:at]}, {"role": role, "content": blocks[at:]}]
    return [{"role": role, "content": blocks}]


@st.composite
def valid_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A history the API accepts: turns alternate, every call answered in the next turn."""
    ids = itertools.count()
    if draw(st.booleans()):
        messages: list[dict[str, Any]] = [{"role": "user", "content": draw(ANY_TEXT)}]
    else:
        messages = [{"role": "user", "content": [draw(text_block()), *draw(user_extra())]}]
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 5)) == 0:  # a mid-conversation system message passes through
            messages.append({"role": "system", "content": draw(ANY_TEXT)})
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            n = next(ids)
            blocks.append({"type": "thinking", "thinking": draw(ANY_TEXT), "signature": f"sig{n}"})
        if draw(st.integers(0, 4)) == 0:
            blocks.append({"type": "redacted_thinking", "data": f"opaque{next(ids)}"})
        blocks += draw(st.lists(text_block(), max_size=2))
        if draw(st.integers(0, 4)) == 0:
            n = next(ids)
            blocks += [
                {
                    "type": "server_tool_use",
                    "id": f"srvtoolu_{n}",
                    "name": "web_search",
                    "input": {},
                },
                {"type": "web_search_tool_result", "tool_use_id": f"srvtoolu_{n}", "content": []},
            ]
        has_text = any(b["type"] == "text" for b in blocks)
        calls = [
            {
                "type": "tool_use",
                "id": f"toolu_{next(ids)}",
                "name": draw(st.sampled_from(["echo", "look_up"])),
                "input": draw(INPUTS),
            }
            for _ in range(draw(st.integers(0 if has_text else 1, 3)))
        ]
        messages += split(draw, "assistant", blocks + calls)
        results = [draw(result_block(c["id"])) for c in draw(st.permutations(calls))]
        extra = draw(user_extra())
        if not results and not any(b["type"] == "text" for b in extra):
            extra.append(draw(text_block()))
        turn = results + extra
        if results and extra and draw(st.booleans()):
            messages += [
                {"role": "user", "content": results},
                {"role": "user", "content": extra},
            ]
        else:
            messages.append({"role": "user", "content": turn})
    if draw(st.integers(0, 3)) == 0:  # a prefill: the model goes on from this text
        prefill = draw(NON_BLANK).rstrip()
        assume(prefill)
        messages.append({"role": "assistant", "content": prefill})
    return messages


def _blocks(history: list[dict[str, Any]], kind: str) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i, m in enumerate(history)
        if isinstance(m["content"], list)
        for j, b in enumerate(m["content"])
        if b["type"] == kind
    ]


class Nope:
    """Not a JSON value."""


NOT_JSON = [
    lambda: math.nan,
    lambda: math.inf,
    lambda: -math.inf,
    lambda: b"bytes",
    lambda: {"a", "b"},
    lambda: {1: "int key"},
    lambda: Nope(),
    cyclic_list,
]


@st.composite
def broken(draw: st.DrawFn, history: list[dict[str, Any]]) -> tuple[str, list[Any]]:
    """`history` with one thing the API refuses; returns (what, the broken history)."""
    h: list[Any] = copy.deepcopy(history)
    users = [i for i, m in enumerate(h) if m["role"] == "user"]
    texts = _blocks(h, "text")
    uses = _blocks(h, "tool_use")
    results = _blocks(h, "tool_result")
    images = _blocks(h, "image")
    kinds = ["role", "no role", "content type", "blank user", "block type", "text", "empty text"]
    kinds += ["not JSON", "not a message", "assistant first", "orphan result", "empty content"]
    kinds += ["dangling use"]
    if uses:
        kinds += ["input", "use id", "use name", "duplicate id", "use in user"]
    if results:
        kinds += ["is_error", "nested use", "nested empty text", "result in assistant"]
    if images:
        kinds += ["image source"]
    kind = draw(st.sampled_from(kinds))
    i = draw(st.sampled_from(range(len(h))))
    if kind == "role":
        h[i]["role"] = draw(
            st.text(max_size=8).filter(lambda r: r not in ("user", "assistant", "system"))
            | st.integers()
            | st.none()
        )
    elif kind == "no role":
        del h[i]["role"]
    elif kind == "content type":
        h[i]["content"] = draw(
            st.integers() | st.none() | st.booleans() | st.just({"type": "text", "text": "x"})
        )
    elif kind == "blank user":
        h[draw(st.sampled_from(users))]["content"] = draw(st.sampled_from(["", " ", "\n\t"]))
    elif kind == "block type":
        h[0]["content"] = [{"text": "x"}, {"type": ""}, {"type": 7, "text": "x"}][
            draw(st.integers(0, 2)) :
        ]
    elif kind == "text":
        h[0]["content"] = [draw(st.sampled_from([{"type": "text"}, {"type": "text", "text": 7}]))]
    elif kind == "empty text":
        if texts:
            m, j = draw(st.sampled_from(texts))
            h[m]["content"][j]["text"] = ""
        else:
            h[0]["content"] = [{"type": "text", "text": ""}]
    elif kind == "not JSON":
        bad = draw(st.sampled_from(NOT_JSON))()
        where = draw(st.sampled_from(["message", "block", "input"] if uses else ["message"]))
        if where == "message":
            h[i]["metadata"] = {"value": bad}
        elif where == "input":
            m, j = draw(st.sampled_from(uses))
            h[m]["content"][j]["input"]["bad"] = bad
        else:
            h[0] = {"role": "user", "content": [{"type": "text", "text": "x", "extra": bad}]}
    elif kind == "not a message":
        h.insert(i, draw(st.sampled_from(["hello", None, 3, ["user", "x"]])))
    elif kind == "assistant first":
        h.insert(0, {"role": "assistant", "content": "Hello."})
    elif kind == "orphan result":
        first = h[0]["content"]
        first = [{"type": "text", "text": first}] if isinstance(first, str) else first
        h[0]["content"] = [{"type": "tool_result", "tool_use_id": "toolu_nobody"}, *first]
    elif kind == "empty content":
        h[0]["content"] = []
    elif kind == "dangling use":
        h.append({"role": "assistant", "content": [tool_call("echo", id="toolu_dangling")]})
    elif kind == "input":
        m, j = draw(st.sampled_from(uses))
        h[m]["content"][j]["input"] = draw(st.sampled_from([[], "x", 1, None]))
    elif kind in ("use id", "use name"):
        m, j = draw(st.sampled_from(uses))
        h[m]["content"][j]["id" if kind == "use id" else "name"] = ""
    elif kind == "duplicate id":
        m, j = draw(st.sampled_from(uses))
        block = h[m]["content"][j]
        h[m]["content"].append({**block, "input": {}})
    elif kind == "use in user":
        h[0]["content"] = [{"type": "text", "text": "x"}, tool_call("echo", id="toolu_user")]
    elif kind == "is_error":
        m, j = draw(st.sampled_from(results))
        h[m]["content"][j]["is_error"] = draw(st.sampled_from(["yes", "true", 1, 0, None]))
    elif kind == "nested use":
        m, j = draw(st.sampled_from(results))
        h[m]["content"][j]["content"] = [tool_call("echo", id="toolu_nested")]
    elif kind == "nested empty text":
        m, j = draw(st.sampled_from(results))
        h[m]["content"][j]["content"] = [{"type": "text", "text": ""}]
    elif kind == "result in assistant":
        m, j = draw(st.sampled_from(results))
        h.insert(m, {"role": "assistant", "content": [h[m]["content"][j]]})
    elif kind == "image source":
        m, j = draw(st.sampled_from(images))
        h[m]["content"][j]["source"] = draw(
            st.sampled_from(
                [
                    {"type": "bogus"},
                    {"type": "base64", "media_type": "image/png"},
                    {"type": "base64", "data": "iVBORw0KGgo="},
                    {"type": "url"},
                    {"type": "url", "url": 5},
                ]
            )
        )
    return kind, h


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
@FIXTURE
@given(history=valid_histories())
def test_a_valid_history_is_sent_byte_for_byte(
    switchboard: Switchboard, streamed: bool, history: list[dict[str, Any]]
) -> None:
    given_json = wire(history)

    async def main() -> None:
        async with switchboard.server.client() as client:
            start = switchboard.serve([reply("ok")])
            result = await switchboard.agent(client, streamed).run(history=history)
            assert result.text.endswith("ok")  # after the prefill, if the history ends with one
            (body,) = switchboard.since(start)
            assert wire(body["messages"]) == given_json
            assert wire(history) == given_json  # the caller's list is not changed

    anyio.run(main)


@FIXTURE
@given(case=valid_histories().flatmap(broken))
def test_an_invalid_history_is_refused_before_anything_is_sent(
    switchboard: Switchboard, case: tuple[str, list[Any]]
) -> None:
    what, history = case

    async def main() -> None:
        async with switchboard.server.client() as client:
            start = switchboard.serve([reply("should not be asked")])
            with pytest.raises(HistoryError):
                await switchboard.agent(client, streamed=False).run(history=history)
            assert switchboard.since(start) == [], what

    anyio.run(main)


async def test_a_history_with_an_unknown_role_is_refused_before_sending(serve: Any) -> None:
    server = serve([reply("should not be asked")] * 2)
    agent = Agent(client=server.client())
    for history in (
        [{"role": "garbage", "content": "x"}],
        [{"role": "user", "content": "hi"}, {"role": "garbage", "content": "x"}],
    ):
        with pytest.raises(HistoryError, match=r"role 'garbage'"):
            await agent.run(history=history)
    with pytest.raises(HistoryError, match=r"role 'garbage'"):
        await agent.run("hi", history=[{"role": "garbage", "content": "x"}])
    assert server.requests == []


# --------------------------------------------------------------------------- empty answers

EMPTY_ANSWERS = [
    pytest.param([{"type": "text", "text": ""}], id="empty-text"),
    pytest.param([], id="no-content"),
    pytest.param([{"type": "text", "text": " \n"}], id="whitespace-text"),
    pytest.param([{"type": "text", "text": ""}, {"type": "text", "text": ""}], id="two-empty"),
]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("answer", EMPTY_ANSWERS)
async def test_an_empty_answer_leaves_a_history_that_can_be_sent_again(
    serve: Any, streamed: bool, answer: list[dict[str, Any]]
) -> None:
    @tool
    def look() -> str:
        """Look."""
        return "seen"

    server = serve(
        [reply("Looking.", tool_call("look")), reply(*answer), reply("again"), reply("more")]
    )
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=streamed), tools=[look], cache="off"
    )
    result = await agent.run("go")
    assert (result.stop_reason, result.text) == ("end_turn", "")
    check_history(result.messages, result.tool_calls)
    assert (await agent.run("and now?", history=result.messages)).text == "again"
    assert (await agent.run(history=result.messages)).text == "more"


async def test_an_empty_text_block_beside_a_call_does_not_break_the_next_request(
    serve: Any,
) -> None:
    @tool
    def look() -> str:
        """Look."""
        return "seen"

    server = serve([reply({"type": "text", "text": ""}, tool_call("look")), reply("done")])
    result = await Agent(client=server.client(), tools=[look]).run("go")
    assert result.text == "done" and [c.output for c in result.tool_calls] == ["seen"]
    check_history(result.messages, result.tool_calls)


# --------------------------------------------------------------------------- cancellation

MODES = ["scope", "task", "cancel", "after_turn", "leave", "from_tool"]


def usage(k: int) -> dict[str, int]:
    """The k-th response's usage: a sum over any set of responses says which they were."""
    return {"input_tokens": 1 << k, "output_tokens": 1 << (k + 16)}


@st.composite
def scripts(draw: st.DrawFn) -> list[list[str]]:
    """Turns of calls (`a`: async tool, `s`: sync tool), the last turn a plain answer."""
    turns = draw(st.lists(st.lists(st.sampled_from("as"), min_size=1, max_size=3), max_size=3))
    return [*turns, []]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
@FIXTURE
@given(
    turns=scripts(),
    backend=st.sampled_from(["asyncio", "trio"]),
    mode=st.sampled_from(MODES),
    at=st.integers(0, 40),
)
def test_a_run_cancelled_at_any_point_keeps_its_promises(
    switchboard: Switchboard,
    streamed: bool,
    turns: list[list[str]],
    backend: str,
    mode: str,
    at: int,
) -> None:
    assume(mode != "task" or backend == "asyncio")  # `task.cancel()` is asyncio's
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    started = 0
    scope: anyio.CancelScope | None = None

    def count(tool_use_id: str) -> None:
        with lock:
            ran[tool_use_id] += 1

    @tool
    async def work(ctx: RunContext) -> str:
        """Work with checkpoints."""
        nonlocal started
        count(ctx.tool_use_id)
        started += 1
        if mode == "from_tool" and started == at:
            assert scope is not None
            scope.cancel()
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        return "worked"

    @tool
    def block(ctx: RunContext) -> str:
        """Work in a thread."""
        count(ctx.tool_use_id)
        return "blocked"

    answers = [
        reply(
            f"Turn {k}.",
            *(tool_call("work" if c == "a" else "block") for c in calls),
            usage=usage(k),
        )
        for k, calls in enumerate(turns)
    ]

    async def main() -> None:
        nonlocal scope
        scope = anyio.CancelScope()
        script = iter(answers)

        def answer(body: dict[str, Any]) -> Any:
            # A request of the cancelled run may still reach the server after it ended.
            if "go on" in json.dumps(body["messages"][-1]):
                return reply("continued")
            return next(script, None) or reply("past the script")

        async with switchboard.server.client() as client:
            start = switchboard.serve(answer)
            agent = switchboard.agent(client, streamed, tools=[work, block])
            seen: list[Any] = []
            streams: list[Any] = []
            tasks: list[asyncio.Task[None]] = []

            async def drive() -> None:
                assert scope is not None
                with scope:
                    async with agent.run_stream("go") as stream:
                        streams.append(stream)
                        async for event in stream:
                            seen.append(event)
                            if len(seen) != at:
                                continue
                            if mode == "scope":
                                scope.cancel()
                            elif mode == "task":
                                tasks[0].cancel()  # as a web framework does when a client goes
                            elif mode == "cancel":
                                stream.cancel()
                            elif mode == "after_turn":
                                stream.cancel(after_turn=True)
                            elif mode == "leave":
                                break

            if mode == "task":
                tasks.append(asyncio.get_running_loop().create_task(drive()))
                with contextlib.suppress(asyncio.CancelledError):
                    await tasks[0]
            else:
                await drive()
            (stream,) = streams
            result = stream.result
            assert result is not None
            received = len(switchboard.since(start))
            check_history(result.messages, result.tool_calls)
            # No call ran twice; each call answered with a real result ran exactly once.
            assert all(n == 1 for n in ran.values()), ran
            for record in result.tool_calls:
                if record.output in ("worked", "blocked"):
                    assert ran[record.tool_use_id] == 1
            # The usage of exactly the responses that came in whole, each counted once.
            used = result.usage.requests
            finished = sum(isinstance(e, RoundFinished) for e in seen)
            assert finished <= used <= received
            assert result.usage.input_tokens == sum(usage(k)["input_tokens"] for k in range(used))
            assert result.usage.output_tokens == sum(usage(k)["output_tokens"] for k in range(used))
            if any(isinstance(e, RunFinished) for e in seen):
                assert isinstance(seen[-1], RunFinished) and seen[-1].result is result
            # What it left can be continued.
            again = await switchboard.agent(client, streamed).run("go on", history=result.messages)
            assert again.text == "continued"

    anyio.run(main, backend=backend)
