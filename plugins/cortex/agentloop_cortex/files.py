"""The file-system steps of a cortex change, each on a directory descriptor.

Every path is opened relative to a directory descriptor with `O_NOFOLLOW`: a symbolic
link planted where a directory or a file is expected is refused, never followed.
`CortexStore` (in `store`) composes these steps into atomic, versioned changes.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import time
from contextlib import ExitStack, suppress
from typing import Literal

from agentloop import ToolError

__all__ = (
    "HISTORY_NAME",
    "O_CLOEXEC",
    "O_DIR",
    "TMP_PREFIX",
    "check_entry",
    "hard_link_message",
    "history_entries",
    "next_version",
    "open_dir",
    "reason",
    "remove",
    "sweep",
    "symlink_message",
    "trim",
    "write_temp",
)

HISTORY_NAME = re.compile(r"([0-9]+)-([0-9]+)\.md")
TMP_PREFIX = ".tmp-"
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC


def symlink_message(label: str) -> str:
    """Why a symbolic link where `label` should be is refused."""
    return (
        f"refusing to use {label}: it is a symbolic link; cortex only uses real files and "
        "directories inside the persona directory"
    )


def hard_link_message(label: str, links: int) -> str:
    """Why a file with more than one hard link is refused."""
    return (
        f"refusing to use {label}: it has {links} hard links, so it may be a file outside "
        "the persona directory"
    )


def check_entry(dfd: int, entry: str, want: Literal["file", "dir"], label: str) -> None:
    """Refuse `entry` of directory `dfd` if it exists and is a symlink or of the wrong kind."""
    try:
        info = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise ToolError(symlink_message(label))
    ok = stat.S_ISREG(info.st_mode) if want == "file" else stat.S_ISDIR(info.st_mode)
    if not ok:
        kind = "regular file" if want == "file" else "directory"
        raise ToolError(f"refusing to use {label}: it is not a {kind}")
    if want == "file" and info.st_nlink > 1:
        raise ToolError(hard_link_message(label, info.st_nlink))


def reason(exc: OSError) -> str:
    """What went wrong, as the operating system says it."""
    return exc.strerror or str(exc)


def remove(dfd: int, entry: str, *, directory: bool = False) -> None:
    """Delete `entry` of `dfd` (undoing a step of a change); it may be gone already."""
    with suppress(OSError):
        if directory:
            os.rmdir(entry, dir_fd=dfd)
        else:
            os.unlink(entry, dir_fd=dfd)


def open_dir(
    parent: int, name: str, *, create: bool, label: str, undo: ExitStack | None = None
) -> int | None:
    """A descriptor of directory `name` in `parent`, never following a symlink.

    Returns None when it does not exist and `create` is false. When it makes the
    directory, it registers its removal with `undo` (if given).
    """
    check_entry(parent, name, "dir", label)
    try:
        return os.open(name, O_DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ToolError(symlink_message(label)) from None
        raise ToolError(f"cannot open {label}: {reason(exc)}") from None
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ToolError(f"cannot create {label}: {reason(exc)}") from None
    else:
        if undo is not None:
            undo.callback(remove, parent, name, directory=True)
        try:
            os.fsync(parent)
        except OSError as exc:
            raise ToolError(f"cannot create {label}: {reason(exc)}") from None
    try:
        return os.open(name, O_DIR, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ToolError(symlink_message(label)) from None
        raise ToolError(f"cannot open {label}: {reason(exc)}") from None


def write_temp(dfd: int, prefix: str, data: bytes) -> str:
    """A new file in `dfd` holding `data`, fsynced; its name starts with `prefix`.

    On failure nothing is left behind.
    """
    tmp = f"{prefix}{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        remove(dfd, tmp)
        raise
    return tmp


def next_version(entries: list[tuple[int, int, str]]) -> str:
    """The name of a new version, after every one in `entries`."""
    stamp, counter = time.time_ns(), 0
    if entries and (stamp, counter) <= entries[-1][:2]:
        # The clock did not move (or went back): keep the names in order anyway.
        stamp, counter = entries[-1][0], entries[-1][1] + 1
    return f"{stamp}-{counter}.md"


def trim(dfd: int, limit: int) -> None:
    """Delete the oldest versions in history directory `dfd` beyond `limit`."""
    entries = history_entries(dfd)
    for _, _, entry in entries[: max(len(entries) - limit, 0)]:
        with suppress(FileNotFoundError):
            os.unlink(entry, dir_fd=dfd)
    os.fsync(dfd)


def sweep(dfd: int, prefix: str) -> None:
    """Delete temporary files left by a writer that died (only called under the lock).

    Housekeeping only: whatever cannot be deleted stays, and the change goes on.
    """
    with suppress(OSError):
        for entry in os.listdir(dfd):
            if entry.startswith(prefix):
                remove(dfd, entry)


def history_entries(dfd: int) -> list[tuple[int, int, str]]:
    """The version files in a history directory as (stamp, counter, name), oldest first."""
    entries = []
    for entry in os.listdir(dfd):
        match = HISTORY_NAME.fullmatch(entry)
        if match is not None:
            entries.append((int(match[1]), int(match[2]), entry))
    entries.sort()
    return entries
