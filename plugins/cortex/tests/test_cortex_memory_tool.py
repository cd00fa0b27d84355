"""Claude's memory tool over a persona's folder: its commands, its wire form, its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _support import history_texts, snapshot
from agentloop import Agent, ToolCallRecord
from agentloop.cli import main
from agentloop.plugins import ENV_VAR
from agentloop.testing import MessagesServer, reply, tool_call

from agentloop_cortex import MEMORY_TOOL, CortexConfig


def contents(root: Path) -> dict[str, object]:
    """The files under `root` and what they hold (cortex's lock files aside)."""
    return {
        name: entry[:2]
        for name, entry in snapshot(root).items()
        if entry[0] != "dir" and not name.endswith(".lock")
    }


def memory(command: str, **fields: Any) -> dict[str, Any]:
    return tool_call("memory", {"command": command, **fields})


async def run_memory(
    root: Path, *turns: list[dict[str, Any]], max_bytes: int = 256 * 1024
) -> tuple[list[ToolCallRecord], MessagesServer]:
    """A run over HTTP whose model makes each turn's memory calls, then stops."""
    script = [reply(*calls) for calls in turns] + [reply("done")]
    config = CortexConfig(root=root, persona="ana", max_bytes=max_bytes)
    async with MessagesServer(script) as server:
        agent = Agent(client=server.client(), tools=[MEMORY_TOOL])
        result = await agent.run("remember", deps=config)
    assert result.text == "done"
    return result.tool_calls, server


async def test_the_tool_is_announced_as_the_api_defines_it(tmp_path: Path) -> None:
    calls, server = await run_memory(tmp_path, [memory("view", path="/memories")])
    (announced,) = server.requests[0]["tools"]
    announced.pop("cache_control")  # the agent's prompt cache breakpoint
    assert announced == {"type": "memory_20250818", "name": "memory"}
    assert calls[0].output.splitlines()[1:] == ["0B\t/memories"]


async def test_each_command_reads_and_writes_the_persona_files(tmp_path: Path) -> None:
    folder = tmp_path / "ana"
    calls, _ = await run_memory(
        tmp_path,
        [memory("create", path="/memories/memory.md", file_text="# Memory\n- tea\n")],
        [memory("str_replace", path="/memories/memory.md", old_str="tea", new_str="green tea")],
        [memory("insert", path="/memories/memory.md", insert_line=1, insert_text="- Paris")],
        [memory("create", path="/memories/notes.md", file_text="draft")],
        [memory("rename", old_path="/memories/notes.md", new_path="/memories/plans.md")],
        [memory("view", path="/memories/memory.md", view_range=[2, -1])],
        [memory("view", path="/memories")],
        [memory("delete", path="/memories/plans.md")],
    )
    assert [c.is_error for c in calls] == [False] * 8, [c.output for c in calls]
    assert (folder / "memory.md").read_text() == "# Memory\n- Paris\n- green tea\n"
    assert calls[5].output.splitlines()[1:] == ["     2\t- Paris", "     3\t- green tea"]
    assert "/memories/memory.md" in calls[6].output and "/memories/plans.md" in calls[6].output
    assert not (folder / "plans.md").exists()
    # Every change kept the version before it; the deleted file's content too.
    assert history_texts(folder) == ["# Memory\n- tea\n", "# Memory\n- green tea\n"]
    assert history_texts(folder, "plans.md") == ["draft"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            memory("view", path="/memories/../../etc/passwd"), "would leave /memories", id="dotdot"
        ),
        pytest.param(memory("view", path="/etc/passwd"), "must start with /memories", id="outside"),
        pytest.param(
            memory("create", path="/memories/a/b.md", file_text="x"), "subfolder", id="subfolder"
        ),
        pytest.param(
            memory("create", path="/memories/.history", file_text="x"),
            "invalid file name",
            id="hidden",
        ),
        pytest.param(
            memory("create", path="/memories/big.md", file_text="x" * 2000),
            "over the limit",
            id="oversized",
        ),
        pytest.param(memory("delete", path="/memories"), "directory itself", id="delete-root"),
        pytest.param(memory("view", path="/memories/none.md"), "does not exist", id="missing"),
        pytest.param(memory("format", path="/memories"), "unknown command", id="command"),
        pytest.param(
            memory("insert", path="/memories/memory.md", insert_line=9, insert_text="x"),
            "outside the file",
            id="insert-line",
        ),
        pytest.param(
            memory("create", path="/memories/memory.md", file_text="again"),
            "already exists",
            id="create-twice",
        ),
    ],
)
async def test_what_cortex_refuses_reaches_the_model_as_an_error(
    tmp_path: Path, call: dict[str, Any], message: str
) -> None:
    folder = tmp_path / "ana"
    folder.mkdir()
    (folder / "memory.md").write_text("kept\n")
    before = contents(tmp_path)
    calls, _ = await run_memory(tmp_path, [call], max_bytes=1000)
    assert calls[0].is_error and message in calls[0].output, calls[0].output
    assert contents(tmp_path) == before


async def test_a_symlink_in_the_folder_is_refused_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    folder = tmp_path / "ana"
    folder.mkdir()
    (folder / "memory.md").symlink_to(secret)
    calls, _ = await run_memory(
        tmp_path,
        [memory("view", path="/memories/memory.md")],
        [memory("str_replace", path="/memories/memory.md", old_str="private", new_str="x")],
        [memory("delete", path="/memories/memory.md")],
    )
    assert all(c.is_error and "symbolic link" in c.output for c in calls), [c.output for c in calls]
    assert secret.read_text() == "private" and (folder / "memory.md").is_symlink()


# --------------------------------------------------------------------------- the command


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """In-process runs: only the cortex plugin, no API key, in a temporary directory."""
    monkeypatch.setenv(ENV_VAR, "cortex")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_memory_tool_flag_runs_the_offline_demo_through_memory(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "I like sailing", "--memory-tool", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert [c["input"]["command"] for c in first["tool_calls"]] == ["view", "create"]
    assert main(["run", "I moved to Lisbon", "--memory-tool", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    commands = [(c["name"], c["input"]["command"], c["is_error"]) for c in second["tool_calls"]]
    assert commands == [
        ("memory", "view", False),
        ("memory", "view", False),
        ("memory", "insert", False),
    ]
    memory_md = (offline / "cortex" / "default" / "memory.md").read_text()
    assert memory_md.count("- Note ") == 2 and memory_md.index("sailing") < memory_md.index(
        "Lisbon"
    )


def test_memory_tool_flag_sends_the_memory_tool_in_place_of_the_cortex_tools(
    offline: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        reply(
            memory("create", path="/memories/soul.md", file_text="Calm.\n"),
            memory("create", path="/memories/plans.md", file_text="Sail."),
        ),
        "ok",
    ]
    with MessagesServer(script) as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        assert main(["run", "hi", "--persona", "bo", "--memory-tool"]) == 0
    request = server.requests[0]
    assert "/memories" in request["system"][0]["text"]
    assert [(t["type"], t["name"]) for t in request["tools"]] == [("memory_20250818", "memory")]
    out = capsys.readouterr().out
    assert "--- soul.md (6 bytes)\nCalm." in out
    assert out.index("--- relationship.md") < out.index("--- plans.md (5 bytes)\nSail.")
    assert (offline / "cortex" / "bo" / "soul.md").read_text() == "Calm.\n"


def test_a_run_whose_memory_writes_all_failed_exits_1(
    offline: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [reply(memory("create", path="/memories/../x.md", file_text="x")), "ok"]
    with MessagesServer(script) as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        assert main(["run", "hi", "--memory-tool"]) == 1
    assert "could not be changed: the write failed" in capsys.readouterr().err
