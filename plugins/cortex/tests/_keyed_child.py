"""Worker process for the idempotency tests (not a test module).

python _keyed_child.py ROOT PERSONA KEY STOP

Appends "- likes tea" to memory.md under KEY (no key when KEY is "-"), pausing for the
parent's SIGKILL at STOP: "before-rename" (the ledger written, memory.md not yet
replaced) or "after-rename" (memory.md replaced, the call not yet returned).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agentloop_cortex import CortexConfig, CortexStore


def stop_here(what: str) -> None:
    print(f"stopped {what}", flush=True)
    sys.stdin.readline()  # the parent never answers: it kills us here
    raise SystemExit("not killed")


def main() -> None:
    root, persona, key, stop = sys.argv[1:5]
    real_replace = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if dst == "memory.md" and stop == "before-rename":
            stop_here(stop)
        real_replace(src, dst, **kwargs)
        if dst == "memory.md" and stop == "after-rename":
            stop_here(stop)

    os.replace = replace  # type: ignore[assignment]
    store = CortexStore(CortexConfig(root=Path(root), persona=persona))
    store.append("memory.md", "- likes tea\n", key=None if key == "-" else key)
    print("done", flush=True)


if __name__ == "__main__":
    main()
