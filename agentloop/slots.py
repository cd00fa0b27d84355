"""The limiter tokens a tool call holds, and the worker threads sync tools run in.

`ToolRegistry.run_call` takes a call's `Slots` (the run's cap, the shared cap, a worker
thread for a sync tool) before it runs the tool and gives them back when the call ends,
or leaves them to the thread of a sync tool that outlives its call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ("DEFAULT_THREAD_LIMIT", "Raised", "Slots", "thread_limiter", "uncapped")

DEFAULT_THREAD_LIMIT = 40
"""Worker threads for sync tools per event loop, unless changed with `thread_limiter()`."""

_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("agentloop_threads")
_UNCAPPED: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "agentloop_uncapped"
)


def thread_limiter() -> anyio.CapacityLimiter:
    """The event loop's cap on worker threads running sync tools, shared by every run.

    It holds `DEFAULT_THREAD_LIMIT` (40) tokens; set its `total_tokens` to change it
    (`thread_limiter().total_tokens = 100`, from within the event loop). A run uses it
    unless its `RunContext.thread_limiter` names another limiter. A call that
    outlives its timeout keeps its token until its thread returns, so the tokens bound the
    number of threads that sync tools occupy, abandoned ones included.
    """
    try:
        return _THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(DEFAULT_THREAD_LIMIT)
        _THREADS.set(limiter)
        return limiter


def uncapped() -> anyio.CapacityLimiter:
    """The limiter given to anyio for a sync call's thread: one that never blocks.

    anyio takes a token for every worker thread and gives it back when the call is
    abandoned; ours are counted by the call's own `Slots`.
    """
    try:
        return _UNCAPPED.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(math.inf)
        _UNCAPPED.set(limiter)
        return limiter


class Slots:
    """The limiter tokens one call holds, and who gives them back.

    Normally the call does, when it is done. A sync call given up on while its function
    runs (timed out or cancelled) leaves them to the worker thread, which gives them back
    on the event loop when the function returns: the call goes on counting against every
    cap until it has really stopped.
    """

    __slots__ = ("abandoned", "held", "lock", "loop", "running")

    def __init__(self) -> None:
        self.held: list[anyio.CapacityLimiter] = []
        self.lock = threading.Lock()
        self.running = False
        self.abandoned = False
        self.loop: anyio.lowlevel.EventLoopToken | None = None

    async def take(self, limiter: anyio.CapacityLimiter) -> None:
        """Take a token of `limiter` (this object is the borrower), waiting if none is free."""
        try:
            limiter.acquire_on_behalf_of_nowait(self)  # no trip through the event loop
        except anyio.WouldBlock:
            await limiter.acquire_on_behalf_of(self)
        self.held.append(limiter)

    def run(self, function: Callable[[], Any]) -> Any:
        """In the worker thread: run `function`, unless the call was given up on first."""
        with self.lock:
            if self.abandoned:
                return None
            self.running = True
        try:
            return function()
        except BaseException as exc:
            if isinstance(exc, Exception):
                raise
            # Raised by anyio on the event loop, asyncio would let `SystemExit` escape
            # it: carry these back as a value, for the call to raise in its task.
            return Raised(exc)
        finally:
            with self.lock:
                self.running = False
                handed_over = self.abandoned
            if handed_over:
                # Handing the tokens back waits for the event loop to run it, and a loop
                # that has stopped without being closed never will: a daemon thread waits
                # instead of this one, which the interpreter would wait for at exit.
                threading.Thread(
                    target=self._give_back_on_loop, name="agentloop slots", daemon=True
                ).start()

    def release(self) -> None:
        """As the call ends: give the tokens back, or leave them to a thread still running."""
        with self.lock:
            self.abandoned = True  # a thread that has not started the function never will
            if self.running:
                self.loop = anyio.lowlevel.current_token()
                return
        self._give_back()

    def _give_back_on_loop(self) -> None:
        try:
            anyio.from_thread.run_sync(self._give_back, token=self.loop)
        except RuntimeError:  # the event loop has finished, its limiters with it
            pass

    def _give_back(self) -> None:
        for limiter in reversed(self.held):
            limiter.release_on_behalf_of(self)
        self.held = []


@dataclass(frozen=True)
class Raised:
    """A `BaseException` (not an `Exception`) that a sync tool raised in its thread."""

    exc: BaseException
