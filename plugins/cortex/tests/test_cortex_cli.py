"""The cortex plugin's part of the `agentloop` command: the offline demo, its report, its
options and their checks, and `agentloop cortex`. Runs go through a subprocess, as a user
would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentloop.cli import main
from agentloop.plugins import ENV_VAR
from agentloop.testing import MessagesServer, reply, tool_call

from agentloop_cortex.demo import count_notes, demo_script, extend_memory

NO_KEY_NOTICE = (
    "agentloop: ANTHROPIC_API_KEY is not set, so this runs the offline demo of the 'cortex' "
    "plugin on a scripted model (set the key to talk to Claude).\n"
)


def agentloop(
    *args: str, cwd: Path, key: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `python -m agentloop ARGS` in `cwd`, with only the cortex plugin and no API key."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", ENV_VAR)
    }
    if key is not None:
        clean["ANTHROPIC_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "agentloop", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, ENV_VAR: "cortex", **env},
        timeout=60,
    )


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """In-process runs: only the cortex plugin, no API key, in a temporary directory."""
    monkeypatch.setenv(ENV_VAR, "cortex")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --------------------------------------------------------------------------- the demo


def test_the_readme_command_runs_the_offline_demo(tmp_path: Path) -> None:
    done = agentloop("run", "Remember that I prefer tea over coffee.", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == NO_KEY_NOTICE
    out = done.stdout
    for expected in (
        "[round 1] model answered: stop_reason=tool_use",
        "[round 2]   tool write_file: ok",
        "== Transcript ==",
        "user: Remember that I prefer tea over coffee.",
        "assistant -> read_file(filename='memory.md')",
        "assistant -> read_file(filename='soul.md')",
        "== Tool log ==",
        f"== Cortex files ==\ndirectory: {tmp_path.resolve() / 'cortex' / 'default'}\n",
        "--- memory.md (",
        "stop_reason=end_turn, rounds=3",
    ):
        assert expected in out
    memory = (tmp_path / "cortex" / "default" / "memory.md").read_text()
    assert "Note 1: the user said 'Remember that I prefer tea over coffee.'" in memory
    assert memory.rstrip() in out  # the report shows the file's new content
    assert out.rstrip().endswith("soul.md is still empty, so I have no settled voice yet.")


def test_demo_extends_memory_on_a_second_run(tmp_path: Path) -> None:
    root = ["--cortex-root", str(tmp_path / "c"), "--persona", "ada"]
    assert agentloop("run", "I like sailing", *root, cwd=tmp_path).returncode == 0
    done = agentloop("run", "I moved to Lisbon", *root, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    memory = (tmp_path / "c" / "ada" / "memory.md").read_text()
    assert memory.count("- Note ") == 2
    assert memory.index("'I like sailing'") < memory.index("Note 2: the user said 'I moved")
    assert "memory.md now holds 2 note(s)" in done.stdout
    assert f"directory: {tmp_path.resolve() / 'c' / 'ada'}\n" in done.stdout


def test_run_json_output(offline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "hello", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == NO_KEY_NOTICE
    result = json.loads(captured.out)
    assert (result["stop_reason"], result["rounds"]) == ("end_turn", 3)
    assert result["usage"]["input_tokens"] == 30
    calls = [(c["round"], c["name"], c["is_error"]) for c in result["tool_calls"]]
    assert calls == [(1, "read_file", False), (2, "write_file", False), (2, "read_file", False)]
    # Round 2 asked for both calls in one assistant turn; both answered in one user turn.
    turn = result["messages"][3]
    assert [b["type"] for b in turn["content"]] == ["text", "tool_use", "tool_use"]
    answers = result["messages"][4]["content"]
    assert [b["tool_use_id"] for b in answers] == [b["id"] for b in turn["content"][1:]]
    assert (offline / "cortex" / "default" / "memory.md").is_file()


def test_offline_flag_with_a_key_and_json_logs(tmp_path: Path) -> None:
    done = agentloop("run", "hi", "--offline", "--log-json", cwd=tmp_path, key="sk-unused")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines()]
    names = [e["event"] for e in events]
    assert names[0] == "run.start" and names[-1] == "run.end"
    assert names.count("tool.call") == 3
    assert all("timestamp" in e and "level" in e for e in events)


def test_the_demo_needs_both_tools(offline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "hi", "--tool", "read_file"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "agentloop: error: the cortex offline demo calls read_file and write_file"
    )
    assert err.count("\n") == 1


def test_with_a_key_the_cortex_tools_and_prompt_are_sent(
    offline: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [reply(tool_call("append_file", {"filename": "soul.md", "content": "Calm.\n"})), "ok"]
    with MessagesServer(script) as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        assert main(["run", "hi", "--persona", "bo"]) == 0
    request = server.requests[0]
    assert "persistent files" in request["system"][0]["text"]  # a block, for cache_control
    assert [t["name"] for t in request["tools"]] == [
        "read_file",
        "write_file",
        "append_file",
        "replace_in_file",
    ]
    out = capsys.readouterr().out
    assert f"directory: {offline.resolve() / 'cortex' / 'bo'}\n" in out
    assert "--- soul.md (6 bytes)\nCalm." in out
    assert (offline / "cortex" / "bo" / "soul.md").read_text() == "Calm.\n"


# --------------------------------------------------------------------------- bad roots


def test_a_root_that_is_a_file_is_one_error_line(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (offline / "afile").write_text("not a directory")
    assert main(["run", "x", "--cortex-root", "afile"]) == 2
    assert capsys.readouterr().err == (
        f"agentloop: error: --cortex-root: {offline.resolve() / 'afile'} is not a directory\n"
    )


def test_a_root_that_cannot_be_created_is_one_error_line(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (offline / "afile").write_text("")
    assert main(["run", "x", "--cortex-root", "afile/below"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentloop: error: --cortex-root: cannot create {offline.resolve()}/")
    assert "afile/below" in err and err.count("\n") == 1


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_root_in_proc_is_refused_before_running(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "x", "--cortex-root", "/proc/x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    assert captured.err.startswith("agentloop: error: --cortex-root: cannot create /proc/x: ")
    assert captured.err.count("\n") == 1


def test_a_run_whose_writes_all_failed_exits_1_naming_the_directory(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    persona = offline / "cortex" / "default"
    persona.mkdir(parents=True)
    (persona / ".memory.md.lock").symlink_to(offline / "elsewhere")  # writes are refused
    assert main(["run", "x"]) == 1
    captured = capsys.readouterr()
    assert "[round 2]   tool write_file: error" in captured.out
    assert captured.err == NO_KEY_NOTICE + (
        f"agentloop: error: the cortex files in {persona.resolve()} could not be changed: the "
        "write failed (refusing to use default/.memory.md.lock: it is a symbolic link; cortex "
        "only uses real files and directories inside the persona directory)\n"
    )
    assert not (persona / "memory.md").exists()


def test_a_bad_persona_is_one_error_line(offline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "x", "--persona", "../up"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentloop: error: --persona: invalid persona name '../up'")
    assert not (offline / "cortex").exists()


# --------------------------------------------------------------------------- agentloop cortex


def test_the_cortex_command_shows_the_files(tmp_path: Path) -> None:
    root = ["--cortex-root", str(tmp_path / "c"), "--persona", "ada"]
    assert agentloop("run", "I like sailing", *root, cwd=tmp_path).returncode == 0
    done = agentloop("cortex", *root, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"directory: {tmp_path.resolve() / 'c' / 'ada'}"
    assert lines[1].startswith("--- memory.md (") and "I like sailing" in done.stdout
    assert "--- soul.md (0 bytes)\n(empty)" in done.stdout


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_the_cortex_command_refuses_a_root_that_is_no_folder(
    kind: str, offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if kind == "a file":
        (offline / "typo").write_text("")
    assert main(["cortex", "--cortex-root", "typo"]) == 2
    captured = capsys.readouterr()
    why = "no such folder: {}" if kind == "missing" else "{} is not a directory"
    assert captured.out == ""
    assert captured.err == f"agentloop: error: --cortex-root: {why.format(offline / 'typo')}\n"


def test_cortex_options_are_in_run_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "cortex plugin:" in out and "--cortex-root DIR" in out and "--persona" in out


# --------------------------------------------------------------------------- the script


def test_extend_memory_numbers_notes() -> None:
    first = extend_memory("", "hello   there")
    assert count_notes(first) == 1 and "'hello there'" in first
    second = extend_memory(first, "again")
    assert count_notes(second) == 2 and second.startswith(first.rstrip())


def test_demo_script_reads_first() -> None:
    answer = demo_script({"messages": [{"role": "user", "content": "hi"}]})
    (call,) = [b for b in answer["content"] if b["type"] == "tool_use"]
    assert (call["name"], call["input"]) == ("read_file", {"filename": "memory.md"})
