"""Helpers shared by the cortex tests."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentloop import Agent, ToolCallRecord
from agentloop.testing import ScriptedProvider, reply, tool_call

from agentloop_cortex import TOOLS

Call = tuple[str, dict[str, Any]]


def snapshot(base: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under `base` (symlinks not followed) with its content and mtime."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            rel = str(path.relative_to(base))
            info = path.lstat()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", info.st_mtime_ns)
            elif not path.is_file():
                out[rel] = ("special", info.st_mode, info.st_mtime_ns)
            else:
                out[rel] = ("file", path.read_bytes(), info.st_mtime_ns)
    return out


async def run_calls(
    calls: Sequence[Call], deps: Any, *, concurrency: int = 8
) -> list[ToolCallRecord]:
    """One agent run whose model makes `calls` in one turn, then stops; the call log."""
    script = [reply(*(tool_call(name, args) for name, args in calls)), reply("done")]
    agent = Agent(provider=ScriptedProvider(script), tools=TOOLS, tool_concurrency=concurrency)
    result = await agent.run("go", deps=deps)
    assert result.text == "done"
    assert len(result.tool_calls) == len(calls)
    return result.tool_calls


def history_texts(directory: Path, filename: str = "memory.md") -> list[str]:
    folder = directory / ".history" / filename
    if not folder.exists():
        return []
    versions = [p for p in folder.iterdir() if re.fullmatch(r"[0-9]+-[0-9]+\.md", p.name)]
    versions.sort(key=lambda p: tuple(int(n) for n in p.stem.split("-")))
    return [p.read_text() for p in versions]


def temp_files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if ".tmp-" in p.name)
