"""The scenarios: what the local server answers, the tools the contenders run, and the probes.

The server process answers each request with `respond(body)`, a function of the request
alone (the scenario is named by the request's `model`, "bench-S1" ...), so any number of
runs and any contender work against one server. The tools are plain async functions;
each contender wraps them in its own tool format. They report what they see to `PROBE`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentloop.testing import Paced, reply, tool_call

MAX_TOKENS = 1024
S2_TURNS = 100
S4_ROUNDS = 150
DOCUMENT_BYTES = 4096
S5_RUNS_AT_ONCE = 200
S5_ROUNDS = 2
S8_ROUNDS = 2000
S8_SAMPLES = (100, S8_ROUNDS)
S7_BLOCK_DELAY = 0.25
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario."""

    name: str
    title: str
    tools: tuple[str, ...]
    contenders: tuple[str, ...]
    runs: int
    """Timed repetitions per contender, each in a fresh process after a warm-up run."""
    max_rounds: int = 10
    tool_concurrency: int = 64
    warmup: bool = True
    stream: bool = False
    at_once: int = 1
    """Conversations a timed run starts together in one task group (a service under load)."""

    @property
    def model(self) -> str:
        return f"bench-{self.name}"


ALL = ("agentloop", "hand", "sdk_runner", "pydantic_ai", "openai_agents")
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "S1", "fanout: 1 turn of 50 calls x 100 ms", ("wait",), (*ALL, "agentloop_cap8"), 5
        ),
        Scenario("S2", f"chain: {S2_TURNS} turns of 1 instant call", ("echo",), ALL, 9, 102),
        Scenario(
            "S3",
            "big fanout: 1 turn of 1000 instant calls",
            ("echo",),
            (*ALL, "hand_gather", "agentloop_untraced"),
            7,
            10,
            1000,
        ),
        Scenario(
            "S4",
            f"long history: {S4_ROUNDS} rounds of 1 call returning {DOCUMENT_BYTES // 1024} kB",
            ("document",),
            ALL,
            7,
            S4_ROUNDS + 1,
        ),
        Scenario(
            "S5",
            f"service under load: {S5_RUNS_AT_ONCE} runs at once, each {S5_ROUNDS} rounds of "
            "3 calls x 100 ms",
            ("wait",),
            ALL,
            5,
            S5_ROUNDS + 1,
            at_once=S5_RUNS_AT_ONCE,
        ),
        Scenario(
            "S6",
            "cap: 64 calls x 100 ms at tool_concurrency=8",
            ("wait",),
            ("agentloop",),
            5,
            10,
            8,
        ),
        Scenario(
            "S7",
            "eager streaming: 5 tool_use blocks streamed at 0.25 s each",
            ("work",),
            ("agentloop_eager", "agentloop_noneager", "sdk_runner_eager", "hand"),
            3,
            stream=True,
        ),
        Scenario(
            "S8",
            f"long run: {S8_ROUNDS} rounds of 1 small call",
            ("mem",),
            ("agentloop", "hand"),
            1,
            S8_ROUNDS + 1,
            warmup=False,
        ),
    )
}


# -- what the server answers


def _rounds_done(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


def _calls(count: int, name: str, make_input: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    return reply(*[tool_call(name, make_input(i)) for i in range(count)])


def respond(body: dict[str, Any]) -> Any:
    """The answer to one request: the scenario is in the request's `model`."""
    name = str(body.get("model", "")).removeprefix("bench-")
    done = _rounds_done(body)
    if name == "S1":
        return _calls(50, "wait", lambda i: {"ms": 100}) if done == 0 else reply("done")
    if name == "S2":
        return reply(tool_call("echo", {"value": str(done)})) if done < S2_TURNS else reply("done")
    if name == "S3":
        return _calls(1000, "echo", lambda i: {"value": str(i)}) if done == 0 else reply("done")
    if name == "S4":
        return reply(tool_call("document", {"n": done})) if done < S4_ROUNDS else reply("done")
    if name == "S5":
        return _calls(3, "wait", lambda i: {"ms": 100}) if done < S5_ROUNDS else reply("done")
    if name == "S6":
        return _calls(64, "wait", lambda i: {"ms": 100}) if done == 0 else reply("done")
    if name == "S7":
        if done:
            return reply("done")
        return Paced(_calls(5, "work", lambda i: {"k": i + 1}), block_delay=S7_BLOCK_DELAY)
    if name == "S8":
        return reply(tool_call("mem", {})) if done < S8_ROUNDS else reply("done")
    return reply(f"unknown scenario {name!r}")


# -- the tools, and what they measure


@dataclass
class Probe:
    """What the tools observed during one run."""

    started: float = field(default_factory=time.perf_counter)
    in_flight: int = 0
    max_in_flight: int = 0
    finished: list[float] = field(default_factory=list)
    """Seconds from the run's start at which each `work` call finished."""
    work_started: dict[int, float] = field(default_factory=dict)
    """Seconds from the run's start at which each `work` call (by k) started."""
    block_closed: dict[int, float] = field(default_factory=dict)
    """Seconds from the run's start at which each `work` call's block closed (agentloop)."""
    mem_calls: int = 0
    rss: dict[int, int] = field(default_factory=dict)
    """Resident set size in bytes, by `mem` call number."""


PROBE = Probe()


def reset_probe() -> Probe:
    global PROBE
    PROBE = Probe()
    return PROBE


async def wait(ms: int) -> str:
    """Wait `ms` milliseconds."""
    PROBE.in_flight += 1
    PROBE.max_in_flight = max(PROBE.max_in_flight, PROBE.in_flight)
    try:
        await anyio.sleep(ms / 1000)
    finally:
        PROBE.in_flight -= 1
    return "waited"


async def echo(value: str) -> str:
    """Echo `value` back."""
    return value


# Words of a plain text page: a document as a tool might fetch it, with nothing to escape.
_WORDS = "the agent reads a long report on the state of the service and its recent changes "
_DOCUMENT = (_WORDS * (DOCUMENT_BYTES // len(_WORDS) + 1))[:DOCUMENT_BYTES]


async def document(n: int) -> str:
    """Return the n-th document: 4 kB of text."""
    head = f"document {n}: "
    return head + _DOCUMENT[len(head) :]


async def work(k: int) -> str:
    """Do the k-th piece of work, which takes (5 - k) * 0.25 s."""
    PROBE.work_started[k] = time.perf_counter() - PROBE.started
    await anyio.sleep((5 - k) * S7_BLOCK_DELAY)
    PROBE.finished.append(time.perf_counter() - PROBE.started)
    return f"work {k} done"


async def mem() -> str:
    """Note the process's memory use."""
    PROBE.mem_calls += 1
    if PROBE.mem_calls in S8_SAMPLES:
        PROBE.rss[PROBE.mem_calls] = current_rss()
    return "ok"


TOOLS: dict[str, Callable[..., Awaitable[str]]] = {
    "wait": wait,
    "echo": echo,
    "document": document,
    "work": work,
    "mem": mem,
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "wait": {"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]},
    "echo": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]},
    "document": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    "work": {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]},
    "mem": {"type": "object", "properties": {}},
}


def definitions(names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Tool definitions in wire form (for the hand loop)."""
    return [
        {"name": n, "description": TOOLS[n].__doc__ or n, "input_schema": SCHEMAS[n]} for n in names
    ]


def current_rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> int:
    """Reset this process's RSS high-water mark (Linux 4.0+), then return it in bytes.

    Without the reset (another kernel), the mark returned is the process's peak so far,
    and a growth measured from it is a lower bound.
    """
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # 5: reset the peak resident set size
    return high_water_rss()


def high_water_rss() -> int:
    """The RSS high-water mark (VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
