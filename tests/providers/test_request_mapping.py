"""What reaches the wire for each request parameter is what the SDK itself would send.

For every parameter an `Agent` accepts, a run's request (JSON and streamed, on the SDK's
httpx and aiohttp clients) is compared with the request `client.messages.create` (or
`client.beta.messages.create`, when `betas` are given) sends for the same arguments,
written here independently of the provider: path, query, headers (the SDK's timeout
headers included) and body.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from agentloop import Agent, AnthropicProvider, tool
from agentloop.testing import MessagesServer, RecordedRequest, reply

CREATE = set(inspect.signature(anthropic.resources.messages.AsyncMessages.create).parameters)
BETA_CREATE = set(
    inspect.signature(anthropic.resources.beta.messages.AsyncMessages.create).parameters
)


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


# (id, Agent keyword arguments) — `params` entries go through as request parameters.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("defaults", {}),
    ("max_tokens", {"max_tokens": 123}),
    ("system-text", {"system": "Be brief."}),
    (
        "system-blocks",
        {"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]},
    ),
    ("tools", {"tools": [lookup]}),
    ("tool_choice", {"tools": [lookup], "tool_choice": {"type": "any"}}),
    ("thinking", {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}),
    ("metadata", {"metadata": {"user_id": "u-1"}}),
    ("stop_sequences", {"stop_sequences": ["END"]}),
    ("temperature", {"params": {"temperature": 0.2}}),
    ("top_p-top_k", {"params": {"top_p": 0.9, "top_k": 5}}),
    ("service_tier", {"params": {"service_tier": "standard_only"}}),
    ("inference_geo", {"params": {"inference_geo": "us"}}),
    ("cache_control", {"params": {"cache_control": {"type": "ephemeral"}}}),
    ("output_config", {"params": {"output_config": {"effort": "low"}}}),
    ("extra_headers", {"params": {"extra_headers": {"x-trace": "t-1"}}}),
    ("beta-header", {"params": {"extra_headers": {"anthropic-beta": "files-api-2025-04-14"}}}),
    ("extra_query", {"params": {"extra_query": {"region": "eu"}}}),
    ("extra_body", {"params": {"extra_body": {"custom": {"a": 1}}}}),
    ("timeout", {"params": {"timeout": 30.0}}),
    ("betas", {"params": {"betas": ["files-api-2025-04-14", "context-1m-2025-08-07"]}}),
    ("betas-and-headers", {"params": {"betas": ["b-1"], "extra_headers": {"x-trace": "t"}}}),
    ("workspace_id", {"params": {"workspace_id": "ws-1"}}),
    ("cache-auto", {"cache": "auto", "system": "Be brief.", "tools": [lookup]}),
    ("cache-1h", {"cache": "1h", "params": {"top_k": 5}}),
]
"""Every case but the `cache-*` ones runs with `cache="off"`: prompt caching adds markers,
which `sdk_call` writes out for those cases only."""


def sdk_call(agent_options: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """The `messages.create` arguments equivalent to an Agent's options (and if beta)."""
    options = dict(agent_options)
    params = dict(options.pop("params", {}))
    cache = options.pop("cache", "off")
    beta = "betas" in params
    accepted = BETA_CREATE if beta else CREATE
    args: dict[str, Any] = {
        "model": "claude-sonnet-5-5",
        "max_tokens": options.pop("max_tokens", 4096),
        "messages": [{"role": "user", "content": "hi"}],
    }
    tools = options.pop("tools", [])
    if tools:
        args["tools"] = [t.definition.to_wire() for t in tools]
    args.update(options)
    if cache != "off":
        mark = {"type": "ephemeral", **({"ttl": "1h"} if cache == "1h" else {})}
        args["messages"] = [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": mark}]}
        ]
        if "system" in args:
            args["system"] = [{"type": "text", "text": args["system"], "cache_control": mark}]
    extra_body = dict(params.pop("extra_body", {}))
    for name, value in params.items():
        if name in accepted:
            args[name] = value
        else:  # the SDK has no parameter for it (e.g. temperature in 2.x)
            extra_body[name] = value
    if extra_body:
        args["extra_body"] = extra_body
    return beta, args


IGNORED_HEADERS = {"host", "content-length", "user-agent", "accept", "accept-encoding"}


TIMEOUT_HEADERS = {"x-stainless-timeout", "x-stainless-read-timeout"}


def comparable(seen: RecordedRequest) -> dict[str, Any]:
    headers = {
        k: v
        for k, v in seen.headers.items()
        if k not in IGNORED_HEADERS and (k in TIMEOUT_HEADERS or not k.startswith("x-stainless"))
    }
    return {"path": seen.path, "query": seen.query, "headers": headers, "body": seen.body}


@pytest.mark.parametrize("mode", ["json", "sse", "json-aiohttp", "sse-aiohttp"])
@pytest.mark.parametrize(("case", "options"), CASES, ids=[c for c, _ in CASES])
async def test_the_wire_request_is_what_the_sdk_sends(
    case: str, options: dict[str, Any], mode: str, serve: Callable[..., MessagesServer]
) -> None:
    stream = mode.startswith("sse")
    ours = serve([reply("ok")])
    pool = anthropic.DefaultAioHttpClient() if mode.endswith("aiohttp") else None
    provider = AnthropicProvider(ours.client(http_client=pool), stream=stream)
    agent = Agent(provider=provider, **{"cache": "off", **options})
    result = await agent.run("hi")
    assert result.text == "ok"

    theirs = serve([reply("ok")])
    beta, args = sdk_call(options)
    client = theirs.client()
    create = client.beta.messages.create if beta else client.messages.create
    response = await create(**args, stream=True) if stream else await create(**args)
    if stream:
        async for _ in response:
            pass

    (sent,) = ours.recorded
    (expected,) = theirs.recorded
    assert comparable(sent) == comparable(expected)
    if "betas" in options.get("params", {}):
        assert "betas" not in sent.body
        assert sent.headers["anthropic-beta"] == ",".join(options["params"]["betas"])
