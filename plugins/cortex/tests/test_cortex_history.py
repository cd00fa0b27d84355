from __future__ import annotations

from pathlib import Path

import pytest
from _support import history_texts, run_calls

from agentloop_cortex import CortexConfig, CortexStore


@pytest.mark.parametrize("limit", [1, 3, 20])
async def test_history_is_bounded(tmp_path: Path, limit: int) -> None:
    config = CortexConfig(root=tmp_path, persona="p", history=limit)
    total = limit + 5
    for i in range(total):
        records = await run_calls(
            [("write_file", {"filename": "soul.md", "content": f"soul v{i}\n"})], config
        )
        assert not records[0].is_error
    directory = tmp_path / "p"
    assert (directory / "soul.md").read_text() == f"soul v{total - 1}\n"
    # Only the `limit` most recent previous versions remain, oldest first.
    expected = [f"soul v{i}\n" for i in range(total - 1 - limit, total - 1)]
    assert history_texts(directory, "soul.md") == expected
    store = CortexStore(config)
    assert [p.read_text() for p in store.versions("soul.md")] == expected
    assert store.versions("memory.md") == []


def test_history_names_and_zero(tmp_path: Path) -> None:
    store = CortexStore(CortexConfig(root=tmp_path, persona="p", history=5))
    for i in range(4):
        store.append("memory.md", f"{i}")
    names = [p.name for p in store.versions("memory.md")]
    assert len(names) == 3
    keys = [tuple(int(n) for n in name.removesuffix(".md").split("-")) for name in names]
    assert keys == sorted(keys) and len(set(keys)) == 3
    assert [p.read_text() for p in store.versions("memory.md")] == ["0", "01", "012"]

    none = CortexStore(CortexConfig(root=tmp_path, persona="q", history=0))
    change = none.write("memory.md", "a")
    change = none.write("memory.md", "b")
    assert not change.kept_version
    assert not (tmp_path / "q" / ".history").exists()
    assert none.read("memory.md") == "b"


def test_missing_files_read_empty(tmp_path: Path) -> None:
    store = CortexStore(CortexConfig(root=tmp_path / "not" / "yet", persona="p"))
    assert store.read("relationship.md") == ""
    assert store.versions("relationship.md") == []
    assert not (tmp_path / "not").exists()
    store.write("relationship.md", "")
    assert store.read("relationship.md") == ""
    assert (tmp_path / "not" / "yet" / "p" / "relationship.md").stat().st_mode & 0o777 == 0o600
