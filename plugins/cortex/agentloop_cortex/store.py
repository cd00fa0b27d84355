"""The storage of cortex files: atomic, serialised, versioned, and confined to one directory.

Layout under `root`::

    <persona>/memory.md                       the current versions
    <persona>/.memory.md.lock                 flock()ed while a change is made
    <persona>/.memory.md.applied              the keyed changes made (see `ledger`)
    <persona>/.history/memory.md/<ns>-<n>.md  previous versions, oldest deleted first

Every change takes a per-file `threading.Lock` (tool calls run in worker threads) and an
exclusive `fcntl.flock` on the file's lock file (other processes). It then writes the
new content to a temporary file beside the old one and the old content to a temporary
file in `.history`, fsyncs both, renames the old content into the history and only then
renames the new content over the file (see `_commit`). Readers therefore see the old or
the new content, never a mix; a crash leaves one of them; and a change refused for an
error of the file system (a full disk) leaves the file and its history as they were.

A change made with a `key` (the tools pass `RunContext.idempotency_key`) happens once:
made again with the same key, by a retried or resumed run, it changes nothing and
reports what it did the first time, even when the first writer died mid-change
(`ledger` explains how).

Every path is opened relative to a directory descriptor with `O_NOFOLLOW`, so a symbolic
link planted as the persona directory, a file, `.history` or a lock file is refused
rather than followed. Every `OSError` becomes a `ToolError`, and every descriptor opened
is closed whatever happens. POSIX only (it needs `fcntl` and `dir_fd` support).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

from agentloop import ToolError

from .config import CortexConfig, config_problem
from .files import (
    O_CLOEXEC,
    TMP_PREFIX,
    check_entry,
    hard_link_message,
    history_entries,
    next_version,
    open_dir,
    reason,
    remove,
    sweep,
    symlink_message,
    trim,
    write_temp,
)
from .ledger import Entry, Ledger, digest

__all__ = ("FILENAMES", "HISTORY_DIR", "LOCK_TIMEOUT", "Change", "CortexFile", "CortexStore")

CortexFile = Literal["memory.md", "soul.md", "relationship.md"]
"""The files a persona has; nothing else can be read or written."""

FILENAMES: Final[tuple[str, ...]] = get_args(CortexFile)
"""The allow-list of file names, in the order of `CortexFile`."""

HISTORY_DIR: Final = ".history"
"""Directory (inside the persona directory) holding previous versions, one subdir per file."""

LOCK_TIMEOUT: Final = 20.0
"""Seconds a change waits for another writer of the same file before giving up."""

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    """The process-wide lock serialising changes of the file `key` (a resolved path)."""
    with _thread_locks_guard:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.Lock()
        return lock


@dataclass(frozen=True)
class Change:
    """What a write, append or replace did."""

    filename: str
    size: int
    """Size of the new content in bytes."""
    previous_size: int | None
    """Size of the replaced content in bytes, or None if the file did not exist."""
    kept_version: bool
    """Whether the previous content was kept in the history."""


class CortexStore:
    """The cortex files of one persona, as configured by a `CortexConfig`.

    Methods raise `ToolError` (with a message meant for the model) for anything they
    refuse, including errors of the file system; a refused change leaves the file and its
    history as they were.
    """

    def __init__(self, config: CortexConfig) -> None:
        """Open (lazily: nothing is touched yet) the store `config` describes.

        Raises:
            ToolError: the configuration is invalid.
        """
        problem = config_problem(config)
        if problem is not None:
            raise ToolError(f"cortex is misconfigured: {problem}")
        self.config = config
        try:
            real_root = os.path.realpath(config.root)
        except OSError as exc:
            raise ToolError(f"cannot resolve the cortex root: {reason(exc)}") from None
        self.root = Path(real_root)
        """The resolved root directory."""
        self.directory = self.root / config.persona
        """The persona directory."""

    # ------------------------------------------------------------------ public API

    def path(self, filename: str) -> Path:
        """Where `filename` lives (after checking it is an allowed name)."""
        return self.directory / self._name(filename)

    def read(self, filename: str) -> str:
        """The text of `filename`; "" when it does not exist yet.

        Bytes that are not valid UTF-8 (only possible if the file was edited by hand)
        read as U+FFFD.
        """
        name = self._name(filename)
        with self._os_errors("read", name):
            pfd = self._open_persona(create=False)
            if pfd is None:
                return ""
            try:
                data = self._read_bytes(pfd, name)
            finally:
                os.close(pfd)
        return "" if data is None else data.decode("utf-8", errors="replace")

    def write(self, filename: str, content: str, *, key: str | None = None) -> Change:
        """Replace the whole of `filename` with `content`.

        A change made with a `key` happens once: made again with the same key it changes
        nothing and returns the first time's `Change` (so for `append` and `replace`).
        """
        name = self._name(filename)
        data = self._encode(content, "content")
        self._check_size(name, len(data))
        return self._change(name, lambda old: data, key)

    def append(self, filename: str, content: str, *, key: str | None = None) -> Change:
        """Add `content` at the end of `filename` (creating it if needed), as given."""
        name = self._name(filename)
        data = self._encode(content, "content")
        self._check_size(name, len(data))
        return self._change(name, lambda old: (old or b"") + data, key)

    def replace(self, filename: str, old: str, new: str, *, key: str | None = None) -> Change:
        """Replace the one occurrence of `old` in `filename` with `new`."""
        name = self._name(filename)
        self._encode(old, "old")
        self._encode(new, "new")
        if old == "":
            raise ToolError("old must not be empty: give the exact text to replace")

        def edit(current: bytes | None) -> bytes:
            try:
                text = (current or b"").decode("utf-8")
            except UnicodeDecodeError:
                raise ToolError(
                    f"{name} is not valid UTF-8, so text in it cannot be replaced; "
                    "rewrite it with write_file"
                ) from None
            count = text.count(old)
            if count != 1:
                hint = (
                    "read the file and copy the text exactly"
                    if count == 0
                    else "include more surrounding text so that it occurs exactly once"
                )
                raise ToolError(
                    f"old must occur exactly once in {name}, but it occurs {count} times: {hint}"
                )
            return text.replace(old, new, 1).encode("utf-8")

        return self._change(name, edit, key)

    def versions(self, filename: str) -> list[Path]:
        """The kept previous versions of `filename`, oldest first."""
        name = self._name(filename)
        with self._os_errors("list the versions of", name), ExitStack() as fds:
            pfd = self._open_persona(create=False)
            if pfd is None:
                return []
            fds.callback(os.close, pfd)
            hfd = open_dir(pfd, HISTORY_DIR, create=False, label=self._label(HISTORY_DIR))
            if hfd is None:
                return []
            fds.callback(os.close, hfd)
            label = self._label(f"{HISTORY_DIR}/{name}")
            sfd = open_dir(hfd, name, create=False, label=label)
            if sfd is None:
                return []
            fds.callback(os.close, sfd)
            entries = history_entries(sfd)
        return [self.directory / HISTORY_DIR / name / entry for _, _, entry in entries]

    # ------------------------------------------------------------------ checks

    def _name(self, filename: object) -> str:
        """`filename` if this store may read and write it (the three cortex files)."""
        return _check_name(filename)

    def _label(self, relative: str) -> str:
        """A path as error messages show it: relative to the root."""
        return f"{self.config.persona}/{relative}"

    @contextmanager
    def _os_errors(self, action: str, name: str) -> Iterator[None]:
        """Turn an `OSError` escaping from the block into a `ToolError` saying what failed."""
        try:
            yield
        except OSError as exc:
            raise ToolError(f"cannot {action} {self._label(name)}: {reason(exc)}") from None

    def _encode(self, text: object, what: str) -> bytes:
        if not isinstance(text, str):
            raise ToolError(f"{what} must be text (a string), not {type(text).__name__}")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolError(
                f"{what} is not valid Unicode text: it holds an unpaired surrogate "
                f"(U+{ord(text[exc.start]):04X}) at index {exc.start}, which cannot be "
                "stored as UTF-8; remove it and try again"
            ) from None

    def _check_size(self, name: str, size: int) -> None:
        limit = self.config.max_bytes
        if size > limit:
            raise ToolError(
                f"{name} would be {size} bytes, over the limit of {limit} bytes: "
                "make it shorter (summarise or drop what matters least)"
            )

    def _refuse_planted(self, pfd: int, name: str) -> None:
        """Refuse symlinks (or other odd entries) where cortex keeps its own files."""
        expected: tuple[tuple[str, Literal["file", "dir"]], ...] = (
            (name, "file"),
            (f".{name}.lock", "file"),
            (f".{name}.applied", "file"),
            (HISTORY_DIR, "dir"),
        )
        for entry, want in expected:
            check_entry(pfd, entry, want, self._label(entry))
        hfd = open_dir(pfd, HISTORY_DIR, create=False, label=self._label(HISTORY_DIR))
        if hfd is not None:
            try:
                check_entry(hfd, name, "dir", self._label(f"{HISTORY_DIR}/{name}"))
            finally:
                os.close(hfd)

    # ------------------------------------------------------------------ file system

    def _open_persona(self, *, create: bool) -> int | None:
        """A descriptor of the persona directory, or None if it is missing (and not created)."""
        try:
            rfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
                rfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
            except OSError as exc:
                raise ToolError(f"cannot create the cortex root directory: {reason(exc)}") from None
        except OSError as exc:
            raise ToolError(f"cannot open the cortex root directory: {reason(exc)}") from None
        try:
            pfd = open_dir(rfd, self.config.persona, create=create, label=self.config.persona)
        finally:
            os.close(rfd)
        if pfd is None:
            return None
        try:
            self._check_confined()
        except BaseException:
            os.close(pfd)
            raise
        return pfd

    def _check_confined(self) -> None:
        """Refuse a persona directory whose path resolves outside the root.

        The path can change under our feet (a symlink swapped in and out), so resolving
        it may fail too; that is a refusal like any other.
        """
        try:
            real = os.path.realpath(self.directory)
        except OSError as exc:
            raise ToolError(
                f"cannot resolve persona directory {self.config.persona!r}: {reason(exc)}"
            ) from None
        root = str(self.root)
        if real == root or os.path.commonpath([real, root]) != root:
            raise ToolError(
                f"refusing to use persona directory {self.config.persona!r}: "
                "it resolves outside the cortex root"
            )

    def _read_bytes(self, pfd: int, name: str) -> bytes | None:
        """The content of `name` in the persona directory, or None if it does not exist."""
        label = self._label(name)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC, dir_fd=pfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(symlink_message(label)) from None
            raise ToolError(f"cannot open {label}: {reason(exc)}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"refusing to use {label}: it is not a regular file")
            if info.st_nlink > 1:
                raise ToolError(hard_link_message(label, info.st_nlink))
            chunks: list[bytes] = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _change(
        self, name: str, compute: Callable[[bytes | None], bytes], key: str | None = None
    ) -> Change:
        """Replace `name` with `compute(current content)`, keeping the current one.

        With a `key`, a change already made under it is not made again (see `ledger`).
        """

        def checked(old: bytes | None) -> bytes:
            data = compute(old)
            self._check_size(name, len(data))
            return data

        with self._os_errors("write", name), ExitStack() as held:
            pfd = self._open_persona(create=False)
            if pfd is None:
                checked(None)  # refuse bad input before creating anything
                pfd = self._open_persona(create=True)
                assert pfd is not None
            held.callback(os.close, pfd)
            self._refuse_planted(pfd, name)
            held.enter_context(self._locked(pfd, name))
            self._refuse_planted(pfd, name)
            ledger_name = f".{name}.applied"
            sweep(pfd, f".{name}{TMP_PREFIX}")
            sweep(pfd, f".{ledger_name}{TMP_PREFIX}")
            old = self._read_bytes(pfd, name)
            ledger = Ledger.parse(self._read_bytes(pfd, ledger_name))
            settled = ledger.settle(old)
            made = ledger.find(key) if key is not None else None
            if made is not None:
                if settled:
                    self._replace_file(pfd, ledger_name, ledger.dump())
                return Change(name, made.size, made.previous_size, made.kept_version)
            data = checked(old)
            kept = old is not None and self.config.history > 0
            change = Change(name, len(data), None if old is None else len(old), kept)
            if key is not None:
                ledger.add(Entry(key, digest(data), change.size, change.previous_size, kept))
            if key is not None or settled:
                self._replace_file(pfd, ledger_name, ledger.dump())
            self._commit(pfd, name, data, old if kept else None)
        return change

    def _replace_file(self, pfd: int, name: str, data: bytes) -> None:
        """Make `name` hold `data` at once: a temporary file, fsynced, renamed over it."""
        tmp = write_temp(pfd, f".{name}{TMP_PREFIX}", data)
        try:
            os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            remove(pfd, tmp)
            raise

    def _commit(self, pfd: int, name: str, data: bytes | None, previous: bytes | None) -> None:
        """Make `name` hold `data`, first adding `previous` (unless None) to its history.

        With `data` None the file is deleted instead, its content kept the same way.

        Everything that needs space comes before the rename that makes the change: the new
        content and the previous version are written to temporary files and fsynced, the
        version is renamed into the history, whose directory is fsynced, and only then is
        the new content renamed over `name`. A failure at any of these steps undoes the
        steps before it (temporary files, the new version, history directories made for
        it), so the file and its history are left as they were. After the rename, the
        versions beyond the limit are deleted: a crash just before that leaves one too
        many, which the next change deletes.
        """
        label = self._label(name)
        sfd: int | None = None
        try:
            with ExitStack() as fds, ExitStack() as undo:
                tmp = None if data is None else write_temp(pfd, f".{name}{TMP_PREFIX}", data)
                if tmp is not None:
                    undo.callback(remove, pfd, tmp)
                if previous is not None:
                    history_label = self._label(HISTORY_DIR)
                    hfd = open_dir(pfd, HISTORY_DIR, create=True, label=history_label, undo=undo)
                    assert hfd is not None
                    fds.callback(os.close, hfd)
                    sub_label = self._label(f"{HISTORY_DIR}/{name}")
                    sfd = open_dir(hfd, name, create=True, label=sub_label, undo=undo)
                    assert sfd is not None
                    fds.callback(os.close, sfd)
                    sweep(sfd, TMP_PREFIX)
                    version_tmp = write_temp(sfd, TMP_PREFIX, previous)
                    undo.callback(remove, sfd, version_tmp)
                    entry = next_version(history_entries(sfd))
                    os.rename(version_tmp, entry, src_dir_fd=sfd, dst_dir_fd=sfd)
                    undo.callback(remove, sfd, entry)
                    os.fsync(sfd)
                if tmp is None:
                    os.unlink(name, dir_fd=pfd)
                else:
                    os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
                # The change is made: nothing may undo it now.
                undo.pop_all()
                # Best effort from here on. The new content is already fsynced; should the
                # rename not reach the disk, a crash brings back the old file, still whole.
                with suppress(OSError):
                    os.fsync(pfd)
                if sfd is not None:
                    with suppress(OSError):
                        trim(sfd, self.config.history)
        except OSError as exc:
            raise ToolError(f"cannot write {label}: {reason(exc)}; nothing was changed") from None

    @contextmanager
    def _locked(self, pfd: int, name: str) -> Iterator[None]:
        """Hold the thread lock and the flock of `name` for one change."""
        deadline = time.monotonic() + LOCK_TIMEOUT
        busy = f"{name} is busy: another change to it did not finish in time; try again"
        lock = _thread_lock(str(self.directory / name))
        if not lock.acquire(timeout=LOCK_TIMEOUT):
            raise ToolError(busy)
        try:
            label = self._label(f".{name}.lock")
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | O_CLOEXEC
                fd = os.open(f".{name}.lock", flags, 0o600, dir_fd=pfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ToolError(symlink_message(label)) from None
                raise ToolError(f"cannot open {label}: {reason(exc)}") from None
            try:
                delay = 0.001
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise ToolError(busy) from None
                        time.sleep(delay)
                        delay = min(delay * 2, 0.02)
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        finally:
            lock.release()


# ---------------------------------------------------------------------- helpers


def _check_name(filename: object) -> str:
    """`filename` if it is on the allow-list; anything else is refused."""
    if isinstance(filename, str) and filename in FILENAMES:
        return filename
    allowed = ", ".join(FILENAMES)
    raise ToolError(f"invalid filename {filename!r}: it must be one of {allowed}")
