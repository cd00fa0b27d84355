"""Hostile conditions for the store: a full disk, wrong input types, paths swapped mid-call."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from _support import history_texts, run_calls, snapshot, temp_files
from agentloop import RunContext, ToolError

from agentloop_cortex import CortexConfig, CortexStore, append_file, replace_in_file, write_file

STORE_MODULES = {"agentloop_cortex.store", "agentloop_cortex.files"}  # the store and its steps
NO_SPACE = "No space left on device"


def version(n: int) -> str:
    """Content v`n`: 8 KiB, so that each version takes the same number of pages."""
    return f"v{n}\n".ljust(8192, ".")


def state(directory: Path) -> dict[str, object]:
    """What a change may alter: every file's content, every directory, each history in order.

    Lock files are left out: a change creates its file's lock file before anything else,
    and never deletes it (another process may be waiting on it).
    """
    files: dict[str, object] = {}
    for path in sorted(directory.rglob("*")) if directory.exists() else []:
        rel = str(path.relative_to(directory))
        if path.name.endswith(".lock"):
            continue
        if ".history/" in rel and path.is_file():
            continue  # compared by content and order below; names hold timestamps
        files[rel] = "dir" if path.is_dir() else path.read_bytes()
    histories = {name: history_texts(directory, name) for name in ("memory.md", "soul.md")}
    return {"files": files, "history": histories}


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")


# ---------------------------------------------------------------------- a full disk


class DiskFull:
    """Make the store's own system calls that can need space fail with ENOSPC.

    Counts every such call the store makes (`os.open` with `O_CREAT`, `os.write`,
    `os.fsync`, `os.replace`, `os.rename`, `os.mkdir`, `os.makedirs`) and fails the one
    numbered `at` (from 0), or all of them with `at=None`. Calls from anywhere else pass.
    """

    NAMES = ("open", "write", "fsync", "replace", "rename", "mkdir", "makedirs")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.at: int | None = -1
        self.calls = 0
        self.fired: list[str] = []
        for name in self.NAMES:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def arm(self, at: int | None) -> None:
        self.at, self.calls, self.fired = at, 0, []

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__")
            creates = name != "open" or bool(args[1] & os.O_CREAT)
            if caller in STORE_MODULES and creates and self.at != -1:
                if self.at is None or self.calls == self.at:
                    self.calls += 1
                    self.fired.append(name)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.calls += 1
            return real(*args, **kwargs)

        return call


Operation = Callable[[CortexStore], object]

OPERATIONS: dict[str, tuple[Operation, Callable[[str], str]]] = {
    # name: (the change, what the file holds after it given what it held before)
    "write": (lambda s: s.write("memory.md", version(9)), lambda old: version(9)),
    "append": (lambda s: s.append("memory.md", "+tail"), lambda old: old + "+tail"),
    "replace": (
        lambda s: s.replace("memory.md", "\n", "\nnew\n"),
        lambda old: old.replace("\n", "\nnew\n", 1),
    ),
}

SITUATIONS = {
    # name: (history limit, versions written before the change)
    "first": (3, 0),
    "second": (3, 1),
    "history full": (3, 4),
    "no history": (0, 2),
}


def setup(root: Path, limit: int, writes: int) -> CortexStore:
    store = CortexStore(CortexConfig(root=root, persona="p", history=limit))
    (root / "p").mkdir(parents=True)
    (root / "p" / "soul.md").write_text("soul\n")  # the persona already exists
    for n in range(1, writes + 1):
        store.write("memory.md", version(n))
    return store


@pytest.mark.parametrize(
    ("operation", "situation"),
    [
        pytest.param(operation, situation, id=f"{operation}-{situation}")
        for operation in OPERATIONS
        for situation in SITUATIONS
        # There is nothing to replace in a file never written.
        if not (operation == "replace" and SITUATIONS[situation][1] == 0)
    ],
)
def test_disk_full_at_each_step_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str, situation: str
) -> None:
    """ENOSPC at each space-needing step of a change in turn: refused and nothing changed,
    or (past the point where the change is made) the whole change done."""
    change, result = OPERATIONS[operation]
    limit, writes = SITUATIONS[situation]
    disk = DiskFull(monkeypatch)

    # The same change without faults says what "done" looks like.
    control = setup(tmp_path / "control", limit, writes)
    change(control)
    done = state(tmp_path / "control" / "p")
    old = version(writes) if writes else ""
    assert control.read("memory.md") == result(old)

    refused: list[str] = []
    at = 0
    while True:
        root = tmp_path / f"at-{at}"
        store = setup(root, limit, writes)
        directory = root / "p"
        before = state(directory)
        disk.arm(at)
        try:
            change(store)
        except ToolError as exc:
            fired = disk.fired
            disk.arm(-1)
            assert fired, exc.message
            assert NO_SPACE in exc.message
            assert state(directory) == before, f"ENOSPC at {fired} changed something"
            refused.append(fired[0])
        else:
            fired = disk.fired
            disk.arm(-1)
            assert state(directory) == done, f"ENOSPC at {fired}: a partial change"
        finally:
            disk.arm(-1)
        assert temp_files(directory) == []
        if not fired:
            break  # `at` is past the last step: every step has had its turn
        at += 1
    # The refusals covered creating, writing and syncing the new content, at least.
    assert {"open", "write", "fsync"} <= set(refused), refused
    if writes and limit:
        # ... and keeping the previous version, which takes a second file.
        assert refused.count("open") >= 2, refused


def test_disk_full_keeps_every_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The case as found: history=3, v1-v4 written, then three writes refused for space."""
    store = setup(tmp_path, 3, 4)
    directory = tmp_path / "p"
    disk = DiskFull(monkeypatch)
    disk.arm(None)
    for n in (5, 6, 7):
        with pytest.raises(ToolError, match=NO_SPACE):
            store.write("memory.md", version(n))
        with pytest.raises(ToolError, match=NO_SPACE):
            store.append("memory.md", "more")
    disk.arm(-1)
    assert store.read("memory.md") == version(4)
    assert history_texts(directory) == [version(1), version(2), version(3)]
    assert temp_files(directory) == []
    store.write("memory.md", version(5))
    assert history_texts(directory) == [version(2), version(3), version(4)]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB tmpfs, mounted for the test (needs root and mount permission)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("mount/umount are not installed")
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    options = "size=512k,mode=0700"
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def fill(path: Path) -> None:
    """Write to `path` until the file system holds not one more byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            with pytest.raises(OSError) as info:
                while True:
                    os.write(fd, b"\0" * size)
            assert info.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_real_full_disk_keeps_every_version(small_disk: Path) -> None:
    store = setup(small_disk, 3, 4)
    store.write("soul.md", "soul\n")  # so that soul.md has a history directory too
    directory = small_disk / "p"
    fill(small_disk / "filler")
    with pytest.raises(OSError) as info:  # the disk is full indeed
        (small_disk / "probe").write_bytes(b"x")
    assert info.value.errno == errno.ENOSPC
    (small_disk / "probe").unlink()
    before = state(directory)
    for n in (5, 6, 7):
        with pytest.raises(ToolError, match=NO_SPACE):
            store.write("memory.md", version(n))
        with pytest.raises(ToolError, match=NO_SPACE):
            store.append("memory.md", "more")
        with pytest.raises(ToolError, match=NO_SPACE):
            store.replace("memory.md", "v4", "v-four")
        with pytest.raises(ToolError, match=NO_SPACE):
            store.write("relationship.md", "first words")  # a file never written
        assert state(directory) == before
        assert temp_files(directory) == []
    assert store.read("memory.md") == version(4)
    assert [p.read_text() for p in store.versions("memory.md")] == [
        version(1),
        version(2),
        version(3),
    ]
    assert not (directory / "relationship.md").exists()

    (small_disk / "filler").unlink()
    store.write("memory.md", version(5))
    assert history_texts(directory) == [version(2), version(3), version(4)]
    store.write("relationship.md", "first words")
    assert store.read("relationship.md") == "first words"


# ---------------------------------------------------------------------- input of the wrong type

NOT_TEXT = [b"bytes", None, 5, 1.5, ["a"], {"a": 1}]


@pytest.mark.parametrize("value", NOT_TEXT, ids=lambda v: type(v).__name__)
def test_content_that_is_not_text_via_store(tmp_path: Path, value: Any) -> None:
    store = CortexStore(CortexConfig(root=tmp_path, persona="p"))
    store.write("memory.md", "some text\n")
    before = snapshot(tmp_path)
    kind = type(value).__name__
    with pytest.raises(ToolError, match=f"^content must be text \\(a string\\), not {kind}$"):
        store.write("memory.md", value)
    with pytest.raises(ToolError, match=f"^content must be text \\(a string\\), not {kind}$"):
        store.append("memory.md", value)
    with pytest.raises(ToolError, match=f"^old must be text \\(a string\\), not {kind}$"):
        store.replace("memory.md", value, "x")
    with pytest.raises(ToolError, match=f"^new must be text \\(a string\\), not {kind}$"):
        store.replace("memory.md", "some", value)
    assert snapshot(tmp_path) == before
    # Not even a directory is made when the first call is refused.
    fresh = CortexStore(CortexConfig(root=tmp_path / "fresh", persona="p"))
    with pytest.raises(ToolError, match="content must be text"):
        fresh.write("memory.md", value)
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("value", NOT_TEXT, ids=lambda v: type(v).__name__)
def test_content_that_is_not_text_via_tools(tmp_path: Path, value: Any) -> None:
    """Tools called as plain functions (as code may) refuse it the same way."""
    config = CortexConfig(root=tmp_path, persona="p")
    ctx: RunContext[Any] = RunContext("run", 1, "toolu_1", "write_file", config)
    before = snapshot(tmp_path)
    with pytest.raises(ToolError, match="content must be text"):
        write_file("memory.md", value, ctx)
    with pytest.raises(ToolError, match="content must be text"):
        append_file("memory.md", value, ctx)
    with pytest.raises(ToolError, match="new must be text"):
        replace_in_file("memory.md", "a", value, ctx)
    assert snapshot(tmp_path) == before


async def test_content_that_is_not_text_from_the_model(tmp_path: Path) -> None:
    config = CortexConfig(root=tmp_path, persona="p")
    calls = [
        ("write_file", {"filename": "memory.md", "content": value})
        for value in [5, None, ["a"], {"a": 1}, 1.5, True]
    ]
    calls += [("append_file", {"filename": "memory.md", "content": 7})]
    calls += [("replace_in_file", {"filename": "memory.md", "old": "a", "new": None})]
    records = await run_calls(calls, config)
    for record in records:
        assert record.is_error
        assert "Input should be a valid string" in record.output, record.output
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("text", ["\ud800", "before \udfff after", "\ud83d"])
def test_lone_surrogate_via_store(tmp_path: Path, text: str) -> None:
    store = CortexStore(CortexConfig(root=tmp_path, persona="p"))
    with pytest.raises(ToolError, match="unpaired surrogate"):
        store.write("memory.md", text)
    assert not (tmp_path / "p").exists()
    store.write("memory.md", "a b\n")
    before = snapshot(tmp_path)
    with pytest.raises(ToolError, match=r"content is not valid Unicode text.*unpaired surrogate"):
        store.append("memory.md", text)
    with pytest.raises(ToolError, match=r"old is not valid Unicode text"):
        store.replace("memory.md", text, "x")
    with pytest.raises(ToolError, match=r"new is not valid Unicode text"):
        store.replace("memory.md", "a", text)
    assert snapshot(tmp_path) == before
    assert store.read("memory.md") == "a b\n"


# ---------------------------------------------------------------------- paths swapped mid-call


def every_call(store: CortexStore) -> list[Callable[[], object]]:
    return [
        lambda: store.read("memory.md"),
        lambda: store.write("memory.md", "new"),
        lambda: store.append("memory.md", "more"),
        lambda: store.replace("memory.md", "old", "new"),
        lambda: store.versions("memory.md"),
    ]


@needs_proc
def test_resolving_fails_mid_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`os.path.realpath` raising (as in a symlink-swap race): a ToolError, no fd leaked."""
    config = CortexConfig(root=tmp_path, persona="p")
    store = CortexStore(config)
    store.write("memory.md", "old\n")
    before = snapshot(tmp_path)

    def realpath(path: Any, *args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))

    monkeypatch.setattr(os.path, "realpath", realpath)
    fds = fd_count()
    for _ in range(20):
        for call in every_call(store):
            with pytest.raises(ToolError, match="Invalid argument"):
                call()
    with pytest.raises(ToolError, match=r"cannot resolve the cortex root.*Invalid argument"):
        CortexStore(config)
    assert fd_count() == fds
    assert snapshot(tmp_path) == before


@needs_proc
def test_os_errors_in_path_handling_are_tool_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever of the store's file-system calls fails, the caller gets a ToolError."""
    store = CortexStore(CortexConfig(root=tmp_path, persona="p"))
    store.write("memory.md", "old\n")
    store.write("memory.md", "old\n")
    fds = fd_count()
    for name in ("stat", "listdir", "fstat", "read", "open"):
        real = getattr(os, name)

        def failing(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__") in STORE_MODULES:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return _real(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(os, name, failing)
            for call in every_call(store):
                try:
                    call()
                except ToolError as exc:
                    assert "Input/output error" in exc.message
    assert fd_count() == fds
    assert store.read("memory.md") == "old\n"


@needs_proc
def test_symlink_swap_race(tmp_path: Path) -> None:
    """A thread keeps swapping the persona directory for a symlink to elsewhere for 2 s
    while the store works: every refusal is a ToolError, nothing outside is touched, no fd
    leaks."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "memory.md").write_text("old outside\n")
    store = CortexStore(CortexConfig(root=root, persona="p", history=3))
    store.write("memory.md", "old inside\n")
    persona, home = root / "p", root / "home"
    outside_before = snapshot(outside)
    stop = threading.Event()
    swaps = [0]

    def swap() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            # The real directory out of the way (or, if the store made a new one while
            # the name was free, that one aside for good), then the symlink in its place.
            try:
                os.rename(persona, home)
            except OSError:
                with suppress(OSError):
                    os.rename(persona, root / f"stray-{n}")
            with suppress(OSError):
                os.symlink(outside, persona, target_is_directory=True)
            # And back.
            with suppress(OSError):
                os.unlink(persona)
            with suppress(OSError):
                os.rename(home, persona)
            swaps[0] += 1

    fds = fd_count()
    swapper = threading.Thread(target=swap)
    outcomes = {"done": 0, "refused": 0}
    swapper.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for call in every_call(store):
                try:
                    call()
                except ToolError:
                    outcomes["refused"] += 1
                else:
                    outcomes["done"] += 1
    finally:
        stop.set()
        swapper.join()
    assert swaps[0] > 0
    assert outcomes["refused"] > 0, outcomes
    assert fd_count() == fds
    assert snapshot(outside) == outside_before
    for entry in root.rglob("*"):  # no symlink made by the store, no temporary file left
        assert entry == persona or not entry.is_symlink(), entry
        assert ".tmp-" not in entry.name, entry


# ---------------------------------------------------------------------- other entry points


@pytest.mark.parametrize("root", [None, 5, b"/tmp/cortex"], ids=lambda v: type(v).__name__)
def test_root_that_is_not_a_path(root: Any) -> None:
    with pytest.raises(ValueError, match="invalid cortex root"):
        CortexConfig(root=root, persona="p")


@pytest.mark.parametrize("ctx", [None, object(), "ctx"], ids=lambda v: type(v).__name__)
def test_tools_called_without_a_run_context(tmp_path: Path, ctx: Any) -> None:
    with pytest.raises(ToolError, match="cortex is not configured for this run"):
        write_file("memory.md", "x", ctx)
    with pytest.raises(ToolError, match="cortex is not configured for this run"):
        append_file("memory.md", "x", ctx)
