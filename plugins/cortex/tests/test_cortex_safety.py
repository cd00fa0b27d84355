from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _support import Call, run_calls, snapshot
from agentloop import ToolError

from agentloop_cortex import CortexConfig, CortexStore

BAD_NAMES = ["../x", "/etc/passwd", "memory.md/../../x", "notes.txt", "memory.md\0", ".history"]


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    """A root and, beside it, an outside directory holding a secret."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    return root, outside


def all_tools(filename: str = "memory.md") -> list[Call]:
    return [
        ("read_file", {"filename": filename}),
        ("write_file", {"filename": filename, "content": "pwned"}),
        ("append_file", {"filename": filename, "content": "pwned"}),
        ("replace_in_file", {"filename": filename, "old": "secret", "new": "pwned"}),
    ]


def mutating(filename: str = "memory.md") -> list[Call]:
    return all_tools(filename)[1:]


async def refused(tmp_path: Path, calls: list[Call], deps: Any, expect: str) -> None:
    """Run `calls`; each must fail with `expect` in its message and change nothing."""
    before = snapshot(tmp_path)
    records = await run_calls(calls, deps)
    for record in records:
        assert record.is_error, record
        assert expect in record.output, record.output
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_bad_filenames_via_agent(tmp_path: Path, world: tuple[Path, Path], name: str) -> None:
    root, _ = world
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, all_tools(name), config, "Input should be 'memory.md'")


@pytest.mark.parametrize("name", [*BAD_NAMES, "MEMORY.md", "memory.md ", "", None, 3])
def test_bad_filenames_via_store(tmp_path: Path, world: tuple[Path, Path], name: Any) -> None:
    root, _ = world
    store = CortexStore(CortexConfig(root=root, persona="p"))
    before = snapshot(tmp_path)
    with pytest.raises(ToolError, match=r"invalid filename .*must be one of memory\.md, soul\.md"):
        store.read(name)
    with pytest.raises(ToolError, match="invalid filename"):
        store.write(name, "x")
    with pytest.raises(ToolError, match="invalid filename"):
        store.append(name, "x")
    with pytest.raises(ToolError, match="invalid filename"):
        store.replace(name, "a", "b")
    with pytest.raises(ToolError, match="invalid filename"):
        store.path(name)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("target", ["secret.txt", "missing.txt"])
async def test_symlinked_file(tmp_path: Path, world: tuple[Path, Path], target: str) -> None:
    root, outside = world
    (root / "p").mkdir()
    (root / "p" / "memory.md").symlink_to(outside / target)
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, all_tools(), config, "p/memory.md: it is a symbolic link")
    assert not (outside / "missing.txt").exists()
    with pytest.raises(ToolError, match="symbolic link"):
        CortexStore(config).read("memory.md")


async def test_symlinked_persona_dir(tmp_path: Path, world: tuple[Path, Path]) -> None:
    root, outside = world
    (outside / "memory.md").write_text("outside memory\n")
    (root / "p").symlink_to(outside, target_is_directory=True)
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, all_tools(), config, "refusing to use p: it is a symbolic link")


@pytest.mark.parametrize("where", [".history", ".history/memory.md"])
async def test_symlinked_history(tmp_path: Path, world: tuple[Path, Path], where: str) -> None:
    root, outside = world
    (root / "p").mkdir()
    (root / "p" / "memory.md").write_text("my secret memory\n")
    if where != ".history":
        (root / "p" / ".history").mkdir()
    (root / "p" / where).symlink_to(outside, target_is_directory=True)
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, mutating(), config, f"p/{where}: it is a symbolic link")
    # Reading does not involve the history.
    records = await run_calls([("read_file", {"filename": "memory.md"})], config)
    assert (records[0].is_error, records[0].output) == (False, "my secret memory\n")


async def test_symlinked_lock_file(tmp_path: Path, world: tuple[Path, Path]) -> None:
    root, outside = world
    (root / "p").mkdir()
    (root / "p" / ".memory.md.lock").symlink_to(outside / "secret.txt")
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, mutating(), config, "p/.memory.md.lock: it is a symbolic link")


async def test_hard_link_and_fifo(tmp_path: Path, world: tuple[Path, Path]) -> None:
    root, outside = world
    (root / "p").mkdir()
    os.link(outside / "secret.txt", root / "p" / "memory.md")
    os.mkfifo(root / "p" / "soul.md")
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, all_tools(), config, "p/memory.md: it has 2 hard links")
    await refused(tmp_path, all_tools("soul.md"), config, "p/soul.md: it is not a regular file")
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_persona_dir_is_a_file(tmp_path: Path, world: tuple[Path, Path]) -> None:
    root, _ = world
    (root / "p").write_text("not a directory")
    config = CortexConfig(root=root, persona="p")
    await refused(tmp_path, all_tools(), config, "refusing to use p: it is not a directory")


async def test_content_over_the_limit(tmp_path: Path, world: tuple[Path, Path]) -> None:
    root, _ = world
    config = CortexConfig(root=root, persona="p", max_bytes=100)
    # Nothing exists yet: a refused write must not even create the persona directory.
    await refused(
        tmp_path,
        [
            ("write_file", {"filename": "memory.md", "content": "x" * 101}),
            ("write_file", {"filename": "memory.md", "content": "é" * 51}),  # 102 bytes
            ("append_file", {"filename": "memory.md", "content": "x" * 101}),
        ],
        config,
        "over the limit of 100 bytes",
    )
    assert not (root / "p").exists()
    full = "x" * 99 + "y"
    ok = await run_calls([("write_file", {"filename": "memory.md", "content": full})], config)
    assert ok[0].output == "Wrote 100 bytes to memory.md."
    await refused(
        tmp_path,
        [
            ("append_file", {"filename": "memory.md", "content": "z"}),
            ("replace_in_file", {"filename": "memory.md", "old": "y", "new": "é"}),
            ("replace_in_file", {"filename": "memory.md", "old": full, "new": "z" * 101}),
        ],
        config,
        "memory.md would be 101 bytes, over the limit of 100 bytes",
    )


@pytest.mark.parametrize("text", ["\ud800", "ok \udfff then", "a\ud83d"])
async def test_lone_surrogates(tmp_path: Path, world: tuple[Path, Path], text: str) -> None:
    root, _ = world
    config = CortexConfig(root=root, persona="p")
    await refused(
        tmp_path,
        [
            ("write_file", {"filename": "memory.md", "content": text}),
            ("append_file", {"filename": "memory.md", "content": text}),
            ("replace_in_file", {"filename": "memory.md", "old": "a", "new": text}),
        ],
        config,
        "unpaired surrogate",
    )
    assert not (root / "p").exists()


async def test_every_refusal_in_one_turn(tmp_path: Path, world: tuple[Path, Path]) -> None:
    """Many bad calls at once, in parallel: all refused, nothing anywhere changes."""
    root, outside = world
    (root / "p").mkdir()
    (root / "p" / "memory.md").symlink_to(outside / "secret.txt")
    config = CortexConfig(root=root, persona="p", max_bytes=10)
    calls: list[Call] = [*all_tools()]
    for name in BAD_NAMES:
        calls += all_tools(name)
    calls += [
        ("write_file", {"filename": "soul.md", "content": "x" * 11}),
        ("write_file", {"filename": "soul.md", "content": "\ud800"}),
    ]
    before = snapshot(tmp_path)
    records = await run_calls(calls, config, concurrency=len(calls))
    assert all(r.is_error for r in records)
    assert snapshot(tmp_path) == before
