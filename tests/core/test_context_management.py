"""Server-side context management: edits passed through, compaction blocks sent back verbatim."""

from __future__ import annotations

from typing import Any

import pytest

from agentloop import Agent, AnthropicProvider, ConfigurationError, HistoryError, lint_history, tool
from agentloop.messages import parse_history
from agentloop.testing import ChatCompletionsServer, ScriptedProvider, reply, tool_call

COMPACTION = {
    "type": "compaction",
    "content": "The user asked for the weather in Paris; it was 18 \u00b0C and sunny.",
    "encrypted_content": "EqQBCkYIBxgCKkBvcGFxdWU=",
}


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: 18 C"


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_compaction_blocks_are_kept_verbatim_and_sent_back(
    serve: Any, streamed: bool
) -> None:
    script = [
        reply(COMPACTION, stop_reason="compaction"),
        reply(tool_call("weather", {"city": "Rome"})),
        reply("Rome is as warm as Paris."),
    ]
    server = serve(script)
    edits = {"edits": [{"type": "compact_20260112", "pause_after_compaction": True}]}
    agent = Agent(
        provider=AnthropicProvider(server.client(), stream=streamed),
        tools=[weather],
        context_management=edits,
    )
    result = await agent.run("And Rome?")
    assert result.stop_reason == "end_turn" and result.rounds == 3
    for seen in server.recorded:
        assert "compact-2026-01-12" in seen.headers["anthropic-beta"].split(",")
        assert seen.body["context_management"] == edits
    # The paused turn is continued: the compaction block goes back as it came.
    assert server.requests[1]["messages"][-1] == {"role": "assistant", "content": [COMPACTION]}
    assistant = server.requests[2]["messages"][1]
    assert assistant["role"] == "assistant" and assistant["content"][0] == COMPACTION
    assert result.messages[1]["content"][0] == COMPACTION
    lint_history(parse_history(result.messages))


async def test_clear_edits_go_out_under_the_context_management_beta(serve: Any) -> None:
    server = serve([reply("ok")])
    edits = {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 1000},
            },
        ]
    }
    agent = Agent(
        client=server.client(), context_management=edits, params={"betas": ["files-api-2025-04-14"]}
    )
    await agent.run("hi")
    (seen,) = server.recorded
    assert seen.headers["anthropic-beta"].split(",") == [
        "files-api-2025-04-14",
        "context-management-2025-06-27",
    ]
    assert seen.body["context_management"] == edits


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"edit": []}, id="no-edits"),
        pytest.param({"edits": [{"keep": 1}]}, id="no-type"),
        pytest.param([{"type": "compact_20260112"}], id="a-list"),
    ],
)
def test_context_management_must_be_a_list_of_edits(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="context_management must be"):
        Agent(provider=ScriptedProvider([]), context_management=value)


async def test_context_management_is_refused_on_chat_completions(serve_chat: Any) -> None:
    from agentloop import OpenAIChatProvider

    chat: ChatCompletionsServer = serve_chat([reply("unused")])
    with pytest.raises(ConfigurationError, match="Messages API feature"):
        Agent(
            provider=OpenAIChatProvider(chat.client()),
            context_management={"edits": [{"type": "compact_20260112"}]},
        )


@pytest.mark.parametrize(
    ("history", "message"),
    [
        pytest.param(
            [{"role": "user", "content": [COMPACTION, {"type": "text", "text": "hi"}]}],
            "`compaction` blocks can only appear in assistant messages",
            id="in-a-user-message",
        ),
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{**COMPACTION, "content": ""}]},
                {"role": "user", "content": "go on"},
            ],
            "compaction block content must be a non-empty string",
            id="empty-summary",
        ),
    ],
)
def test_the_linter_knows_the_rules_of_compaction_blocks(
    history: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(HistoryError, match=message):
        lint_history(parse_history(history))


def test_a_failed_compaction_block_with_null_content_is_valid() -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "compaction", "content": None}]},
        {"role": "user", "content": "go on"},
    ]
    lint_history(parse_history(history))
