from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _child import big
from _support import history_texts, run_calls, temp_files

from agentloop_cortex import CortexConfig, CortexStore

CHILD = str(Path(__file__).with_name("_child.py"))


async def test_fifty_parallel_writes_in_one_turn(tmp_path: Path) -> None:
    config = CortexConfig(root=tmp_path, persona="p", history=100)
    contents = [f"version {i}\n" + "x" * i for i in range(50)]
    calls = await run_calls(
        [("write_file", {"filename": "memory.md", "content": c}) for c in contents],
        config,
        concurrency=50,
    )
    assert [c.is_error for c in calls] == [False] * 50
    # The first write to land found no file, so kept nothing; every other one kept its
    # predecessor.
    kept = [c for c in calls if "previous version" in c.output]
    assert len(kept) == 49
    directory = tmp_path / "p"
    final = (directory / "memory.md").read_text()
    assert final in contents
    history = history_texts(directory)
    assert len(history) == 49
    assert len(set(history)) == 49
    assert set(history) | {final} == set(contents)
    assert temp_files(directory) == []
    assert sorted(p.name for p in directory.iterdir()) == [
        ".history",
        ".memory.md.applied",
        ".memory.md.lock",
        "memory.md",
    ]


def test_two_processes_write_concurrently(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, CHILD, "writes", str(tmp_path), "p", label, "25"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for label in ("left", "right")
    ]
    for proc in procs:  # both are waiting on stdin: release them together
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, errors = proc.communicate(timeout=60)
        assert (proc.returncode, out) == (0, "finished\n"), errors
    contents = {f"{label} write {i}\n" for label in ("left", "right") for i in range(25)}
    directory = tmp_path / "p"
    final = (directory / "memory.md").read_text()
    assert final in contents
    history = history_texts(directory)
    assert len(history) == 49
    assert set(history) | {final} == contents
    assert temp_files(directory) == []
    # Each process's own writes stay in its order within the history.
    for label in ("left", "right"):
        mine = [int(h.split()[-1]) for h in [*history, final] if h.startswith(label)]
        assert mine == list(range(25))


@pytest.mark.parametrize(
    ("stop", "kill_at"),
    [
        ("free", 1),
        ("free", 3),
        ("free", 6),
        ("history", 1),
        ("history", 4),
        ("file", 0),
        ("file", 1),
        ("file", 5),
        ("rename", 0),
        ("rename", 2),
    ],
)
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_sigkill_mid_write_leaves_one_whole_version(
    tmp_path: Path, stop: str, kill_at: int
) -> None:
    contents = {big("A"), big("B")}
    proc = subprocess.Popen(
        [sys.executable, CHILD, "loop", str(tmp_path), "p", stop, str(kill_at)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        # The child prints the number of each write just before starting it; with `stop`
        # it then pauses at that point of write `kill_at` and says so.
        lines = [proc.stdout.readline() for _ in range(kill_at + 1 + (stop != "free"))]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        _, errors = proc.communicate(timeout=30)
    expected = [f"{n}\n" for n in range(kill_at + 1)] + (["stopped"] if stop != "free" else [])
    assert [line[:7] for line in lines] == [e[:7] for e in expected], errors
    assert proc.returncode == -signal.SIGKILL
    directory = tmp_path / "p"
    path = directory / "memory.md"
    current = path.read_text() if path.exists() else None
    history = history_texts(directory)
    # Write k puts version k-1 in the history just before its rename and deletes the
    # oldest beyond 4 just after it, so a kill between the two leaves one more.
    assert len(history) <= 5
    assert all(h in contents for h in history)
    if stop == "free":
        assert current in contents
        # At least the versions before the write that was killed are there (the child
        # may have got further than announced).
        assert min(kill_at - 1, 4) <= len(history)
    else:
        # Killed inside write `kill_at`: the file holds write `kill_at - 1` exactly.
        assert current == (big("AB"[(kill_at - 1) % 2]) if kill_at else None)
        assert temp_files(directory) != []
        # Killed while writing (either temporary file), write `kill_at` has not touched
        # the history yet; killed before its last rename, it has added its version.
        kept = min(kill_at, 5) if stop == "rename" else min(max(kill_at - 1, 0), 4)
        assert len(history) == kept

    # A temporary file the kill left behind is swept by the next change.
    store = CortexStore(CortexConfig(root=tmp_path, persona="p", max_bytes=1 << 20, history=4))
    store.write("memory.md", "after the crash\n")
    assert store.read("memory.md") == "after the crash\n"
    assert temp_files(directory) == []
    assert all(h in contents for h in history_texts(directory))
