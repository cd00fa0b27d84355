from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _support import history_texts, run_calls, snapshot
from agentloop import Agent, ToolError
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

from agentloop_cortex import TOOLS, CortexConfig, CortexStore
from agentloop_cortex.config import NOT_CONFIGURED


def script() -> list[dict[str, Any]]:
    return [
        reply("Let me check my memory.", tool_call("read_file", {"filename": "memory.md"})),
        reply(
            tool_call("write_file", {"filename": "memory.md", "content": "# Memory\n- likes tea\n"})
        ),
        reply(tool_call("read_file", {"filename": "memory.md"})),
        reply("I will remember that you like tea."),
    ]


def check_run(result: Any, tmp_path: Path) -> None:
    calls = result.tool_calls
    assert [(c.round, c.name, c.is_error) for c in calls] == [
        (1, "read_file", False),
        (2, "write_file", False),
        (3, "read_file", False),
    ]
    assert calls[0].output == ""
    assert calls[1].output == "Wrote 21 bytes to memory.md."
    assert calls[2].output == "# Memory\n- likes tea\n"
    assert result.text == "I will remember that you like tea."
    assert (tmp_path / "ana" / "memory.md").read_text() == "# Memory\n- likes tea\n"
    assert history_texts(tmp_path / "ana") == []


async def test_read_write_read_scripted(tmp_path: Path) -> None:
    agent = Agent(provider=ScriptedProvider(script()), tools=TOOLS)
    result = await agent.run("I like tea.", deps=CortexConfig(root=tmp_path, persona="ana"))
    check_run(result, tmp_path)
    # The tool_result blocks the model got in the next request.
    last_user = result.messages[-2]
    assert last_user["role"] == "user"
    assert last_user["content"][0]["content"] == "# Memory\n- likes tea\n"


async def test_read_write_read_over_http(tmp_path: Path) -> None:
    with MessagesServer(script()) as server:
        async with server.client() as client:
            agent = Agent(client=client, tools=TOOLS)
            result = await agent.run(
                "I like tea.", deps={"cortex": CortexConfig(root=tmp_path, persona="ana")}
            )
        check_run(result, tmp_path)
        assert len(server.requests) == 4
        sent_tools = [t["name"] for t in server.requests[0]["tools"]]
        assert sent_tools == ["read_file", "write_file", "append_file", "replace_in_file"]
        results = server.requests[3]["messages"][-1]["content"]
        assert results[0]["type"] == "tool_result"
        assert results[0]["content"] == "# Memory\n- likes tea\n"
        assert "is_error" not in results[0]


@pytest.mark.parametrize(
    "deps",
    [None, 42, {}, {"other": 1}, SimpleNamespace(), SimpleNamespace(cortex="x"), {"cortex": None}],
)
async def test_not_configured(tmp_path: Path, deps: Any) -> None:
    before = snapshot(tmp_path)
    calls = await run_calls(
        [
            ("read_file", {"filename": "memory.md"}),
            ("write_file", {"filename": "memory.md", "content": "x"}),
        ],
        deps,
    )
    assert [(c.is_error, c.output) for c in calls] == [(True, NOT_CONFIGURED)] * 2
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("style", ["config", "attribute", "mapping"])
async def test_config_lookup(tmp_path: Path, style: str) -> None:
    config = CortexConfig(root=tmp_path, persona="bo")
    deps: Any = {
        "config": config,
        "attribute": SimpleNamespace(cortex=config, db=None),
        "mapping": {"cortex": config, "user": "u1"},
    }[style]
    calls = await run_calls([("append_file", {"filename": "soul.md", "content": "calm"})], deps)
    assert not calls[0].is_error
    assert (tmp_path / "bo" / "soul.md").read_text() == "calm"


def test_config_validation(tmp_path: Path) -> None:
    for bad in ["", ".hidden", "..", "../x", "a/b", "/abs", "a\0b", "x" * 65, "é", "a b"]:
        with pytest.raises(ValueError, match="invalid persona name"):
            CortexConfig(root=tmp_path, persona=bad)
    for ok in ["a", "A-b_c.d", "x" * 64, "0"]:
        assert CortexConfig(root=tmp_path, persona=ok).persona == ok
    with pytest.raises(ValueError, match="max_bytes"):
        CortexConfig(root=tmp_path, persona="a", max_bytes=0)
    with pytest.raises(ValueError, match="history"):
        CortexConfig(root=tmp_path, persona="a", history=-1)
    with pytest.raises(TypeError):
        CortexConfig(tmp_path, "a")  # type: ignore[misc]
    assert CortexConfig(root=str(tmp_path), persona="a").root == tmp_path  # type: ignore[arg-type]


async def test_tampered_config_is_refused_at_use(tmp_path: Path) -> None:
    config = CortexConfig(root=tmp_path, persona="ok")
    object.__setattr__(config, "persona", "../escape")
    with pytest.raises(ToolError, match="invalid persona name"):
        CortexStore(config)
    calls = await run_calls([("write_file", {"filename": "memory.md", "content": "x"})], config)
    assert calls[0].is_error
    assert "invalid persona name '../escape'" in calls[0].output
    assert snapshot(tmp_path) == {}


async def test_append_and_replace(tmp_path: Path) -> None:
    config = CortexConfig(root=tmp_path, persona="cy")
    calls = await run_calls(
        [("append_file", {"filename": "relationship.md", "content": "a\n"})], config
    )
    assert calls[0].output == "Appended 2 bytes to relationship.md (now 2 bytes)."
    calls = await run_calls(
        [("append_file", {"filename": "relationship.md", "content": "b b\nc\n"})], config
    )
    assert calls[0].output == (
        "Appended 6 bytes to relationship.md (now 8 bytes). "
        "The previous version (2 bytes) was kept in the history."
    )
    path = tmp_path / "cy" / "relationship.md"
    assert path.read_text() == "a\nb b\nc\n"

    calls = await run_calls(
        [
            ("replace_in_file", {"filename": "relationship.md", "old": "b", "new": "x"}),
            ("replace_in_file", {"filename": "relationship.md", "old": "zzz", "new": "x"}),
            ("replace_in_file", {"filename": "relationship.md", "old": "", "new": "x"}),
            ("replace_in_file", {"filename": "memory.md", "old": "a", "new": "x"}),
        ],
        config,
    )
    assert all(c.is_error for c in calls)
    assert calls[0].output.startswith(
        "old must occur exactly once in relationship.md, but it occurs 2 times"
    )
    assert "it occurs 0 times" in calls[1].output
    assert "old must not be empty" in calls[2].output
    assert "memory.md, but it occurs 0 times" in calls[3].output
    assert not (tmp_path / "cy" / "memory.md").exists()
    assert path.read_text() == "a\nb b\nc\n"

    calls = await run_calls(
        [("replace_in_file", {"filename": "relationship.md", "old": "b b\n", "new": "bé\n"})],
        config,
    )
    assert calls[0].output.startswith("Replaced 1 passage in relationship.md (now 8 bytes).")
    assert path.read_text() == "a\nbé\nc\n"
    assert history_texts(tmp_path / "cy", "relationship.md") == ["a\n", "a\nb b\nc\n"]


def test_readers_never_see_a_mix(tmp_path: Path) -> None:
    config = CortexConfig(root=tmp_path, persona="dee", max_bytes=1 << 20, history=2)
    store = CortexStore(config)
    contents = ["a" * 300_000, "b" * 200_000]
    store.write("memory.md", contents[0])
    stop = threading.Event()
    seen: set[str] = set()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                text = store.read("memory.md")
                if text not in contents:
                    errors.append(AssertionError(f"torn read of {len(text)} chars"))
                    return
                seen.add(text[0])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(40):
        store.write("memory.md", contents[i % 2])
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert seen <= {"a", "b"}
    assert store.read("memory.md") == contents[1]
