"""What the gateway benchmark measures, path by path, with one aiohttp client per path.

`paired_json` and `paired_stream` send the same request through every path back to back,
in an order that rotates each round, so each round's differences compare requests made
under the same load of a noisy machine; `load` runs 50 clients against one path;
`ProcessStats` reads a server's CPU time and memory from /proc. The SDK is not the client
here: its own cost per request would be the same on every path, and only add noise.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio

from benchmarks.gateway_servers import BETA, LOST_BETA, MIXED

API_KEY = "sk-bench-5f0c2a9e81d34b7a9c6e2f1d0b8a7c65"
"""The key every client request carries (LiteLLM's master key; the others ignore it)."""
HEADERS = {
    "x-api-key": API_KEY,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": BETA,
    "content-type": "application/json",
}
T = TypeVar("T")
PLAIN = {"model": "bench-plain", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
CLIENT_TOOL = {
    "name": "client_tool",
    "description": "The client's own tool.",
    "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
}


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Checks:
    """What went wrong on one path: answers that were not the expected one."""

    errors: list[str] = field(default_factory=list)
    lost_beta: int = 0

    def read(self, status: int, data: bytes) -> None:
        if status != 200 or b"hello" not in data:
            self.errors.append(f"{status}: {data[:160]!r}")
        elif LOST_BETA.encode() in data:
            self.lost_beta += 1


def sessions(targets: Mapping[str, str], limit: int) -> dict[str, aiohttp.ClientSession]:
    return {
        name: aiohttp.ClientSession(
            base_url=url,
            connector=aiohttp.TCPConnector(limit=limit),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        for name, url in targets.items()
    }


async def close(clients: Mapping[str, aiohttp.ClientSession]) -> None:
    for client in clients.values():
        await client.close()


async def json_request(client: aiohttp.ClientSession, payload: bytes, checks: Checks) -> float:
    started = time.perf_counter()
    async with client.post("/v1/messages", data=payload, headers=HEADERS) as response:
        data = await response.read()
    elapsed = time.perf_counter() - started
    checks.read(response.status, data)
    return elapsed


@dataclass
class Streamed:
    """Seconds from sending a streamed request to its `message_start`, first delta, end."""

    first_byte: float
    first_delta: float
    end: float


async def stream_request(client: aiohttp.ClientSession, payload: bytes, checks: Checks) -> Streamed:
    started = time.perf_counter()
    seen = b""
    first_byte = first_delta = 0.0
    async with client.post("/v1/messages", data=payload, headers=HEADERS) as response:
        async for chunk in response.content.iter_any():
            seen += chunk
            now = time.perf_counter() - started
            if not first_byte and b"message_start" in seen:
                first_byte = now
            if not first_delta and b"content_block_delta" in seen:
                first_delta = now
    end = time.perf_counter() - started
    checks.read(response.status, seen)
    return Streamed(first_byte or end, first_delta or end, end)


def rotated(items: Sequence[T], i: int) -> list[T]:
    """`items` starting at its `i`-th (wrapping), backwards every other cycle.

    Each path takes every place in turn, and follows both of its neighbours: a server's
    work after it has answered (logging, storing) weighs on different paths' requests.
    """
    shift = i % len(items)
    order = [*items[shift:], *items[:shift]]
    return order[::-1] if (i // len(items)) % 2 else order


async def paired_json(
    targets: Mapping[str, str], rounds: int, checks: Mapping[str, Checks]
) -> dict[str, list[float]]:
    """`rounds` rounds of one plain JSON request through each path; seconds each, by round."""
    payload = json.dumps(PLAIN).encode()
    clients = sessions(targets, 1)
    times: dict[str, list[float]] = {name: [] for name in targets}
    try:
        for i in range(rounds):
            for name in rotated(list(targets), i):
                times[name].append(await json_request(clients[name], payload, checks[name]))
    finally:
        await close(clients)
    return times


async def paired_stream(
    targets: Mapping[str, str], rounds: int, checks: Mapping[str, Checks]
) -> dict[str, list[Streamed]]:
    """The same with `"stream": true` against the paced upstream."""
    payload = json.dumps({**PLAIN, "stream": True}).encode()
    clients = sessions(targets, 1)
    times: dict[str, list[Streamed]] = {name: [] for name in targets}
    try:
        for i in range(rounds):
            for name in rotated(list(targets), i):
                times[name].append(await stream_request(clients[name], payload, checks[name]))
    finally:
        await close(clients)
    return times


@dataclass
class Load:
    """`clients` clients sending plain JSON requests back to back for `seconds`."""

    requests: int
    wall: float
    latencies: list[float]
    cpu: float
    """CPU seconds of the path's server process (and its children) over the load."""

    @property
    def throughput(self) -> float:
        return self.requests / self.wall


async def load(
    url: str, clients: int, seconds: float, checks: Checks, process: ProcessStats
) -> Load:
    payload = json.dumps(PLAIN).encode()
    latencies: list[float] = []
    client = sessions({"load": url}, clients)["load"]
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            latencies.append(await json_request(client, payload, checks))

    cpu = process.cpu()
    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as group:
            for _ in range(clients):
                group.start_soon(worker)
    finally:
        await client.close()
    wall = time.perf_counter() - started
    return Load(len(latencies), wall, latencies, process.cpu() - cpu)


async def mixed_turns(url: str, conversations: int) -> tuple[int, list[str]]:
    """`conversations` at once, each a mixed turn (the gateway's `lookup` and the client's
    tool in one answer), then the client's result and the final answer. Returns how many
    completed as expected, and the first failures."""
    failures: list[str] = []
    client = sessions({"mixed": url}, conversations)["mixed"]

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        async with client.post("/v1/messages", data=json.dumps(body), headers=HEADERS) as response:
            answer: dict[str, Any] = await response.json(content_type=None)
        return answer

    async def converse(i: int) -> None:
        messages: list[Any] = [{"role": "user", "content": f"conversation {i}"}]
        body = {"model": MIXED, "max_tokens": 64, "tools": [CLIENT_TOOL], "messages": messages}
        try:
            first = await post(body)
            calls = [b for b in first["content"] if b["type"] == "tool_use"]
            assert [c["name"] for c in calls] == ["client_tool"], first
            result = {"type": "tool_result", "tool_use_id": calls[0]["id"], "content": "1"}
            messages += [
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": [result]},
            ]
            second = await post(body)
            assert second["stop_reason"] == "end_turn", second
        except (AssertionError, KeyError, aiohttp.ClientError) as exc:
            failures.append(f"{type(exc).__name__}: {exc}"[:200])

    try:
        async with anyio.create_task_group() as group:
            for i in range(conversations):
                group.start_soon(converse, i)
    finally:
        await client.close()
    return conversations - len(failures), failures[:5]


class ProcessStats:
    """CPU time and resident memory of a server process and its children, from /proc."""

    tick = os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def tree(self) -> list[int]:
        pids, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                todo += [int(child) for child in task.read_text().split()]
        return pids

    def cpu(self) -> float:
        """User and system CPU seconds so far."""
        total = 0
        for pid in self.tree():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / self.tick

    def memory(self) -> tuple[float, float]:
        """Resident and peak resident MiB."""
        rss = peak = 0
        for pid in self.tree():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    peak += int(line.split()[1])
        return rss / 1024, peak / 1024
