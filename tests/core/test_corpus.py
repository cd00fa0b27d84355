"""Replay of the recorded Anthropic API corpus (`tests/core/corpus/anthropic`, see its README).

Every recorded response (JSON or SSE) is served byte for byte by the local `MessagesServer`
to the real `AsyncAnthropic` behind `AnthropicProvider`; the parsed blocks must match the
recording, the request must go out exactly as recorded, the history rebuilt from each
response must match the next recorded request, and the two recorded 400s must be refused by
`lint_history` before anything is sent.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from agentloop import Agent
from agentloop.errors import HistoryError, ProviderError
from agentloop.files import FILES_BETA
from agentloop.lint import lint_history
from agentloop.messages import dump_history, parse_history
from agentloop.providers.anthropic import AnthropicProvider
from agentloop.providers.base import ModelRequest, ModelResponse
from agentloop.testing import RawResponse, ScriptedModel
from agentloop.testing.server import MessagesServer
from agentloop.tools import ToolDefinition

# Part of the repository: a missing file fails `test_corpus_is_complete`, a missing folder
# fails collection.
CORPUS = Path(__file__).resolve().parent / "corpus" / "anthropic"
FILES = sorted(CORPUS.glob("*.json"))
if not FILES:  # an error at collection, never a silent skip
    raise FileNotFoundError(f"the recorded corpus is missing: no *.json in {CORPUS}")
ERROR_FILES = [p for p in FILES if p.stem.startswith("error_400_")]

# The fields of a block that must survive parsing and history rebuilding byte for byte.
COMPARED = ("type", "id", "name", "input", "text", "thinking", "signature", "data", "tool_use_id")


@dataclass(frozen=True)
class Difference:
    """How one framework's rebuilt assistant turn differs from the response it got."""

    kind: str
    """`inserted`: `block` added at `at`; `dropped_turn`: no assistant turn at all;
    `cache_control_moved`: `cache_control` of earlier messages changed."""
    reason: str  # quoted from the corpus README
    at: int = 0
    block: dict[str, Any] | None = None


# Known framework differences in the recorded next requests (beyond field-level ones that
# COMPARED ignores: stripped `caller`, added `citations: null` / `cache_control: null`).
FRAMEWORK_DIFFERENCES = {
    "streaming_parallel_tool_use_no_args_sse": Difference(
        "inserted",
        'The rebuilt history starts the assistant turn with a `{"type":"text","text":" "}` block.',
        at=0,
        block={"type": "text", "text": " "},
    ),
    "error_400_tool_result_without_preceding_tool_use": Difference(
        "dropped_turn",
        "The client sent a `tool_result` without the assistant `tool_use` turn",
    ),
    "tool_error_as_plain_result_retry_multi_turn": Difference(
        "cache_control_moved",
        'History carries `"citations": null` and `"cache_control": null/ephemeral` fields',
    ),
}
# Files whose next request is rejected for a reason other than the rebuilt assistant turn.
REBUILT_STILL_REJECTED = {
    "error_400_tool_result_document_file_source": "A `tool_result` holds a `document` with "
    '`source.type: "file"` without the Files beta',
}
# Files whose 400 is for a missing Files beta: an agent adds the beta itself and sends.
SENT_UNDER_THE_FILES_BETA = {"error_400_tool_result_document_file_source"}


# --------------------------------------------------------------------------- helpers


def params(paths: list[Path]) -> list[Any]:
    return [pytest.param(p, id=p.stem) for p in paths]


@cache
def exchanges(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["exchanges"]  # type: ignore[no-any-return]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def thinking_on(request: dict[str, Any]) -> bool:
    thinking = request.get("thinking") or {}
    return bool(thinking) and thinking.get("type") != "disabled"


def lint_request(request: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> None:
    lint_history(
        parse_history(request["messages"] if messages is None else messages),
        thinking=thinking_on(request),
        tool_choice=request.get("tool_choice"),
    )


def without_stream(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "stream"}


def without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_control(v) for v in value]
    return value


def project(block: dict[str, Any]) -> dict[str, Any]:
    return {k: block[k] for k in COMPARED if k in block}


def sse_message(text: str) -> dict[str, Any]:
    """The message a raw SSE stream describes, accumulated independently of the SDK."""
    message: dict[str, Any] = {}
    partial: dict[int, str | None] = {}
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line[len("data:") :])
        kind = event["type"]
        if kind == "message_start":
            message = json.loads(json.dumps(event["message"]))
        elif kind == "content_block_start":
            assert event["index"] == len(message["content"])
            message["content"].append(json.loads(json.dumps(event["content_block"])))
            partial[event["index"]] = None
        elif kind == "content_block_delta":
            index, delta = event["index"], event["delta"]
            block = message["content"][index]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[index] = (partial[index] or "") + delta["partial_json"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = block.get("signature", "") + delta["signature"]
            else:
                raise AssertionError(f"unexpected delta {delta['type']}")
        elif kind == "content_block_stop":
            raw = partial.pop(event["index"])
            if raw is not None:
                message["content"][event["index"]]["input"] = json.loads(raw) if raw else {}
        elif kind == "message_delta":
            message.update(event["delta"])
            usage = {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            message["usage"].update(usage)
        else:
            assert kind in ("ping", "message_stop"), kind
    assert not partial, "a content block was never stopped"
    return message


def recorded_message(exchange: dict[str, Any]) -> dict[str, Any]:
    if exchange["response_sse"] is not None:
        return sse_message(exchange["response_sse"])
    return exchange["response"]  # type: ignore[no-any-return]


_REQUEST_FIELDS = ("system", "tool_choice", "thinking", "metadata", "stop_sequences", "container")


def model_request(body: dict[str, Any]) -> ModelRequest:
    """A `ModelRequest` that puts `body` on the wire again (minus `stream`)."""
    rest = {
        k: v
        for k, v in body.items()
        if k not in ("model", "messages", "max_tokens", "stream", *_REQUEST_FIELDS)
    }
    tools: list[ToolDefinition] = []
    if all({"name", "description", "input_schema"} <= set(t) for t in rest.get("tools", [])):
        # Client tools only: announce them as ToolDefinitions; server tools go in params.
        core = ("name", "description", "input_schema")
        tools = [
            ToolDefinition(
                *(t[k] for k in core), extra={k: v for k, v in t.items() if k not in core}
            )
            for t in rest.pop("tools", [])
        ]
    return ModelRequest(
        model=body["model"],
        messages=parse_history(body["messages"]),
        max_tokens=body["max_tokens"],
        tools=tools,
        params=rest,
        **{k: body[k] for k in _REQUEST_FIELDS if k in body},
    )


async def replay(path: Path) -> list[tuple[dict[str, Any], ModelResponse, dict[str, Any]]]:
    """Send every 200 request of `path` through the provider; serve the recorded answers.

    Returns (exchange, parsed response, request body the server received) per exchange.
    """
    ok = [ex for ex in exchanges(path) if ex["status"] == 200]
    script = [
        RawResponse(json=ex["response"])
        if ex["response_sse"] is None
        else RawResponse(sse=ex["response_sse"])
        for ex in ok
    ]
    out = []
    with MessagesServer(ScriptedModel(script, lint=False)) as server:
        async with server.client() as client:
            for ex in ok:
                provider = AnthropicProvider(client, stream=ex["response_sse"] is not None)
                out.append((ex, await provider.complete(model_request(ex["request"]))))
        received = list(server.requests)
    assert len(received) == len(ok)
    return [(ex, response, body) for (ex, response), body in zip(out, received, strict=True)]


MULTI = [p for p in FILES if len(exchanges(p)) > 1]


# --------------------------------------------------------------------------- the corpus


def test_corpus_is_complete() -> None:
    assert len(FILES) == 21, [p.name for p in FILES]
    assert sum(len(exchanges(p)) for p in FILES) == 39
    statuses = [ex["status"] for p in FILES for ex in exchanges(p)]
    assert statuses.count(400) == 2 and statuses.count(200) == 37
    assert [p.stem for p in ERROR_FILES] == [
        "error_400_tool_result_document_file_source",
        "error_400_tool_result_without_preceding_tool_use",
    ]
    assert set(FRAMEWORK_DIFFERENCES) | set(REBUILT_STILL_REJECTED) <= {p.stem for p in MULTI}
    for path in FILES:
        for ex in exchanges(path):
            assert (ex["response"] is None) != (ex["response_sse"] is None), path.stem


@pytest.mark.parametrize("path", params(FILES))
def test_recorded_requests_pass_the_linter(path: Path) -> None:
    """Every request the API accepted passes `lint_history` (no false positives)."""
    for ex in exchanges(path):
        if ex["status"] == 200:
            lint_request(ex["request"])


@pytest.mark.parametrize("path", params(FILES))
async def test_replay_parses_each_response(path: Path) -> None:
    for ex, response, received in await replay(path):
        request = ex["request"]
        # The request went out exactly as recorded: messages byte-exact, the rest equal.
        assert canonical(received["messages"]) == canonical(request["messages"])
        assert canonical(without_stream(received)) == canonical(without_stream(request))
        assert received.get("stream", False) == (ex["response_sse"] is not None)

        expected = recorded_message(ex)
        got = [block.to_wire() for block in response.content]
        assert [b["type"] for b in got] == [b["type"] for b in expected["content"]]
        assert [project(b) for b in got] == [project(b) for b in expected["content"]]
        # Wire-exact, JSON and SSE alike: every field, explicit nulls, unknown fields.
        assert canonical(got) == canonical(expected["content"])
        assert response.stop_reason == expected["stop_reason"]
        assert response.stop_sequence == expected["stop_sequence"]
        assert (response.id, response.model) == (expected["id"], expected["model"])
        assert response.container == expected.get("container")

        usage = expected["usage"]
        assert response.usage.input_tokens == usage["input_tokens"]
        assert response.usage.output_tokens == usage["output_tokens"]
        assert response.usage.cache_creation_input_tokens == (
            usage.get("cache_creation_input_tokens") or 0
        )
        assert response.usage.cache_read_input_tokens == (usage.get("cache_read_input_tokens") or 0)
        assert response.usage.requests == 1

        # Recorded as JSON (a durable run's step, a paused run) and read back: equal.
        recorded = json.loads(json.dumps(response.to_json()))
        assert ModelResponse.from_json(recorded) == response


@pytest.mark.parametrize("path", params(MULTI))
async def test_history_rebuilt_from_each_response_matches_next_request(path: Path) -> None:
    """Request n + our assistant turn + what the framework added = request n+1."""
    responses = {id(ex): response for ex, response, _ in await replay(path)}
    difference = FRAMEWORK_DIFFERENCES.get(path.stem)
    for ex, nxt in itertools.pairwise(exchanges(path)):
        response = responses[id(ex)]
        history, next_history = ex["request"]["messages"], nxt["request"]["messages"]
        k = len(history)
        # The framework kept the earlier history as it was.
        if difference is not None and difference.kind == "cache_control_moved":
            history = without_cache_control(history)
            next_history = without_cache_control(next_history)
        assert canonical(next_history[:k]) == canonical(history)
        if response.container is not None:
            assert nxt["request"]["container"] == response.container["id"]

        ours = dump_history([response.message])[0]
        if difference is not None and difference.kind == "dropped_turn":
            assert next_history[k]["role"] == "user", difference.reason
            rebuilt = [*history, ours, *next_history[k:]]
        else:
            recorded = next_history[k]
            assert (ours["role"], recorded["role"]) == ("assistant", "assistant")
            theirs = [project(b) for b in recorded["content"]]
            if difference is not None and difference.kind == "inserted":
                assert theirs.pop(difference.at) == difference.block, difference.reason
            # Block types, order, ids, inputs, text, thinking, signatures, data: byte-exact.
            assert canonical([project(b) for b in ours["content"]]) == canonical(theirs)
            rebuilt = [*history, ours, *next_history[k + 1 :]]
            if response.stop_reason == "pause_turn":
                assert rebuilt[-1] is ours, "a paused turn is continued as it is"

        if path.stem in REBUILT_STILL_REJECTED and nxt["status"] != 200:
            with pytest.raises(HistoryError) as info:
                lint_request(nxt["request"], rebuilt)
            assert str(info.value) == nxt["response"]["error"]["message"]
        else:
            lint_request(nxt["request"], rebuilt)


@pytest.mark.parametrize("path", params(ERROR_FILES))
async def test_recorded_400_is_caught_before_sending(path: Path) -> None:
    (failing,) = [ex for ex in exchanges(path) if ex["status"] == 400]
    request, api = failing["request"], failing["response"]["error"]
    assert api["type"] == "invalid_request_error"
    api_path, _, api_text = api["message"].partition(": ")

    messages = parse_history(request["messages"])
    with pytest.raises(HistoryError) as info:
        lint_history(
            messages, thinking=thinking_on(request), tool_choice=request.get("tool_choice")
        )
    error = info.value
    assert error.path == api_path
    assert str(error) == api["message"]
    assert error.index is not None and request["messages"][error.index]["role"] == "user"

    if path.stem in SENT_UNDER_THE_FILES_BETA:
        await _sent_under_the_files_beta(request)
        return
    # An agent continuing this history refuses it without sending a single request.
    with MessagesServer(ScriptedModel([], lint=False)) as server:
        async with server.client() as client:
            agent = Agent(
                request["model"],
                client=client,
                max_tokens=request["max_tokens"],
                tool_choice=request.get("tool_choice"),
            )
            with pytest.raises(HistoryError) as info:
                await agent.run(history=request["messages"])
        assert server.requests == []
    assert str(info.value) == api["message"]
    assert api_text in str(info.value)


async def _sent_under_the_files_beta(request: dict[str, Any]) -> None:
    """An agent sends the history with the Files beta; the server holds no such file."""
    with MessagesServer(ScriptedModel([], lint=False)) as server:
        async with server.client() as client:
            agent = Agent(request["model"], client=client, max_tokens=request["max_tokens"])
            with pytest.raises(ProviderError, match="File not found"):
                await agent.run(history=request["messages"])
        assert server.recorded[-1].headers["anthropic-beta"] == FILES_BETA
