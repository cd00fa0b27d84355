"""Server tools as typed values in `tools=[...]`: their entries, their betas, their blocks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentloop import (
    Agent,
    AnthropicProvider,
    CodeExecution,
    ConfigurationError,
    ProviderError,
    Tool,
    ToolDefinition,
    ToolSearch,
    WebFetch,
    WebSearch,
    lint_history,
    tool,
)
from agentloop.messages import parse_history
from agentloop.providers.base import ModelRequest
from agentloop.testing import (
    ChatCompletionsServer,
    ScriptedProvider,
    code_execution_result,
    reply,
    server_tool_use,
    tool_call,
    tool_search_result,
    web_fetch_result,
    web_search_result,
)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(defer_loading=True)
def convert(amount: float, currency: str) -> str:
    """Convert an amount of euros into another currency."""
    return f"{amount * 2} {currency}"


def _betas(seen: Any) -> list[str]:
    return [b for b in seen.headers.get("anthropic-beta", "").split(",") if b]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_web_search_runs_beside_a_function_tool_and_keeps_its_blocks(
    serve: Any, streamed: bool
) -> None:
    search = server_tool_use("web_search", {"query": "python release"})
    found = web_search_result(search, [("https://python.org", "Python")])
    cited = {
        "type": "text",
        "text": "Python 3.14 is out.",
        "citations": [
            {
                "type": "web_search_result_location",
                "url": "https://python.org",
                "title": "Python",
                "encrypted_index": "Eo8BCioIAhgB",
                "cited_text": "Python 3.14 is out",
            }
        ],
    }
    server = serve([reply(search, found, tool_call("add", {"a": 1, "b": 2})), reply(cited)])
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=streamed),
        tools=[WebSearch(max_uses=3, allowed_domains=["python.org"]), add],
    )
    result = await agent.run("What is new in Python, and 1 + 2?")

    assert result.text == "Python 3.14 is out." and result.rounds == 2
    for body in server.requests:
        assert [t["name"] for t in body["tools"]] == ["add", "web_search"]
        assert body["tools"][1] == {
            "type": "web_search_20250305",
            "name": "web_search",
            "max_uses": 3,
            "allowed_domains": ["python.org"],
        }
    assert all(_betas(seen) == [] for seen in server.recorded)  # generally available
    # The server tool's blocks and the citations went back exactly as they came.
    assistant = server.requests[1]["messages"][1]
    assert assistant["content"][:2] == [search, found]
    assert result.messages[-1]["content"] == [cited]
    assert [c.name for c in result.tool_calls] == ["add"]
    lint_history(parse_history(result.messages))


async def test_each_server_tool_goes_out_under_the_beta_its_version_needs(serve: Any) -> None:
    run = server_tool_use("bash_code_execution", {"command": "python -c 'print(6 * 7)'"})
    fetch = server_tool_use("web_fetch", {"url": "https://example.com"})
    answer = reply(
        run,
        code_execution_result(run, "42\n"),
        fetch,
        web_fetch_result(fetch, "https://example.com", "Example Domain"),
        "It prints 42; the page says Example Domain.",
    )
    server = serve([answer])
    agent = Agent(
        client=server.client(),
        tools=[CodeExecution(), WebFetch(citations=True, max_content_tokens=5000)],
        params={"betas": ["files-api-2025-04-14"]},
    )
    result = await agent.run("Run it and fetch the page.")

    assert result.stop_reason == "end_turn"
    (seen,) = server.recorded
    assert _betas(seen) == [
        "files-api-2025-04-14",
        "code-execution-2025-08-25",
        "web-fetch-2025-09-10",
    ]
    assert seen.body["tools"] == [
        {"type": "code_execution_20250825", "name": "code_execution"},
        {
            "type": "web_fetch_20250910",
            "name": "web_fetch",
            "citations": {"enabled": True},
            "max_content_tokens": 5000,
        },
    ]
    assert result.messages[1]["content"] == answer["content"]


async def test_a_server_tool_without_its_beta_is_refused_by_the_server(serve: Any) -> None:
    server = serve([reply("never sent")])
    fetch = {"type": "web_fetch_20250910", "name": "web_fetch"}
    agent = Agent(client=server.client(), params={"tools": [fetch]})
    with pytest.raises(ProviderError, match="requires the beta header 'anthropic-beta: web-fetch"):
        await agent.run("fetch")
    assert server.model.requests == []  # the script never saw it


async def test_tool_search_finds_a_deferred_tool_that_then_runs(serve: Any) -> None:
    search = server_tool_use("tool_search_tool_regex", {"pattern": "convert"})
    server = serve(
        [
            reply(
                search,
                tool_search_result(search, ["convert"]),
                tool_call("convert", {"amount": 10, "currency": "USD"}),
            ),
            reply("10 EUR is 20.0 USD."),
        ]
    )
    agent = Agent(client=server.client(), tools=[add, convert, ToolSearch()])
    result = await agent.run("Convert 10 euros to dollars.")

    assert result.text == "10 EUR is 20.0 USD."
    assert [(c.name, c.output) for c in result.tool_calls] == [("convert", "20.0 USD")]
    first = server.requests[0]
    assert [t.get("defer_loading", False) for t in first["tools"]] == [False, True, False]
    assert first["tools"][2] == {
        "type": "tool_search_tool_regex_20251119",
        "name": "tool_search_tool_regex",
    }
    assert "advanced-tool-use-2025-11-20" in _betas(server.recorded[0])
    assert result.messages[1]["content"][1]["type"] == "tool_search_tool_result"


def test_a_copy_of_a_tool_may_be_deferred_or_not() -> None:
    assert add.replace(defer_loading=True).definition.to_wire()["defer_loading"] is True
    assert "defer_loading" not in convert.replace(defer_loading=False).definition.to_wire()
    assert convert.replace(timeout=5).definition.extra == {"defer_loading": True}
    with pytest.raises(ConfigurationError, match="defer_loading must be True or False"):
        tool(name="deferred", defer_loading="yes")(lambda: None)  # type: ignore[call-overload]


def test_a_deferred_tool_needs_a_tool_search() -> None:
    with pytest.raises(ConfigurationError, match=r"convert is deferred .* add ToolSearch"):
        Agent(tools=[add, convert])
    Agent(tools=[convert, ToolSearch(kind="bm25")])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda: WebSearch(max_uses=0), "max_uses must be a whole number", id="uses"),
        pytest.param(
            lambda: WebSearch(allowed_domains=["a.org"], blocked_domains=["b.org"]),
            "not both",
            id="both-domain-lists",
        ),
        pytest.param(lambda: WebFetch(allowed_domains="a.org"), "list of names", id="a-string"),
        pytest.param(lambda: WebFetch(max_content_tokens=0), "at least 1", id="no-tokens"),
        pytest.param(lambda: ToolSearch(kind="fuzzy"), "'regex' or 'bm25'", id="kind"),  # type: ignore[arg-type]
        pytest.param(lambda: CodeExecution(version=""), "version", id="version"),
    ],
)
def test_invalid_server_tool_options_are_refused(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_a_server_tool_named_like_a_function_tool_or_given_twice_is_refused() -> None:
    @tool
    def web_search(query: str) -> str:
        """Search."""
        return query

    with pytest.raises(ConfigurationError, match="web_search is both a function tool"):
        Agent(tools=[web_search, WebSearch()])
    with pytest.raises(ConfigurationError, match="given more than once"):
        Agent(tools=[WebSearch(), WebSearch(max_uses=2)])


async def test_server_tools_are_refused_on_chat_completions() -> None:
    async with ChatCompletionsServer([]) as server:
        with pytest.raises(ConfigurationError, match="Chat Completions has none"):
            Agent(client=server.client(), tools=[WebSearch()])


def test_a_newer_version_and_its_extra_fields_are_sent_as_given() -> None:
    search = WebSearch(version="web_search_20260318", beta="", extra={"response_inclusion": "full"})
    assert search.to_wire() == {
        "type": "web_search_20260318",
        "name": "web_search",
        "response_inclusion": "full",
    }
    assert search.betas == ()
    assert WebFetch(beta="my-beta").betas == ("my-beta",)


def test_a_tool_whose_schema_the_api_defines_is_announced_by_its_type() -> None:
    defined = ToolDefinition("memory", "Memory.", {"type": "object"}, type="memory_20250818")
    assert defined.to_wire() == {"type": "memory_20250818", "name": "memory"}
    request = ModelRequest(model="m", messages=[], max_tokens=1, tools=[defined])
    assert ModelRequest.from_dict(request.to_dict()).tools == [defined]


async def test_chat_completions_announces_such_a_tool_as_a_function() -> None:
    memory = Tool(lambda input: "ok", name="memory", input_schema={"type": "object"})
    memory.definition = replace(memory.definition, type="memory_20250818")
    async with ChatCompletionsServer(["done"]) as server:
        await Agent(client=server.client(), tools=[memory]).run("hi")
    (announced,) = server.requests[0]["tools"]
    assert announced["function"]["name"] == "memory"
    assert announced["function"]["parameters"] == {"type": "object"}


async def test_a_server_tool_given_to_one_run_is_refused_with_a_clear_message() -> None:
    agent = Agent(provider=ScriptedProvider(["never"]))
    with pytest.raises(ConfigurationError, match="WebSearch is a server tool: give it to Agent"):
        await agent.run("hi", tools=[WebSearch()])  # type: ignore[list-item]
