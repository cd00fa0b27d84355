"""A durable gateway (`--durable dbos`) streams a streaming client's answer as it comes.

The gateway is served here (uvicorn on a real socket) in front of a scripted upstream
the gateway's SDK client talks to; the client is the real `anthropic` SDK or raw HTTP.
The request that starts the durable run gets its SSE live, event for event what a
gateway without `--durable` sends for the same conversation; a client that goes away
leaves the run going. And the gateway's SSE of a durable run's events never shows the
client two versions of one model request: when one it already got part of is sent again
(`StepRestarted`), the answer ends with an `error` event.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import pytest
from _gateway import CLIENT_TOOL, gateway_on
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support import serving

from agentloop import Agent, tool
from agentloop.durable.streams import DurableStream, event_to_json, read_events
from agentloop.errors import APIConnectionError
from agentloop.events import (
    ModelResponded,
    ModelStreamEvent,
    RequestStarted,
    RunStarted,
    ToolProgress,
    ToolResultEvent,
)
from agentloop.gateway.app import RUN_HEADER, GatewayConfig
from agentloop.gateway.calls import Call
from agentloop.gateway.errors import HIDDEN_ERROR
from agentloop.gateway.streaming import StreamResponse
from agentloop.messages import TextBlock, ToolUseBlock
from agentloop.providers.base import BlockDelta, BlockStart, BlockStop, MessageStart, ModelResponse
from agentloop.result import RunResult
from agentloop.testing import Fault, MessagesServer, ScriptedProvider, reply, tool_call

pytestmark = [pytest.mark.timeout(120), pytest.mark.durable]

QUESTION = [{"role": "user", "content": "What is a?"}]
HEADERS = {"x-api-key": "sk-a"}
WAIT = 60.0
"""Seconds the upstream holds an answer for the test at most (a failing test's bound)."""


def answered_tools(body: Mapping[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


@asynccontextmanager
async def served(
    tmp: Path, answer: Callable[[dict[str, Any]], Any], *, durable: bool = True, **tools: Any
) -> AsyncIterator[tuple[str, MessagesServer, list[str]]]:
    """A gateway (durable or not) with a `lookup` tool; its URL, upstream, and lookups."""
    looked_up: list[str] = []

    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        if "before_lookup" in tools:
            await tools["before_lookup"]()
        looked_up.append(key)
        return f"value-of-{key}"

    upstream = MessagesServer(answer).start()
    config = GatewayConfig(
        upstream=upstream.base_url,
        store=f"sqlite:///{tmp / 'sessions.db'}",
        tools=[lookup],
        durable=f"dbos:sqlite:///{tmp / 'dbos.sqlite'}" if durable else None,
        ping_interval=0.05,
    )
    try:
        async with gateway_on(config) as url:
            yield url, upstream, looked_up
    finally:
        upstream.stop()


async def test_deltas_reach_the_client_before_the_upstream_has_finished(tmp_path: Path) -> None:
    let_go = threading.Event()  # set once the client has read round one's first delta

    def answer(body: dict[str, Any]) -> Any:
        if not answered_tools(body):
            return reply("Looking it up.", tool_call("lookup", {"key": "a"}))
        let_go.wait(WAIT)  # the hidden round's answer waits for the client
        return reply("It is value-of-a.")

    async with served(tmp_path, answer) as (url, upstream, looked_up):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-a", max_retries=0)
        async with (
            client,
            client.messages.stream(model="m", max_tokens=50, messages=QUESTION) as stream,
        ):
            seen_early: list[str] = []
            with anyio.fail_after(WAIT / 2):
                async for event in stream:
                    if event.type == "text":
                        seen_early.append(event.text)
                        break
            # The upstream has not answered the hidden round: the run is not over.
            assert not let_go.is_set() and len(upstream.recorded) <= 2
            let_go.set()
            message = await stream.get_final_message()
            run_id = stream.response.headers.get("agentloop-run-id")
    assert seen_early and "Looking it up.".startswith(seen_early[0])
    assert [b.text for b in message.content if b.type == "text"] == [
        "Looking it up.",
        "It is value-of-a.",
    ]
    assert message.stop_reason == "end_turn"
    assert run_id is not None and run_id.startswith("gw-")
    assert looked_up == ["a"]
    assert [r.body.get("stream") for r in upstream.recorded] == [True, True]


THINKING = {"type": "thinking", "thinking": "The table first.", "signature": "sig-1"}


def conversation(body: dict[str, Any]) -> Any:
    """A hidden round (the gateway's lookup), then the client's own tool, then the end."""
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and any(b.get("tool_use_id") == "toolu_client" for b in last):
        return reply("Thanks, that is all.")
    if answered_tools(body):
        return reply(THINKING, "Now yours.", tool_call("client_tool", {"x": 1}, id="toolu_client"))
    return reply(THINKING, "Looking.", tool_call("lookup", {"key": "a"}, id="toolu_hidden"))


def sse_events(raw: str) -> list[tuple[str, Any]]:
    """The SSE events of a body, pings left out and message ids made equal."""
    events = []
    for frame in raw.split("\n\n"):
        if not frame.strip():
            continue
        fields = dict(line.split(": ", 1) for line in frame.splitlines())
        name, data = fields["event"], json.loads(fields["data"])
        if name == "ping":
            continue
        if name == "message_start":
            data["message"]["id"] = "msg"
        events.append((name, data))
    return events


async def streamed(url: str, body: dict[str, Any]) -> tuple[httpx2.Response, str]:
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        http.stream("POST", url + "/v1/messages", json=body, headers=HEADERS) as response,
    ):
        text = "".join([chunk async for chunk in response.aiter_text()])
    return response, text


FIRST: dict[str, Any] = {
    "model": "m",
    "max_tokens": 2048,
    "stream": True,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "tools": [CLIENT_TOOL],
    "messages": QUESTION,
}


async def outcome(folder: Path, *, durable: bool) -> dict[str, Any]:
    """What a gateway sends a streaming client and stores, for `conversation`.

    The client streams the first request, runs its tool and streams the follow-up.
    """
    await anyio.Path(folder).mkdir()
    async with served(folder, conversation, durable=durable) as (url, upstream, looked_up):
        response, text = await streamed(url, FIRST)
        events = sse_events(text)
        message = assembled(events)
        result = {"type": "tool_result", "tool_use_id": "toolu_client", "content": "one"}
        follow_up = {
            **FIRST,
            "messages": [
                *QUESTION,
                {"role": "assistant", "content": message["content"]},
                {"role": "user", "content": [result]},
            ],
        }
        _, follow_up_text = await streamed(url, follow_up)
        continued = upstream.recorded[-1].body["messages"]
    return {
        "status": response.status_code,
        "type": response.headers["content-type"],
        "run_id": response.headers.get("agentloop-run-id"),
        "looked_up": looked_up,
        "raw": text,
        "events": events,
        "message": message,
        "follow_up": sse_events(follow_up_text),
        "continued": continued,
    }


async def test_the_durable_stream_is_the_plain_gateways_stream(tmp_path: Path) -> None:
    # The plain one first: stopping DBOS shuts down the event loop's default executor.
    plain = await outcome(tmp_path / "plain", durable=False)
    durable = await outcome(tmp_path / "durable", durable=True)
    assert durable["status"] == 200 and durable["type"].startswith("text/event-stream")
    assert durable["run_id"] is not None and plain["run_id"] is None
    assert durable["looked_up"] == ["a"]
    # The client's tool is handed back; the gateway's call and its result are not shown.
    assert [b["type"] for b in durable["message"]["content"]] == [
        "thinking",
        "text",
        "thinking",
        "text",
        "tool_use",
    ]
    assert durable["message"]["content"][-1]["id"] == "toolu_client"
    assert "toolu_hidden" not in durable["raw"]
    # The session was stored: the follow-up went upstream with the hidden round.
    continued = durable["continued"]
    assert [m["role"] for m in continued] == ["user", "assistant", "user", "assistant", "user"]
    assert continued[2]["content"][0]["tool_use_id"] == "toolu_hidden"
    # Event for event, and session for session, what the gateway without --durable does.
    same = ("events", "follow_up", "continued", "looked_up")
    assert {k: durable[k] for k in same} == {k: plain[k] for k in same}


def assembled(events: list[tuple[str, Any]]) -> dict[str, Any]:
    """The message a client builds from SSE events (content blocks whole)."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            index, delta = data["index"], data["delta"]
            block = blocks[index]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[index] = partial.get(index, "") + delta["partial_json"]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return {"content": [blocks[i] for i in sorted(blocks)]}


async def test_a_client_that_goes_away_leaves_the_durable_run_going(tmp_path: Path) -> None:
    client_gone = anyio.Event()
    second_round = threading.Event()

    def answer(body: dict[str, Any]) -> Any:
        if not answered_tools(body):
            return reply("Looking.", tool_call("lookup", {"key": "a"}))
        second_round.set()
        return reply("It is value-of-a.")

    async def before_lookup() -> None:  # the call waits until the client has gone
        with anyio.fail_after(WAIT):
            await client_gone.wait()

    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": QUESTION}
    async with served(tmp_path, answer, before_lookup=before_lookup) as (url, upstream, looked):
        async with (
            httpx2.AsyncClient(timeout=60) as http,
            http.stream("POST", url + "/v1/messages", json=body, headers=HEADERS) as response,
        ):
            run_id = response.headers["agentloop-run-id"]
            async for line in response.aiter_lines():
                if line.startswith("event: content_block_delta"):
                    break  # and the connection closes
        client_gone.set()
        # Nobody asks again: the run goes on by itself to its hidden round.
        assert await anyio.to_thread.run_sync(second_round.wait, WAIT)
        async with httpx2.AsyncClient(timeout=60) as http:
            retry = await http.post(
                url + "/v1/messages", json={**body, "stream": False}, headers=HEADERS
            )
        assert len(upstream.recorded) == 2  # the retry got the run's answer
    assert retry.status_code == 200, retry.text
    assert retry.headers["agentloop-run-id"] == run_id
    assert [b["text"] for b in retry.json()["content"]] == ["Looking.", "It is value-of-a."]
    assert looked == ["a"]


async def test_upstream_errors_reach_a_streaming_client_and_its_retry_goes_on(
    tmp_path: Path,
) -> None:
    failed = False

    def answer(body: dict[str, Any]) -> Any:
        nonlocal failed
        if body["messages"][-1]["content"] == "Fail at once.":
            return Fault.http_error(400, "invalid_request_error", "not this")
        if not answered_tools(body):
            return reply("Looking.", tool_call("lookup", {"key": "a"}))
        if not failed:
            failed = True
            return Fault.http_error(400, "invalid_request_error", "not today")
        return reply("It is value-of-a.")

    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": QUESTION}
    at_once = {**body, "messages": [{"role": "user", "content": "Fail at once."}]}
    async with served(tmp_path, answer) as (url, upstream, looked_up):
        refused, refused_text = await streamed(url, at_once)
        first, first_text = await streamed(url, body)
        retry, retry_text = await streamed(url, body)
        assert len(upstream.recorded) == 4  # the refusal, two rounds, the new attempt's round
    # Before the stream starts, the upstream's status; after, the API's error event.
    assert refused.status_code == 400
    assert json.loads(refused_text)["error"]["message"] == "not this"
    assert first.status_code == 200
    events = sse_events(first_text)
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "invalid_request_error", "message": HIDDEN_ERROR}},
    )
    assert [d["delta"]["text"] for n, d in events if n == "content_block_delta"] == ["Looking."]
    # The retry is a new attempt, streamed, going on from the partial run kept for it.
    run_id = first.headers["agentloop-run-id"]
    assert retry.headers["agentloop-run-id"] == run_id + "-2"
    deltas = [d["delta"]["text"] for n, d in sse_events(retry_text) if n == "content_block_delta"]
    assert "".join(deltas) == "It is value-of-a."
    assert looked_up == ["a"]


# --------------------------------------------------------------------------- a step sent again


def item(round_: int, step: str, attempt: int, *events: Any) -> dict[str, Any]:
    """One item of a durable run's stream, as its publishers write it."""
    return {
        "round": round_,
        "step": step,
        "attempt": attempt,
        "events": [event_to_json(e) for e in events],
    }


def streamed_text(round_: int, text: str, *more: Any) -> list[ModelStreamEvent]:
    """A response's stream events: its start, a text block, then `more` events."""
    head = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "usage": {}}
    block = TextBlock(text="")
    return [
        ModelStreamEvent(round_, event)
        for event in (
            MessageStart(head),
            BlockStart(0, block),
            BlockDelta(0, "text", text),
            BlockStop(0, TextBlock(text=text)),
            *more,
        )
    ]


LOOKUP_CALL = tool_call("lookup", {"key": "a"}, id="toolu_g")
LOOKUP = ToolUseBlock(**LOOKUP_CALL)


def responded(round_: int, *blocks: Any) -> ModelResponded:
    """The event of a whole response of `blocks` (text or tool_use wire blocks)."""
    return ModelResponded(round_, ModelResponse.from_wire(reply(*blocks)))


RESTARTS = {
    # Round 1's model request sent again after the client got its first delta: the client
    # cannot take that delta back.
    "shown": [
        item(1, "run", 0, RunStarted("run-1"), RequestStarted(1)),
        item(1, "model", 1, *streamed_text(1, "Hel")),
        item(1, "model", 2, *streamed_text(1, "Hello.")),
        item(1, "run", 0, responded(1, "Hello.")),
    ],
    # The gateway's call run again, and round 2's request sent again before any of it was
    # shown (its first attempt had only begun): the client sees one version of each.
    "unseen": [
        item(1, "run", 0, RunStarted("run-1"), RequestStarted(1)),
        item(
            1,
            "model",
            1,
            *streamed_text(1, "Looking."),
            ModelStreamEvent(1, BlockStart(1, LOOKUP)),
            ModelStreamEvent(1, BlockStop(1, LOOKUP)),
        ),
        item(1, "run", 0, responded(1, "Looking.", LOOKUP_CALL)),
        item(1, "tool:toolu_g", 1, ToolProgress(1, "toolu_g", "lookup", 0.5)),
        item(1, "tool:toolu_g", 2, ToolResultEvent(1, "toolu_g", "lookup", False, "v", 0.0)),
        item(2, "run", 0, RequestStarted(2)),
        item(2, "model", 1, streamed_text(2, "ignored")[0]),
        item(2, "model", 2, *streamed_text(2, "Found.")),
        item(2, "run", 0, responded(2, "Found.")),
    ],
}


@asynccontextmanager
async def answering(response: Callable[[], Response]) -> AsyncIterator[str]:
    """`response()` answers `POST /v1/messages`, served by uvicorn here; yields the URL."""

    async def messages(request: Request) -> Response:
        return response()

    async def healthz(request: Request) -> Response:
        return Response("ok")

    app = Starlette(
        routes=[
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    async with serving(app) as url:
        yield url


@pytest.mark.parametrize("case", list(RESTARTS))
async def test_a_step_sent_again_after_the_client_saw_it_ends_the_answer(case: str) -> None:
    """A durable run's events with `StepRestarted` in them, through the gateway's SSE."""
    finished: list[RunResult] = []
    kept: list[Exception] = []
    result = RunResult(text="Found.", stop_reason="end_turn", messages=[])

    async def finish(call: Call, result: RunResult, responses: list[ModelResponse]) -> None:
        finished.append(result)

    async def keep_partial(call: Call, error: Exception) -> None:
        kept.append(error)

    async def items() -> AsyncIterator[dict[str, Any]]:
        for each in RESTARTS[case]:
            yield each

    async def run_result() -> RunResult:
        return result

    @asynccontextmanager
    async def events() -> AsyncIterator[DurableStream[Any]]:
        yield DurableStream("run-1", read_events(items()), run_result)

    def response() -> Response:
        call = Call(
            scope="sk-a",
            agent=Agent(provider=ScriptedProvider([])),
            history=[],
            visible=[],
            session=None,
            notes={},
            client_tools=[],
            client_names=frozenset(),
            stream=True,
            request_id="req_1",
            model="m",
        )
        return StreamResponse(
            call,
            finish=finish,
            keep_partial=keep_partial,
            deps=None,
            ping_interval=0.05,
            durable=events,
            headers={RUN_HEADER: "run-1"},
        )

    async with answering(response) as url:
        answer, text = await streamed(url, {"stream": True})
    assert answer.status_code == 200 and answer.headers[RUN_HEADER] == "run-1"
    events_sent = sse_events(text)
    names = [name for name, _ in events_sent]
    deltas = [d["delta"]["text"] for name, d in events_sent if name == "content_block_delta"]
    if case == "shown":
        assert deltas == ["Hel"]
        assert names[-1] == "error" and names.count("message_start") == 1
        error = events_sent[-1][1]["error"]
        assert error["type"] == "api_error" and "round 1 was sent again" in error["message"]
        assert finished == [] and isinstance(kept[0], APIConnectionError)
    else:
        assert deltas == ["Looking.", "Found."]
        assert "ignored" not in text and "toolu_g" not in text
        assert names[-2:] == ["message_delta", "message_stop"]
        assert [d["index"] for name, d in events_sent if name == "content_block_start"] == [0, 1]
        assert finished == [result] and kept == []
