"""MCP tool source: connect time by protocol choice, and the cost of one call per transport.

    python -m benchmarks.mcp [--runs 5] [--calls 200] [--write]

Connect time is opening an `MCPToolSource` on one server (process started, protocol
agreed, tools listed) and closing it again, for:

- `tests/raw_server.py` of the mcp plugin, a server that ignores requests it does not know
  (as some do with `server/discover`): with `protocol="auto"` the client waits for the
  probe to time out before the handshake; with `protocol` fixed it does not probe.
- the plugin's SDK-built test server (`tests/mcp_server.py`), which answers the probe.

A call is `await tool(text="x")` of the test server's `echo`, one after the other, over
stdio and over streamable HTTP (the server in its own process on 127.0.0.1); the table
gives the median and 95th percentile. The target: connect <= 1 s with `protocol` fixed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "plugins" / "mcp" / "tests"
sys.path.insert(0, str(TESTS))

from _mcp_support import HTTPServerProcess  # noqa: E402
from agentloop_mcp import MCPServer, MCPToolSource  # noqa: E402

RAW = str(TESTS / "raw_server.py")
SDK = str(TESTS / "mcp_server.py")


async def connect_time(server: MCPServer) -> float:
    start = time.perf_counter()
    async with MCPToolSource([server]) as source:
        assert source.tools(), source.errors
    return time.perf_counter() - start


async def call_times(server: MCPServer, calls: int) -> list[float]:
    async with MCPToolSource([server]) as source:
        echo = next(t for t in source.tools() if t.name == "echo")
        await echo(text="warm-up")
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            await echo(text="x")
            times.append(time.perf_counter() - start)
    return times


def row(name: str, times: list[float], unit: float, suffix: str) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"| {name} | {statistics.median(times) * unit:.2f} {suffix} | "
        f"{min(times) * unit:.2f} {suffix} | {p95 * unit:.2f} {suffix} | {len(times)} |"
    )


async def measure(runs: int, calls: int) -> list[str]:
    lines = [
        "| connect (start, agree, list, stop) | median | min | p95 | runs |",
        "|---|---|---|---|---|",
    ]
    cases = {
        "raw server, protocol fixed (legacy)": MCPServer.stdio(
            sys.executable, [RAW], name="raw", protocol="legacy"
        ),
        "raw server, protocol fixed (2025-06-18)": MCPServer.stdio(
            sys.executable, [RAW], name="raw", protocol="2025-06-18"
        ),
        "SDK server, protocol auto": MCPServer.stdio(sys.executable, [SDK], name="sdk"),
        "SDK server, protocol fixed (legacy)": MCPServer.stdio(
            sys.executable, [SDK], name="sdk", protocol="legacy"
        ),
    }
    for name, server in cases.items():
        lines.append(row(name, [await connect_time(server) for _ in range(runs)], 1, "s"))
    probe = MCPServer.stdio(sys.executable, [RAW], name="raw")
    lines.append(
        row("raw server, protocol auto (probe times out)", [await connect_time(probe)], 1, "s")
    )
    lines += ["", "| one `echo` call | median | min | p95 | calls |", "|---|---|---|---|---|"]
    stdio = MCPServer.stdio(sys.executable, [SDK], name="sdk")
    lines.append(row("stdio", await call_times(stdio, calls), 1000, "ms"))
    http = await HTTPServerProcess("sdk").start()
    try:
        lines.append(row("streamable HTTP", await call_times(http.declare(), calls), 1000, "ms"))
    finally:
        await http.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS-mcp.md")
    args = parser.parse_args()
    lines = anyio.run(measure, args.runs, args.calls)
    print("\n".join(lines))
    if args.write:
        text = "# MCP benchmark results\n\n`python -m benchmarks.mcp`"
        text += f" (runs={args.runs}, calls={args.calls}); see the module's docstring.\n\n"
        (ROOT / "benchmarks" / "RESULTS-mcp.md").write_text(text + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
