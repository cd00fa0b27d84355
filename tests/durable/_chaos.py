"""The chaos suite's world: a scripted model, tools with a ledger, and crash points.

Shared by the test process (test_durable_chaos.py: the reference run, the checks) and
the child processes that run a durable run and are killed (_chaos_child.py).

- The model (`ChaosModel`) answers as a pure function of the request: the run's plan comes
  from the seed in the prompt, the round from the number of assistant messages, so a
  request asked again after a crash gets the same answer. It appends a line per request
  to `requests.jsonl`.
- The tools (`chaos_tools`) mix async, sync, failing, timing-out and slow-first calls. Each
  that changes the world appends to `ledger.jsonl`, keyed by `ctx.idempotency_key`, and
  skips a key already there; `tally` (the negative control) ignores the key. `helper` is
  a sub-agent (`Agent.as_tool`) with keyed tools of its own: a run whose prompt says
  `helper` calls it, and its sub-run's plan comes from its prompt (`sub`).
- `Crash` kills the process at a named point (`AGENTLOOP_CHAOS_CRASH`), with SIGKILL: no
  cleanup, no flush, as a machine failing would.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from agentloop import Agent, RunContext, ToolError, tool
from agentloop.providers.base import BlockDelta, ModelRequest, ModelResponse, StreamEvent
from agentloop.result import RunResult
from agentloop.testing import reply, tool_call

CRASH_ENV = "AGENTLOOP_CHAOS_CRASH"
"""The crash point a child process dies at (see `Crash`)."""

HANG_TIMEOUT = 0.3
"""Seconds before the `hang` tool's calls time out."""
WAIT_LIMIT = 20.0
"""Seconds a wait on another call's files may take before the test fails."""

APPROVE = {
    "name": "approve",
    "description": "Ask a person to approve a note (answered by the caller).",
    "input_schema": {
        "type": "object",
        "properties": {"note": {"type": "string"}},
        "required": ["note"],
    },
}
"""The external tool: its calls are handed back to the caller."""

KEYED = ("note", "note_sync", "refuse", "slow")
"""The tools whose effect is keyed by the call's idempotency key."""
WORDS = ("amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath")


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Call:
    """One planned tool call."""

    name: str
    id: str
    note: str

    def block(self) -> dict[str, Any]:
        # The helper's "note" is the prompt its sub-run is given.
        key = "prompt" if self.name == "helper" else "note"
        return tool_call(self.name, {key: self.note}, id=self.id)


PARTS = {"helper": "h", "sub": "u"}
"""The runs of the helper's script by their word in the prompt: the run that calls the
helper, and the helper's sub-run; each with its letter in the calls' ids."""


def prompt_for(seed: int, *, external: bool = False, part: str = "") -> str:
    """The prompt of the run whose plan `seed` gives (`part`: one of `PARTS`, or none)."""
    return f"chaos seed={seed}" + (" external" if external else "") + (f" {part}" if part else "")


def parse_prompt(prompt: str) -> tuple[int, bool]:
    found = re.fullmatch(r"chaos seed=(\d+)( external)?( helper| sub)?", prompt)
    if found is None:
        raise ValueError(f"not a chaos prompt: {prompt!r}")
    return int(found.group(1)), found.group(2) is not None


def part_of(prompt: str) -> str:
    """Which of `PARTS` the prompt's run is (empty: the suite's usual run)."""
    return next((part for part in PARTS if prompt.endswith(f" {part}")), "")


def plan(seed: int, *, external: bool = False, part: str = "") -> list[list[Call]]:
    """The tool calls of each round of the run for `seed` (the last round has none).

    Round 1 starts with the slow-first call and holds the negative control; round 2 has a
    sync, a failing and a timing-out call (and, for an external run, the external call);
    a seeded third round (or none) follows. Then the model ends the run.

    A `helper` run calls the helper once, then ends; its `sub` run writes two notes (an
    async and a sync call), then ends.
    """
    if part == "helper":
        return [
            [Call("helper", call_id(seed, False, 1, 0, part), prompt_for(seed, part="sub"))],
            [],
        ]
    if part == "sub":
        names = ("note", "note_sync")
        return [
            [
                Call(n, call_id(seed, False, 1, i, part), f"sub-{seed}-{i}")
                for i, n in enumerate(names)
            ],
            [],
        ]
    rng = random.Random(seed)
    kinds = [
        ["slow", *rng.sample(["note", "tally"], 2)],
        rng.sample(["note_sync", "refuse", "hang"], 3),
    ]
    if external:
        kinds[1] = [kinds[1][0], "approve", kinds[1][1]]
    if rng.random() < 0.5:
        kinds.append(rng.sample(["note", "note_sync", "refuse"], rng.choice((2, 3))))
    return [
        [
            Call(name, call_id(seed, external, r, i), f"{rng.choice(WORDS)}-{seed}-{r}{i}")
            for i, name in enumerate(names)
        ]
        for r, names in enumerate(kinds, start=1)
    ] + [[]]


def call_id(seed: int, external: bool, round_: int, index: int, part: str = "") -> str:
    """A call's tool_use id: it says which run, round and call it is."""
    kind = PARTS.get(part) or ("x" if external else "p")
    return f"toolu_s{seed}{kind}_r{round_}_c{index}"


def parse_call_id(tool_use_id: str) -> tuple[int, bool, int]:
    """The seed, externality and round of a call, from its id."""
    found = re.fullmatch(r"toolu_s(\d+)([xphu])_r(\d+)_c\d+", tool_use_id)
    if found is None:
        raise ValueError(f"not a chaos call id: {tool_use_id!r}")
    return int(found.group(1)), found.group(2) == "x", int(found.group(3))


def usage_of(round_: int) -> dict[str, int]:
    return {"input_tokens": 100 + 7 * round_, "output_tokens": 10 + round_}


def _first_text(messages: list[Any]) -> str:
    content = messages[0]["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


class ChaosModel:
    """The script: the answer to a request, from the request alone.

    Every request is appended to `requests.jsonl` in `folder` (seed and round), so a test
    can count how often the model was asked, across processes.
    """

    def __init__(self, folder: Path) -> None:
        self.log = folder / "requests.jsonl"
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        prompt = _first_text(messages)
        seed, external = parse_prompt(prompt)
        part = part_of(prompt)
        round_ = 1 + sum(1 for m in messages if m["role"] == "assistant")
        asked = {"seed": seed, "external": external, "round": round_, "part": part}
        with self._lock, self.log.open("a") as log:
            log.write(json.dumps(asked) + "\n")
        rounds = plan(seed, external=external, part=part)
        msg_id = f"msg_s{seed}{PARTS.get(part, '')}_r{round_}"
        if round_ > len(rounds):
            return {**reply("too many rounds"), "id": msg_id}
        calls = rounds[round_ - 1]
        if calls:
            message = reply(f"Round {round_}.", *(c.block() for c in calls), usage=usage_of(round_))
        else:
            message = reply(_summary(messages), usage=usage_of(round_))
        return {**message, "id": msg_id}


def _summary(messages: list[Any]) -> str:
    """The final text: it depends on every tool result the model was sent."""
    results = [
        b
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    failed = sum(1 for b in results if b.get("is_error"))
    outputs = "; ".join(
        "".join(p.get("text", "") for p in b["content"])
        if isinstance(b.get("content"), list)
        else str(b.get("content", ""))
        for b in results
    )
    return f"Done: {len(results)} results, {failed} failed. {outputs}"


def external_results(seed: int) -> dict[str, str]:
    """What the caller answers the run's external calls with."""
    return {
        c.id: f"approved {c.note}"
        for calls in plan(seed, external=True)
        for c in calls
        if c.name == "approve"
    }


# ---------------------------------------------------------------- crash points


class Crash:
    """Where this process dies, from `AGENTLOOP_CHAOS_CRASH` (empty: nowhere).

    `after-effect:<tool_use_id>` right after that call's effect (before its result is
    returned, so before any engine records it); `mid-tool:<tool_use_id>` when that call
    starts; `after-model:<round>` when that round's response has arrived, before it is
    returned; `between:<round>` when the slow-first call of that round sees its siblings
    completed (and recorded, where the engine tells); `external-wait` while the run waits
    for the external results; `event:<n>` at the n-th observable moment of this process
    (a response, a call's start, effect or finish, a slow call's wait; seeded random
    points); `mid-stream:<round>` (a run read as a stream) when this process's reader
    reads back a streamed event of that round's response: the response holds after its
    first delta until then, so its model step dies midway with part of it published.
    """

    def __init__(self, spec: str = "") -> None:
        self.point, _, self.where = spec.partition(":")
        self._events = 0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> Crash:
        return cls(os.environ.get(CRASH_ENV, ""))

    def at(self, point: str, where: str = "") -> None:
        """Die if this is the crash point; count the moment for `event:<n>` either way."""
        with self._lock:
            self._events += 1
            due = self.point == "event" and self._events == int(self.where)
        if due or (self.point == point and self.where == where):
            die()

    def read(self, point: str, where: str) -> None:
        """Die if this is the crash point (a moment of the reader: not counted)."""
        if self.point == point and self.where == where:
            die()

    async def hold(self, point: str, where: str) -> None:
        """If this is the crash point, wait for the process to die there (see `read`)."""
        if self.point == point and self.where == where:
            with anyio.fail_after(WAIT_LIMIT):
                await anyio.sleep_forever()


def die() -> None:
    """SIGKILL this process."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("still alive after SIGKILL")


class CrashingProvider:
    """A provider that may die right after a response arrived (`after-model:<round>`).

    It streams as its inner provider does (a streamed run's model step publishes the
    response's events as they arrive, before the crash).
    """

    def __init__(self, inner: Any, crash: Crash) -> None:
        self.inner = inner
        self.crash = crash
        self.name = getattr(inner, "name", "anthropic")

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response: ModelResponse = await self.inner.complete(request)
        self._arrived(request)
        return response

    async def stream(
        self, request: ModelRequest, on_event: Callable[[StreamEvent], Awaitable[None]]
    ) -> ModelResponse:
        deltas = 0

        async def forward(event: StreamEvent) -> None:
            nonlocal deltas
            await on_event(event)
            if isinstance(event, BlockDelta):
                deltas += 1
                if deltas == 1:
                    await self.crash.hold("mid-stream", str(_round(request)))

        response: ModelResponse = await self.inner.stream(request, forward)
        self._arrived(request)
        return response

    def _arrived(self, request: ModelRequest) -> None:
        self.crash.at("after-model", str(_round(request)))


def _round(request: ModelRequest) -> int:
    return 1 + sum(1 for m in request.messages if m.role == "assistant")


# ---------------------------------------------------------------- the ledger and the tools


def _append_line(path: Path, record: Mapping[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def until(condition: Callable[[], Awaitable[bool]], seconds: float = WAIT_LIMIT) -> None:
    """Wait until `condition()` holds, failing after `seconds`.

    What is waited for is another process's files or an engine's record: there is no
    event to wait on, so the condition is looked at every few milliseconds.
    """
    with anyio.fail_after(seconds):
        while not await condition():  # noqa: ASYNC110 (see above)
            await anyio.sleep(0.005)


Recorded = Callable[[str, list[str]], Awaitable[bool]]
"""`recorded(run_id, tool_use_ids)`: whether the engine has recorded those calls' results."""


class World:
    """The files a run's tools change and leave traces in, in `folder`."""

    def __init__(self, folder: Path, crash: Crash, recorded: Recorded | None = None) -> None:
        self.folder = folder
        self.ledger = folder / "ledger.jsonl"
        self.starts = folder / "starts.jsonl"
        self.crash = crash
        self.recorded = recorded

    def effect(self, ctx: RunContext, tool_name: str, note: str, *, keyed: bool = True) -> None:
        """Append the call's effect to the ledger, once per key unless `keyed` is False."""
        key = ctx.idempotency_key
        with open(self.folder / "ledger.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if keyed and any(e["key"] == key for e in read_lines(self.ledger)):
                return
            _append_line(self.ledger, {"key": key, "tool": tool_name, "note": note})
        self.crash.at("after-effect", ctx.tool_use_id)

    def start(self, ctx: RunContext, tool_name: str) -> None:
        start = {"key": ctx.idempotency_key, "tool": tool_name, "pid": os.getpid()}
        _append_line(self.starts, start)
        self.crash.at("mid-tool", ctx.tool_use_id)

    def finish(self, ctx: RunContext) -> None:
        (self.folder / f"done-{ctx.tool_use_id}").touch()
        self.crash.at("finished", ctx.tool_use_id)

    async def wait_for_siblings(self, ctx: RunContext) -> None:
        """Wait until the round's other finishing calls are done (and recorded, if known).

        The slow-first call completes after its siblings without a timed sleep: it waits
        for their `done-` files, and for the engine to report their steps recorded.
        """
        seed, external, round_ = parse_call_id(ctx.tool_use_id)
        rounds = plan(seed, external=external)
        siblings = [
            c.id
            for c in rounds[round_ - 1]
            if c.id != ctx.tool_use_id and c.name not in ("hang", "approve")
        ]
        recorded = self.recorded

        async def done() -> bool:
            return all((self.folder / f"done-{s}").exists() for s in siblings)

        await until(done)
        if recorded is not None:
            await until(lambda: recorded(ctx.run_id, siblings))
        self.crash.at("between", str(round_))


def chaos_tools(world: World) -> list[Any]:
    """The run's tools, acting on `world`."""

    @tool
    async def note(ctx: RunContext, note: str) -> str:
        """Write a note down (async)."""
        world.start(ctx, "note")
        await anyio.lowlevel.checkpoint()
        world.effect(ctx, "note", note)
        world.finish(ctx)
        return f"noted {note}"

    @tool
    def note_sync(ctx: RunContext, note: str) -> str:
        """Write a note down (sync, in a worker thread)."""
        world.start(ctx, "note_sync")
        world.effect(ctx, "note_sync", note)
        world.finish(ctx)
        return f"noted {note} (sync)"

    @tool
    async def refuse(ctx: RunContext, note: str) -> str:
        """Write a note down, then fail."""
        world.start(ctx, "refuse")
        world.effect(ctx, "refuse", note)
        world.finish(ctx)
        raise ToolError(f"could not file {note}")

    @tool(timeout=HANG_TIMEOUT)
    async def hang(ctx: RunContext, note: str) -> str:
        """Never answers (times out)."""
        world.start(ctx, "hang")
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    @tool
    async def slow(ctx: RunContext, note: str) -> str:
        """Write a note down after the other calls of the round are done."""
        world.start(ctx, "slow")
        await world.wait_for_siblings(ctx)
        world.effect(ctx, "slow", note)
        world.finish(ctx)
        return f"noted {note} (slow)"

    @tool
    async def tally(ctx: RunContext, note: str) -> str:
        """Count a note (ignores the idempotency key: the negative control)."""
        world.start(ctx, "tally")
        world.effect(ctx, "tally", note, keyed=False)
        world.finish(ctx)
        return f"tallied {note}"

    return [note, note_sync, refuse, hang, slow, tally]


def chaos_agent(provider: Any, world: World) -> Agent:
    """The agent every run of the suite uses (the reference run and the durable ones).

    Its `helper` tool is a sub-agent on the same model, with the keyed `note` tools.
    """
    note, note_sync, *_ = chaos_tools(world)
    helper = Agent(
        "claude-scripted",
        provider=CrashingProvider(provider, world.crash),
        tools=[note, note_sync],
        tool_timeout=WAIT_LIMIT,
        name="helper",
    )
    return Agent(
        "claude-scripted",
        provider=CrashingProvider(provider, world.crash),
        tools=[*chaos_tools(world), helper.as_tool()],
        tool_timeout=WAIT_LIMIT,
        name="chaos",
    )


# ---------------------------------------------------------------- comparing runs


def summary(result: RunResult[Any]) -> dict[str, Any]:
    """What must equal between a durable run and an uninterrupted one (JSON)."""
    return {
        "messages": result.messages,
        "stop_reason": result.stop_reason,
        "rounds": result.rounds,
        "text": result.text,
        "usage": {
            "input_tokens": result.usage.input_tokens,
            "output_tokens": result.usage.output_tokens,
            "requests": result.usage.requests,
        },
        "tool_calls": [
            {
                "round": c.round,
                "name": c.name,
                "input": c.input,
                "tool_use_id": c.tool_use_id,
                "is_error": c.is_error,
                "output": c.output,
            }
            for c in result.tool_calls
        ],
    }


def effects_by_key(ledger: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in ledger:
        counts[entry["key"]] = counts.get(entry["key"], 0) + 1
    return counts
