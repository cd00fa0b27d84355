"""Wire-exact blocks, the history linter and repair."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from agentloop import HistoryError, Message, lint_history, repair
from agentloop.lint import HistoryLinter
from agentloop.messages import (
    ServerToolResultBlock,
    ServerToolUseBlock,
    ToolResultBlock,
    UnknownBlock,
    dump_history,
    parse_history,
)
from agentloop.testing import ScriptedModel, reply


def user(*content: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(content)}


def assistant(*content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": list(content)}


def use(id: str, name: str = "t") -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": {}}


def result(id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id, "content": "r", **extra}


TEXT = {"type": "text", "text": "hi"}
SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
THINK = {"type": "thinking", "thinking": "hmm", "signature": "sig"}


def test_dump_is_exactly_what_was_parsed() -> None:
    history = [
        {"role": "user", "content": "plain string"},
        assistant(
            {"type": "text", "text": "a", "citations": None},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "t",
                "input": {"z": 1, "a": None},
                "caller": {"type": "direct"},
            },
            {"type": "brand_new", "anything": {"nested": [1, None]}, "flag": None},
        ),
        user(
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "x"}],
                "is_error": False,
                "cache_control": None,
            }
        ),
    ]
    messages = parse_history(history)
    assert isinstance(messages[1].content[2], UnknownBlock)  # type: ignore[index]
    assert dump_history(messages) == history
    assert json.dumps(dump_history(messages)) == json.dumps(history)


def test_built_blocks_have_no_invented_fields() -> None:
    block = ToolResultBlock(tool_use_id="toolu_1")
    assert block.to_wire() == {"type": "tool_result", "tool_use_id": "toolu_1"}
    assert Message.user("hi").wire == {"role": "user", "content": "hi"}
    server = ServerToolResultBlock(
        type="web_fetch_tool_result", tool_use_id="srvtoolu_1", content={"a": 1}
    )
    assert server.to_wire() == {
        "type": "web_fetch_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {"a": 1},
    }
    assert ServerToolUseBlock(id="s", name="web_search").to_wire() == {
        "type": "server_tool_use",
        "id": "s",
        "name": "web_search",
    }


def test_malformed_history_is_a_history_error() -> None:
    with pytest.raises(HistoryError, match=r"messages\.0\.content"):
        parse_history([{"role": "user", "content": [{"type": "tool_use", "id": 1}]}])
    # A role must be a string; which roles the API takes is the API's to say (below).
    with pytest.raises(HistoryError, match=r"messages\.0\.role"):
        parse_history([{"role": 1, "content": "x"}])
    with pytest.raises(HistoryError, match=r"messages\.0\.role"):
        parse_history([{"content": "x"}])


def test_a_role_this_version_does_not_know_passes_through() -> None:
    wire = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}], "extra": 1},
    ]
    messages = parse_history(wire)
    assert messages[1].role == "system"
    assert dump_history(messages) == wire


VALID = [
    pytest.param([user(TEXT)], id="one-user"),
    pytest.param(
        [user(TEXT), assistant(use("a"), use("b")), user(result("a"), result("b"), TEXT)],
        id="results-then-text",
    ),
    pytest.param([user(TEXT), user(TEXT), assistant(TEXT)], id="consecutive-users-merge"),
    pytest.param(
        [
            user(TEXT),
            assistant(
                TEXT, {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}
            ),
        ],
        id="paused-server-use-last",
    ),
    pytest.param(
        [
            user(TEXT),
            assistant(
                {"type": "server_tool_use", "id": "s1", "name": "code_execution", "input": {}},
                {**use("c"), "caller": {"type": "code_execution_20260120", "tool_id": "s1"}},
            ),
            user(result("c")),
        ],
        id="programmatic-call",
    ),
    pytest.param([user(TEXT), assistant(THINK, use("a")), user(result("a"))], id="thinking-loop"),
    pytest.param(
        [user(TEXT), assistant({"type": "text", "text": " "}, use("a")), user(result("a"))],
        id="whitespace-text-beside-a-call",
    ),
    pytest.param([user(TEXT), assistant()], id="empty-final-assistant"),
    # A mid-conversation system message is stepped over: the API judges where it stands.
    pytest.param([user(TEXT), SYSTEM], id="system-last"),
    pytest.param([user(TEXT), SYSTEM, assistant(TEXT), user(TEXT)], id="system-mid"),
    pytest.param([SYSTEM, user(TEXT), assistant(TEXT)], id="system-first"),
    pytest.param(
        [user(TEXT), assistant(THINK, use("a")), SYSTEM, user(result("a"))],
        id="system-between-call-and-result",
    ),
    pytest.param([user(TEXT), SYSTEM, user(TEXT), assistant(TEXT)], id="users-merge-over-system"),
]


@pytest.mark.parametrize("history", VALID)
def test_valid_histories_pass(history: list[dict[str, Any]]) -> None:
    messages = parse_history(history)
    lint_history(messages)
    thinking_loop = any(b.get("type") == "thinking" for m in history for b in m["content"])
    if thinking_loop or not any(b.get("type") == "tool_result" for b in history[-1]["content"]):
        lint_history(messages, thinking=True)


INVALID = [
    pytest.param([], {}, "messages: at least one message is required", id="empty"),
    pytest.param(
        [user(TEXT), assistant(use("a"))],
        {},
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: a.",
        id="dangling-last",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a"), use("b")), user(result("a"))],
        {},
        "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: b. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        id="unanswered",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a")), assistant(TEXT)],
        {},
        "messages.1: `tool_use` ids were found without",
        id="no-user-after",
    ),
    pytest.param(
        [{"role": "user", "content": "q"}, user(result("toolu_x"))],
        {},
        "messages.0.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
        id="orphan-after-merge",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a")), user(TEXT, result("a"))],
        {},
        "messages.2.content.1: `tool_result` blocks must come first",
        id="result-not-first",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a")), user(result("a"), result("a"))],
        {},
        "messages.2.content.1: each `tool_use` must have a single result",
        id="duplicate-result",
    ),
    pytest.param(
        [
            user(TEXT),
            assistant(use("a")),
            user(result("a")),
            assistant(use("a")),
            user(result("a")),
        ],
        {},
        "messages.3.content.0: `tool_use` ids must be unique",
        id="duplicate-use-id",
    ),
    pytest.param(
        [user({"type": "text", "text": ""})],
        {},
        "messages.0.content.0: text content blocks must be non-empty",
        id="empty-text",
    ),
    pytest.param(
        [user(TEXT), assistant(), user(TEXT)],
        {},
        "messages.1: all messages must have non-empty content",
        id="empty-message",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a")), user(result("a"))],
        {"thinking": True},
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`",
        id="thinking-missing",
    ),
    pytest.param(
        [user(TEXT)],
        {"thinking": True, "tool_choice": {"type": "any"}},
        "Thinking may not be enabled when tool_choice forces tool use.",
        id="forced-choice-thinking",
    ),
    pytest.param(
        [user(TEXT), assistant({**THINK, "signature": ""}, TEXT)],
        {},
        "messages.1.content.0.signature",
        id="thinking-unsigned",
    ),
    pytest.param(
        [
            user(TEXT),
            assistant({"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}),
            user(TEXT),
            assistant(TEXT),
        ],
        {},
        "messages.1: server tool use s1 has no result block",
        id="server-use-unpaired",
    ),
    pytest.param(
        [
            user(TEXT),
            assistant({"type": "web_search_tool_result", "tool_use_id": "s9", "content": []}),
        ],
        {},
        "messages.1.content.0: `web_search_tool_result` block refers to an unknown server tool use id: s9",
        id="server-result-orphan",
    ),
    pytest.param(
        [user(TEXT, {"type": "image", "source": {"type": "file", "file_id": "f"}})],
        {},
        "messages.0.content.1.source: Input tag 'file' found using 'type' does not match any of the expected tags: 'base64', 'url'",
        id="file-source",
    ),
    pytest.param(
        [user(TEXT), assistant(TEXT), user({"type": "text", "text": " \n"})],
        {},
        "messages.2.content.0: text content blocks must contain non-whitespace text",
        id="whitespace-user-text",
    ),
    pytest.param(
        [user(TEXT), assistant({"type": "text", "text": "  "}), user(TEXT)],
        {},
        "messages.1: text content blocks must contain non-whitespace text",
        id="whitespace-assistant-message",
    ),
    pytest.param(
        [assistant(TEXT), user(TEXT)],
        {},
        "messages.0: first message must use the user role",
        id="assistant-first",
    ),
    pytest.param(
        [user(TEXT), assistant({**use("a"), "input": "x"}), user(result("a"))],
        {},
        "messages.1.content.0.input: Input should be a valid dictionary",
        id="input-not-an-object",
    ),
    # A system message between them does not stand in for a result, nor make one expected.
    pytest.param(
        [user(TEXT), assistant(use("a")), SYSTEM, user(TEXT)],
        {},
        "messages.2: `tool_use` ids were found without `tool_result` blocks immediately after: a.",
        id="system-does-not-answer-a-call",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a")), SYSTEM],
        {},
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: a.",
        id="system-after-a-dangling-call",
    ),
    pytest.param(
        [user(TEXT), assistant(use("a")), user(result("a")), SYSTEM, user(result("a"))],
        {},
        "messages.2.content.1: each `tool_use` must have a single result",
        id="system-between-two-results",
    ),
    pytest.param(
        [SYSTEM, assistant(TEXT), user(TEXT)],
        {},
        "messages.1: first message must use the user role",
        id="system-then-assistant-first",
    ),
    pytest.param([SYSTEM], {}, "messages: at least one message is required", id="only-system"),
]


@pytest.mark.parametrize(("history", "options", "message"), INVALID)
def test_invalid_histories_are_refused_in_the_api_wording(
    history: list[dict[str, Any]], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(HistoryError) as info:
        lint_history(parse_history(history), **options)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("thinking", "refused"),
    [
        pytest.param(True, True, id="true"),
        pytest.param({"type": "enabled", "budget_tokens": 1024}, True, id="enabled"),
        pytest.param({"type": "adaptive"}, False, id="adaptive"),
        pytest.param({"type": "disabled"}, False, id="disabled"),
        pytest.param(None, False, id="none"),
    ],
)
def test_only_enabled_thinking_requires_a_thinking_block(thinking: Any, refused: bool) -> None:
    """Under `adaptive` the model may answer a tool loop without thinking first."""
    unthought = parse_history([user(TEXT), assistant(TEXT, use("a")), user(result("a"))])
    forced = {"type": "any"}
    if refused:
        with pytest.raises(HistoryError, match="Expected `thinking` or `redacted_thinking`"):
            lint_history(unthought, thinking=thinking)
        with pytest.raises(HistoryError, match="tool_choice forces tool use"):
            lint_history(unthought, thinking=thinking, tool_choice=forced)
    else:
        lint_history(unthought, thinking=thinking)
        lint_history(unthought, thinking=thinking, tool_choice=forced)
        linter = HistoryLinter(thinking=thinking)
        linter.check(unthought)
        linter.check([*unthought, *parse_history([assistant(TEXT)])])


def test_adaptive_thinking_still_keeps_the_latest_thinking_blocks_whole() -> None:
    unsigned = parse_history([user(TEXT), assistant({**THINK, "signature": ""}, use("a"))])
    with pytest.raises(HistoryError, match="cannot be modified"):
        lint_history(
            [*unsigned, *parse_history([user(result("a"))])], thinking={"type": "adaptive"}
        )


def test_the_scripted_model_lints_with_the_request_thinking() -> None:
    unthought = [user(TEXT), assistant(TEXT, use("a")), user(result("a"))]
    model = ScriptedModel([reply("ok"), reply("ok")])
    model.respond({"messages": unthought, "thinking": {"type": "adaptive"}})
    with pytest.raises(HistoryError, match="Expected `thinking`"):
        model.respond(
            {"messages": unthought, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        )


def test_file_sources_allowed_with_the_files_beta() -> None:
    lint_history(
        parse_history([user({"type": "document", "source": {"type": "file", "file_id": "f"}})]),
        allow_file_sources=True,
    )


def test_error_records_the_original_message_index() -> None:
    history = [{"role": "user", "content": "q"}, user(result("toolu_x"))]
    with pytest.raises(HistoryError) as info:
        lint_history(parse_history(history))
    assert (info.value.path, info.value.index) == ("messages.0.content.1", 1)


def test_repair_makes_a_broken_history_valid_and_says_how() -> None:
    history = [
        user(TEXT, {"type": "text", "text": ""}),
        assistant(THINK, use("a"), use("b")),
        user(TEXT, result("b"), result("zzz")),
        assistant(use("c")),
    ]
    report = repair(history)
    lint_history(report.messages)
    wire = dump_history(report.messages)
    assert wire[0]["content"] == [TEXT]
    assert wire[1] == assistant(THINK, use("a"), use("b"))
    assert [b["type"] for b in wire[2]["content"]] == ["tool_result", "tool_result", "text"]
    assert wire[2]["content"][0]["tool_use_id"] == "a" and wire[2]["content"][0]["is_error"] is True
    assert wire[2]["content"][1] == result("b")
    assert wire[4]["content"][0]["tool_use_id"] == "c"
    joined = "\n".join(report.changes)
    for fragment in (
        "empty text",
        "orphan tool_result zzz",
        "is_error tool_result for a",
        "unanswered tool_use ids: c",
    ):
        assert fragment in joined
    assert report.changed


def test_repair_puts_a_user_message_first_and_drops_blank_user_text() -> None:
    history = [assistant(TEXT), user({"type": "text", "text": "  "}, TEXT)]
    with pytest.raises(HistoryError):
        lint_history(parse_history(history))
    report = repair(history)
    lint_history(report.messages)
    wire = dump_history(report.messages)
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert wire[1] == assistant(TEXT)
    assert wire[2]["content"] == [TEXT]
    assert any("before the first" in c for c in report.changes)


def test_repair_leaves_a_valid_history_alone() -> None:
    history = [user(TEXT), assistant(THINK, use("a")), user(result("a"))]
    report = repair(history)
    assert not report.changed and dump_history(report.messages) == history


@pytest.mark.parametrize(
    "history",
    [p for p in VALID if p.id is not None and p.id.startswith(("system", "users-merge-over"))],
)
def test_repair_leaves_system_messages_alone(history: list[dict[str, Any]]) -> None:
    report = repair(history)
    assert not report.changed and dump_history(report.messages) == history


def test_repair_mends_around_a_system_message_and_keeps_it() -> None:
    report = repair([SYSTEM, assistant(use("a")), SYSTEM, user(TEXT), assistant(use("b")), SYSTEM])
    lint_history(report.messages)
    assert [m.role for m in report.messages] == [
        "user",
        "system",
        "assistant",
        "system",
        "user",
        "assistant",
        "user",
        "system",
    ]
    assert [m.to_wire() for m in report.messages if m.role == "system"] == [SYSTEM] * 3
    assert report.changes == [
        "added a user message before the first (assistant) message",
        "messages[3]: added an is_error tool_result for a",
        "added a user message answering unanswered tool_use ids: b",
    ]


GROWTH = [
    user(TEXT),
    assistant(THINK, use("a"), use("b")),
    user(result("a"), result("b")),
    assistant(use("c")),
    user(result("c"), TEXT),
    user(TEXT),
    assistant(TEXT),
]


def _refusal(check: Any, messages: Any, **options: Any) -> str | None:
    """What `check(messages, **options)` refuses the history with, or None when it passes."""
    try:
        check(messages, **options)
    except HistoryError as exc:
        return str(exc)
    return None


def check_growth(growth: list[Any], *, thinking: bool) -> str | None:
    """Check every prefix of `growth` incrementally and in full: the two must agree.

    Returns what the full check says of the whole history."""
    linter = HistoryLinter(thinking=thinking)
    messages = parse_history(growth)
    expected = None
    for n in range(1, len(messages) + 1):
        expected = _refusal(lint_history, messages[:n], thinking=thinking)
        assert _refusal(linter.check, messages[:n]) == expected, n
    return expected


@pytest.mark.parametrize("thinking", [False, True])
def test_incremental_checks_agree_with_full_checks(thinking: bool) -> None:
    check_growth(GROWTH, thinking=thinking)


def test_incremental_checks_agree_with_full_checks_around_system_messages() -> None:
    growth = [GROWTH[0], SYSTEM, GROWTH[1], SYSTEM, *GROWTH[2:5], SYSTEM, *GROWTH[5:], SYSTEM]
    assert check_growth(growth, thinking=True) is None  # the whole history is valid


def test_incremental_linter_notices_a_changed_prefix() -> None:

    linter = HistoryLinter()
    messages = parse_history(GROWTH[:3])
    linter.check(messages)
    changed = [*messages[:2], *parse_history([user(result("a"))])]  # b left unanswered
    with pytest.raises(HistoryError, match="without `tool_result` blocks immediately after: b"):
        linter.check(changed)
    orphan = parse_history([user(TEXT), assistant(TEXT), user(result("zzz"))])
    with pytest.raises(HistoryError, match="unexpected `tool_use_id`"):
        linter.check(orphan)


async def test_a_repaired_history_is_sent_repaired(serve: Any) -> None:
    """The bytes sent are those of the repaired messages, not a stale cache of the originals."""
    from agentloop import Agent

    stored = parse_history(
        [
            user(TEXT, {"type": "text", "text": ""}),
            assistant(TEXT),
        ]
    )
    for message in stored:
        assert message.wire_json  # cached, as after an earlier run sent them
    report = repair(stored)
    server = serve([{"role": "assistant", "content": [TEXT], "stop_reason": "end_turn"}])
    # cache="off": compared byte for byte, without cache markers
    result = await Agent(client=server.client(), cache="off").run("next", history=report.messages)
    assert result.stop_reason == "end_turn"
    (sent,) = server.requests
    assert sent["messages"][0] == user(TEXT)
    assert sent["messages"] == [*dump_history(report.messages)[:2], sent["messages"][2]]


def test_messages_and_blocks_are_immutable() -> None:
    message = parse_history([user(TEXT)])[0]
    with pytest.raises(ValidationError):
        message.role = "assistant"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        message.content[0].text = "changed"  # type: ignore[union-attr]
    with pytest.raises((TypeError, AttributeError)):
        message.content.append(TEXT)  # type: ignore[union-attr]


def test_a_tool_result_block_reads_as_text() -> None:
    assert ToolResultBlock(tool_use_id="t", content="plain").text == "plain"
    image = {"type": "image", "source": {"type": "url", "url": "https://example.org/a.png"}}
    content = [{"type": "text", "text": "a"}, image, {"type": "text", "text": "b"}]
    blocks = parse_history([user(result("t", content=content))])
    (block,) = blocks[0].blocks
    assert isinstance(block, ToolResultBlock) and block.text == "ab"
