"""A separate process for the session tests: one run on a session, over HTTP.

    python tests/sessions/_sessions_child.py KIND TARGET SESSION_ID BASE_URL PROMPT [--block]

KIND is `sqlite` (TARGET a file) or `redis` (TARGET a URL). The run's text is printed as
`done: TEXT`. With `--block`, the first append stops just before its commit: the process
prints `at-commit` and waits there until it is killed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import anyio
from anthropic import AsyncAnthropic

from agentloop import Agent
from agentloop.sessions import RedisSession, SQLiteSession


def blocking(cls: type[Any]) -> type[Any]:
    class Blocking(cls):  # type: ignore[misc,valid-type]
        def _commit_point(self) -> None:
            print("at-commit", flush=True)
            threading.Event().wait()  # until the parent's SIGKILL

    return Blocking


async def main(
    kind: str, target: str, session_id: str, base_url: str, prompt: str, block: bool
) -> None:
    cls: type[Any] = SQLiteSession if kind == "sqlite" else RedisSession
    session = (blocking(cls) if block else cls)(target, session_id)
    client = AsyncAnthropic(base_url=base_url, api_key="test-key", max_retries=0)
    async with client:
        result = await Agent(client=client).run(prompt, session=session)
    print(f"done: {result.text}", flush=True)


if __name__ == "__main__":
    kind, target, session_id, base_url, prompt = sys.argv[1:6]
    anyio.run(main, kind, target, session_id, base_url, prompt, "--block" in sys.argv[6:])
