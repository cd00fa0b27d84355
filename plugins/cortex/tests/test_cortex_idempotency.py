"""Keyed changes happen once: a retried or resumed call with the same key changes nothing.

The crash cases run the change in a child process that is SIGKILLed at the point under
test (it says where it is and waits; no timing), then retry the change in this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentloop import Agent
from agentloop.testing import ScriptedProvider, reply, tool_call

from agentloop_cortex import TOOLS, CortexConfig, CortexStore

CHILD = str(Path(__file__).with_name("_keyed_child.py"))
TEA = "- likes tea\n"


def store(root: Path) -> CortexStore:
    return CortexStore(CortexConfig(root=root, persona="p"))


def test_a_change_made_again_under_its_key_changes_nothing(tmp_path: Path) -> None:
    cortex = store(tmp_path)
    first = cortex.append("memory.md", TEA, key="run_1:toolu_a")
    again = cortex.append("memory.md", TEA, key="run_1:toolu_a")
    other = cortex.append("memory.md", TEA, key="run_1:toolu_b")
    assert again == first
    assert other.size == 2 * len(TEA)
    assert cortex.read("memory.md") == TEA * 2
    # replace and write are keyed the same way; a replayed replace does not fail on the
    # text it already replaced.
    cortex.replace("memory.md", "tea\n- likes tea", "tea\n- likes green tea", key="run_1:c")
    cortex.replace("memory.md", "tea\n- likes tea", "tea\n- likes green tea", key="run_1:c")
    cortex.write("soul.md", "calm\n", key="run_1:d")
    cortex.write("soul.md", "other\n")
    cortex.write("soul.md", "calm\n", key="run_1:d")
    assert cortex.read("memory.md") == "- likes tea\n- likes green tea\n"
    assert cortex.read("soul.md") == "other\n"


def test_unkeyed_changes_are_made_every_time(tmp_path: Path) -> None:
    cortex = store(tmp_path)
    cortex.append("memory.md", TEA)
    cortex.append("memory.md", TEA)
    assert cortex.read("memory.md") == TEA * 2


def killed_at(root: Path, key: str, stop: str) -> None:
    command = [sys.executable, CHILD, str(root), "p", key, stop]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == f"stopped {stop}\n"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("stop", ["before-rename", "after-rename"])
def test_a_change_killed_mid_way_and_retried_is_made_once(tmp_path: Path, stop: str) -> None:
    store(tmp_path).append("memory.md", "# notes\n")
    killed_at(tmp_path, "run_1:toolu_a", stop)
    retried = store(tmp_path).append("memory.md", TEA, key="run_1:toolu_a")
    assert store(tmp_path).read("memory.md") == "# notes\n" + TEA
    assert retried.size == len("# notes\n" + TEA)


def test_a_change_killed_after_its_effect_then_overwritten_is_still_not_made_again(
    tmp_path: Path,
) -> None:
    killed_at(tmp_path, "run_1:toolu_a", "after-rename")
    store(tmp_path).write("memory.md", "rewritten\n")  # another call settles the ledger
    store(tmp_path).append("memory.md", TEA, key="run_1:toolu_a")
    assert store(tmp_path).read("memory.md") == "rewritten\n"


def test_without_a_key_the_retry_makes_the_change_twice(tmp_path: Path) -> None:
    """The negative control: what the key prevents does happen without it."""
    killed_at(tmp_path, "-", "after-rename")
    store(tmp_path).append("memory.md", TEA)
    assert store(tmp_path).read("memory.md") == TEA * 2


async def test_the_tools_use_the_calls_idempotency_key(tmp_path: Path) -> None:
    script = [reply(tool_call("append_file", {"filename": "memory.md", "content": TEA})), "ok"]
    agent = Agent(provider=ScriptedProvider(script), tools=TOOLS)
    result = await agent.run("go", deps=CortexConfig(root=tmp_path, persona="p"))
    (call,) = result.tool_calls
    assert not call.is_error, call
    ledger = (tmp_path / "p" / ".memory.md.applied").read_text()
    assert f'"key":"{result.run_id}:{call.tool_use_id}"' in ledger
