"""The storage of cortex files: atomic, serialised, versioned, and confined to one directory.

Layout under `root`::

    <persona>/memory.md                       the current versions
    <persona>/.memory.md.lock                 flock()ed while a change is made
    <persona>/.history/memory.md/<ns>-<n>.md  previous versions, oldest deleted first

Every change takes a per-file `threading.Lock` (tool calls run in worker threads) and an
exclusive `fcntl.flock` on the file's lock file (other processes), keeps the previous
version in `.history`, then writes the new content to a temporary file in the same
directory, fsyncs it, renames it over the old one and fsyncs the directory. Readers
therefore see the old or the new content, never a mix, and a crash leaves one of them.

Every path is opened relative to a directory descriptor with `O_NOFOLLOW`, so a symbolic
link planted as the persona directory, a file, `.history` or a lock file is refused
rather than followed. POSIX only (it needs `fcntl` and `dir_fd` support).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

from agentloop import ToolError

from .config import CortexConfig, config_problem

__all__ = ("FILENAMES", "HISTORY_DIR", "LOCK_TIMEOUT", "Change", "CortexFile", "CortexStore")

CortexFile = Literal["memory.md", "soul.md", "relationship.md"]
"""The files a persona has; nothing else can be read or written."""

FILENAMES: Final[tuple[str, ...]] = get_args(CortexFile)
"""The allow-list of file names, in the order of `CortexFile`."""

HISTORY_DIR: Final = ".history"
"""Directory (inside the persona directory) holding previous versions, one subdir per file."""

LOCK_TIMEOUT: Final = 20.0
"""Seconds a change waits for another writer of the same file before giving up."""

_HISTORY_NAME = re.compile(r"([0-9]+)-([0-9]+)\.md")
_TMP_PREFIX = ".tmp-"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC

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
    refuse; a refused call changes nothing.
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
        self.root = Path(os.path.realpath(config.root))
        """The resolved root directory."""
        self.directory = self.root / config.persona
        """The persona directory."""

    # ------------------------------------------------------------------ public API

    def path(self, filename: str) -> Path:
        """Where `filename` lives (after checking it is an allowed name)."""
        return self.directory / _check_name(filename)

    def read(self, filename: str) -> str:
        """The text of `filename`; "" when it does not exist yet.

        Bytes that are not valid UTF-8 (only possible if the file was edited by hand)
        read as U+FFFD.
        """
        name = _check_name(filename)
        pfd = self._open_persona(create=False)
        if pfd is None:
            return ""
        try:
            data = self._read_bytes(pfd, name)
        finally:
            os.close(pfd)
        return "" if data is None else data.decode("utf-8", errors="replace")

    def write(self, filename: str, content: str) -> Change:
        """Replace the whole of `filename` with `content`."""
        name = _check_name(filename)
        data = self._encode(content, "content")
        self._check_size(name, len(data))
        return self._change(name, lambda old: data)

    def append(self, filename: str, content: str) -> Change:
        """Add `content` at the end of `filename` (creating it if needed), as given."""
        name = _check_name(filename)
        data = self._encode(content, "content")
        self._check_size(name, len(data))
        return self._change(name, lambda old: (old or b"") + data)

    def replace(self, filename: str, old: str, new: str) -> Change:
        """Replace the one occurrence of `old` in `filename` with `new`."""
        name = _check_name(filename)
        if old == "":
            raise ToolError("old must not be empty: give the exact text to replace")
        self._encode(old, "old")
        self._encode(new, "new")

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

        return self._change(name, edit)

    def versions(self, filename: str) -> list[Path]:
        """The kept previous versions of `filename`, oldest first."""
        name = _check_name(filename)
        pfd = self._open_persona(create=False)
        if pfd is None:
            return []
        try:
            hfd = _open_dir(pfd, HISTORY_DIR, create=False, label=self._label(HISTORY_DIR))
            if hfd is None:
                return []
            try:
                label = self._label(f"{HISTORY_DIR}/{name}")
                sfd = _open_dir(hfd, name, create=False, label=label)
                if sfd is None:
                    return []
                try:
                    entries = _history_entries(sfd)
                finally:
                    os.close(sfd)
            finally:
                os.close(hfd)
        finally:
            os.close(pfd)
        return [self.directory / HISTORY_DIR / name / entry for _, _, entry in entries]

    # ------------------------------------------------------------------ checks

    def _label(self, relative: str) -> str:
        """A path as error messages show it: relative to the root."""
        return f"{self.config.persona}/{relative}"

    def _encode(self, text: str, what: str) -> bytes:
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
            (HISTORY_DIR, "dir"),
        )
        for entry, want in expected:
            _check_entry(pfd, entry, want, self._label(entry))
        hfd = _open_dir(pfd, HISTORY_DIR, create=False, label=self._label(HISTORY_DIR))
        if hfd is not None:
            try:
                _check_entry(hfd, name, "dir", self._label(f"{HISTORY_DIR}/{name}"))
            finally:
                os.close(hfd)

    # ------------------------------------------------------------------ file system

    def _open_persona(self, *, create: bool) -> int | None:
        """A descriptor of the persona directory, or None if it is missing (and not created)."""
        try:
            rfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
                rfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
            except OSError as exc:
                raise ToolError(
                    f"cannot create the cortex root directory: {exc.strerror}"
                ) from None
        except OSError as exc:
            raise ToolError(f"cannot open the cortex root directory: {exc.strerror}") from None
        try:
            pfd = _open_dir(rfd, self.config.persona, create=create, label=self.config.persona)
        finally:
            os.close(rfd)
        if pfd is not None:
            real = os.path.realpath(self.directory)
            if os.path.commonpath([real, str(self.root)]) != str(self.root) or real == str(
                self.root
            ):
                os.close(pfd)
                raise ToolError(
                    f"refusing to use persona directory {self.config.persona!r}: "
                    "it resolves outside the cortex root"
                )
        return pfd

    def _read_bytes(self, pfd: int, name: str) -> bytes | None:
        """The content of `name` in the persona directory, or None if it does not exist."""
        label = self._label(name)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=pfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(_symlink_message(label)) from None
            raise ToolError(f"cannot open {label}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"refusing to use {label}: it is not a regular file")
            if info.st_nlink > 1:
                raise ToolError(_hard_link_message(label, info.st_nlink))
            chunks: list[bytes] = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _change(self, name: str, compute: Callable[[bytes | None], bytes]) -> Change:
        """Replace `name` with `compute(current content)`, keeping the current one."""

        def checked(old: bytes | None) -> bytes:
            data = compute(old)
            self._check_size(name, len(data))
            return data

        pfd = self._open_persona(create=False)
        if pfd is None:
            checked(None)  # refuse bad input before creating anything
            pfd = self._open_persona(create=True)
            assert pfd is not None
        try:
            self._refuse_planted(pfd, name)
            with self._locked(pfd, name):
                self._refuse_planted(pfd, name)
                _sweep(pfd, f".{name}{_TMP_PREFIX}")
                old = self._read_bytes(pfd, name)
                data = checked(old)
                kept = False
                if old is not None and self.config.history > 0:
                    self._keep_version(pfd, name, old)
                    kept = True
                _atomic_write(pfd, name, data, f".{name}{_TMP_PREFIX}")
        finally:
            os.close(pfd)
        return Change(name, len(data), None if old is None else len(old), kept)

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
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _O_CLOEXEC
                fd = os.open(f".{name}.lock", flags, 0o600, dir_fd=pfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ToolError(_symlink_message(label)) from None
                raise ToolError(f"cannot open {label}: {exc.strerror}") from None
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

    def _keep_version(self, pfd: int, name: str, data: bytes) -> None:
        """Add `data` to the history of `name`, deleting the oldest beyond the limit."""
        hfd = _open_dir(pfd, HISTORY_DIR, create=True, label=self._label(HISTORY_DIR))
        assert hfd is not None
        try:
            label = self._label(f"{HISTORY_DIR}/{name}")
            sfd = _open_dir(hfd, name, create=True, label=label)
            assert sfd is not None
        finally:
            os.close(hfd)
        try:
            _sweep(sfd, _TMP_PREFIX)
            entries = _history_entries(sfd)
            stamp, counter = time.time_ns(), 0
            if entries and (stamp, counter) <= entries[-1][:2]:
                # The clock did not move (or went back): keep the names in order anyway.
                stamp, counter = entries[-1][0], entries[-1][1] + 1
            # Make room first, so that not even a crash leaves more than `history` versions.
            excess = len(entries) + 1 - self.config.history
            for _, _, old_entry in entries[: max(excess, 0)]:
                with suppress(FileNotFoundError):
                    os.unlink(old_entry, dir_fd=sfd)
            _atomic_write(sfd, f"{stamp}-{counter}.md", data, _TMP_PREFIX)
        finally:
            os.close(sfd)


# ---------------------------------------------------------------------- helpers


def _check_name(filename: object) -> str:
    """`filename` if it is on the allow-list; anything else is refused."""
    if isinstance(filename, str) and filename in FILENAMES:
        return filename
    allowed = ", ".join(FILENAMES)
    raise ToolError(f"invalid filename {filename!r}: it must be one of {allowed}")


def _symlink_message(label: str) -> str:
    return (
        f"refusing to use {label}: it is a symbolic link; cortex only uses real files and "
        "directories inside the persona directory"
    )


def _hard_link_message(label: str, links: int) -> str:
    return (
        f"refusing to use {label}: it has {links} hard links, so it may be a file outside "
        "the persona directory"
    )


def _check_entry(dfd: int, entry: str, want: Literal["file", "dir"], label: str) -> None:
    """Refuse `entry` of directory `dfd` if it exists and is a symlink or of the wrong kind."""
    try:
        info = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise ToolError(_symlink_message(label))
    ok = stat.S_ISREG(info.st_mode) if want == "file" else stat.S_ISDIR(info.st_mode)
    if not ok:
        kind = "regular file" if want == "file" else "directory"
        raise ToolError(f"refusing to use {label}: it is not a {kind}")
    if want == "file" and info.st_nlink > 1:
        raise ToolError(_hard_link_message(label, info.st_nlink))


def _open_dir(parent: int, name: str, *, create: bool, label: str) -> int | None:
    """A descriptor of directory `name` in `parent`, never following a symlink.

    Returns None when it does not exist and `create` is false.
    """
    _check_entry(parent, name, "dir", label)
    try:
        return os.open(name, _O_DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ToolError(_symlink_message(label)) from None
        raise ToolError(f"cannot open {label}: {exc.strerror}") from None
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        os.fsync(parent)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ToolError(f"cannot create {label}: {exc.strerror}") from None
    try:
        return os.open(name, _O_DIR, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ToolError(_symlink_message(label)) from None
        raise ToolError(f"cannot open {label}: {exc.strerror}") from None


def _atomic_write(dfd: int, name: str, data: bytes, tmp_prefix: str) -> None:
    """Make `name` in `dfd` hold `data`, atomically and durably."""
    tmp = f"{tmp_prefix}{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as exc:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        if isinstance(exc, OSError):
            raise ToolError(f"cannot write {name}: {exc.strerror}") from None
        raise
    os.fsync(dfd)


def _sweep(dfd: int, prefix: str) -> None:
    """Delete temporary files left by a writer that died (only called under the lock)."""
    for entry in os.listdir(dfd):
        if entry.startswith(prefix):
            with suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=dfd)


def _history_entries(dfd: int) -> list[tuple[int, int, str]]:
    """The version files in a history directory as (stamp, counter, name), oldest first."""
    entries = []
    for entry in os.listdir(dfd):
        match = _HISTORY_NAME.fullmatch(entry)
        if match is not None:
            entries.append((int(match[1]), int(match[2]), entry))
    entries.sort()
    return entries
