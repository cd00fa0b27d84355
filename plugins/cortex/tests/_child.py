"""Worker process for the multi-process tests (not a test module).

python _child.py writes ROOT PERSONA LABEL COUNT   wait for a line on stdin, then write
python _child.py loop ROOT PERSONA                 alternate two large contents forever
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agentloop_cortex import CortexConfig, CortexStore

SIZE = 200 * 1024


def big(kind: str) -> str:
    """One of the two large contents of the loop mode."""
    unit = "alpha-0123456789\n" if kind == "A" else "BETA+abcdefghij\n"
    return (unit * (SIZE // len(unit) + 1))[:SIZE]


state = {"write": 0}


def stop_here(what: str) -> None:
    print(f"stopped {what}", flush=True)
    sys.stdin.readline()  # the parent never answers: it kills us here
    raise SystemExit("not killed")


def instrument(stop: str, first: int) -> None:
    """Make the store's own os.write/os.replace calls pause where the test wants a kill."""
    real_write, real_replace = os.write, os.replace

    def write(fd: int, data: Any) -> int:
        written = real_write(fd, bytes(data[: 64 * 1024]))  # force several partial writes
        if state["write"] >= first and stop in ("history", "file"):
            in_history = "/.history/" in os.readlink(f"/proc/self/fd/{fd}")
            if in_history == (stop == "history"):
                stop_here(f"in {stop} write")
        return written

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if state["write"] >= first and stop == "rename" and dst == "memory.md":
            stop_here("before rename")
        real_replace(src, dst, **kwargs)

    if stop != "free":
        os.write = write
        os.replace = replace  # type: ignore[assignment]


def main() -> None:
    mode, root, persona = sys.argv[1:4]
    if mode == "writes":
        label, count = sys.argv[4], int(sys.argv[5])
        store = CortexStore(CortexConfig(root=Path(root), persona=persona, history=100))
        sys.stdin.readline()
        for i in range(count):
            store.write("memory.md", f"{label} write {i}\n")
        print("finished", flush=True)
    elif mode == "loop":
        instrument(sys.argv[4], int(sys.argv[5]))
        config = CortexConfig(root=Path(root), persona=persona, max_bytes=2 * SIZE, history=4)
        store = CortexStore(config)
        contents = [big("A"), big("B")]
        while True:
            print(state["write"], flush=True)
            store.write("memory.md", contents[state["write"] % 2])
            state["write"] += 1
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
