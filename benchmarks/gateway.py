"""The gateway's overhead and its behaviour under load.

    python -m benchmarks.gateway [--requests 1000] [--conversations 200] [--no-write]

Four processes: a scripted Messages server (`agentloop.testing.MessagesServer`, which
lints every history it receives), `python -m agentloop.gateway` in front of it with the
test tools plugin and the default sqlite store, a bare forwarding hop (the baseline: a
plain ASGI app on the same uvicorn that forwards the bytes with the gateway's HTTP
client), and this one as the client (the real `AsyncAnthropic`). It measures:

- passthrough: added latency of a plain request through the gateway against the same
  request sent to the upstream directly, and through the bare hop (interleaved,
  sequential; p50 and p99);
- streaming: time to the first byte of an SSE response, through the gateway and direct;
- load: 200 conversations at once, each a mixed turn (the gateway's `lookup` and the
  client's tool in one message) then the client's result and the final answer. Every
  upstream history is linted: a broken one would come back as a 400.

Writes `benchmarks/RESULTS-gateway.md` unless `--no-write`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "gateway_plugin"
RESULTS = Path(__file__).resolve().parent / "RESULTS-gateway.md"

CLIENT_TOOL = {
    "name": "client_tool",
    "description": "The client's own tool.",
    "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
}
PIP = (sys.executable, "-m", "pip", "-q", "--disable-pip-version-check")
GATEWAY = (sys.executable, "-m", "agentloop.gateway")
PLAIN = {"model": "bench-plain", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


# --------------------------------------------------------------------------- upstream


def respond(body: dict[str, Any]) -> Any:
    """The upstream's answer: a function of the request, so any number of runs works."""
    from agentloop.testing import reply, tool_call

    if body.get("model") != "bench-mixed":
        return reply("hello", usage={"input_tokens": 8, "output_tokens": 2})
    assistants = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if assistants == 0:
        return reply(
            "Both at once.",
            tool_call("lookup", {"key": "k"}),
            tool_call("client_tool", {"x": 1}),
        )
    return reply("done")


def serve_upstream(port: int) -> None:
    from agentloop.testing import MessagesServer, ScriptedModel

    class Forgetful(ScriptedModel):
        def respond(self, body: Any) -> Any:
            answer = super().respond(body)
            self.requests.clear()  # lints every history, keeps none
            return answer

    server = MessagesServer(Forgetful(respond), port=port).start()
    server._httpd.received = _Sink()  # type: ignore[assignment]
    server._httpd.recorded = _Sink()  # type: ignore[assignment]
    server._httpd.arrivals = _Sink()  # type: ignore[assignment]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"port {server.base_url.rsplit(':', 1)[1]}", flush=True)
    stop.wait()
    server.stop()


class _Sink(list):  # type: ignore[type-arg]
    def append(self, item: Any) -> None:
        pass


def hop_client(upstream: str) -> httpx2.AsyncClient:
    """The gateway's HTTP client for upstream requests, as `--upstream-transport auto` picks it."""
    if importlib.util.find_spec("aiohttp"):
        return anthropic.DefaultAioHttpClient(base_url=upstream)
    return anthropic.DefaultAsyncHttpxClient(base_url=upstream)


def serve_forwarder(port: int, upstream: str) -> None:
    """The baseline hop: a bare ASGI app on the gateway's uvicorn that forwards the bytes
    with the gateway's HTTP client.

    No SDK, no loop, no sessions: what any HTTP hop between the client and the
    upstream costs on this machine, measured in the same run as the gateway.
    """
    client: httpx2.AsyncClient | None = None
    kept = (b"x-api-key", b"anthropic-version", b"content-type")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal client
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if client is not None:
                await client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"] == "/healthz":
            status, data = 200, b"ok"
        else:
            client = client or hop_client(upstream)
            headers = [(k, v) for k, v in scope["headers"] if k in kept]
            answer = await client.post(scope["path"], content=body, headers=headers)
            status, data = answer.status_code, answer.content
        length = str(len(data)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{url} exited with {process.returncode}")
        try:
            if httpx2.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not start")


def start_processes(work: Path) -> tuple[str, str, list[subprocess.Popen[bytes]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTLOOP_"))}
    upstream = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gateway", "--serve-upstream", "0"],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    assert upstream.stdout is not None
    line = upstream.stdout.readline().decode()
    upstream_url = f"http://127.0.0.1:{line.split()[1]}"
    site = work / "site"
    source = work / "plugin"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [*PIP, "install", "--no-deps", "--target", str(site), str(source)],
        check=True,
        capture_output=True,
    )
    port = free_port()
    command = [*GATEWAY, "--upstream", upstream_url, "--port", str(port), "--plugin", "gwtest"]
    command += ["--store", f"sqlite:///{work}/s.db"]
    gateway = subprocess.Popen(
        command,
        env={**env, "PYTHONPATH": str(site)},
        cwd=work,
    )
    gateway_url = f"http://127.0.0.1:{port}"
    wait_healthy(gateway_url, gateway)
    return upstream_url, gateway_url, [gateway, upstream]


def start_forwarder(upstream_url: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.gateway", "--serve-forwarder", str(port)]
    forwarder = subprocess.Popen([*command, "--upstream", upstream_url], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, forwarder)
    return url, forwarder


# --------------------------------------------------------------------------- measures


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def passthrough(targets: dict[str, str], n: int) -> dict[str, list[float]]:
    """`n` plain requests to each target, in a rotating order; seconds each."""
    times: dict[str, list[float]] = {name: [] for name in targets}
    clients = {
        name: anthropic.AsyncAnthropic(base_url=url, api_key="sk-bench", max_retries=0)
        for name, url in targets.items()
    }
    for _ in range(20):  # warm up connections and code paths
        for client in clients.values():
            await client.messages.create(**PLAIN)
    names = list(targets)
    for i in range(n):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            await clients[name].messages.create(**PLAIN)
            times[name].append(time.perf_counter() - started)
    for client in clients.values():
        await client.close()
    return times


async def first_byte(direct: str, gateway: str, n: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    headers = {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01"}
    body = {**PLAIN, "stream": True}
    async with httpx2.AsyncClient() as http:
        for i in range(n + 20):
            order = ("direct", "gateway") if i % 2 else ("gateway", "direct")
            for name in order:
                url = (direct if name == "direct" else gateway) + "/v1/messages"
                started = time.perf_counter()
                elapsed = None
                async with http.stream("POST", url, json=body, headers=headers) as response:
                    async for _ in response.aiter_raw():
                        if elapsed is None:
                            elapsed = time.perf_counter() - started
                assert elapsed is not None
                if i >= 20:
                    times[name].append(elapsed)
    return times


async def load(gateway: str, conversations: int) -> dict[str, Any]:
    client = anthropic.AsyncAnthropic(
        base_url=gateway, api_key="sk-bench", max_retries=0, timeout=120
    )
    outcomes: list[str] = []
    durations: list[float] = []

    async def converse(i: int) -> None:
        started = time.perf_counter()
        messages: list[Any] = [{"role": "user", "content": f"conversation {i}"}]
        try:
            first = await client.messages.create(
                model="bench-mixed", max_tokens=64, messages=messages, tools=[CLIENT_TOOL]
            )
            calls = [b for b in first.content if b.type == "tool_use"]
            assert first.stop_reason == "tool_use" and [c.name for c in calls] == ["client_tool"]
            messages += [
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": calls[0].id, "content": "1"}
                    ],
                },
            ]
            second = await client.messages.create(
                model="bench-mixed", max_tokens=64, messages=messages, tools=[CLIENT_TOOL]
            )
            ok = second.stop_reason == "end_turn" and second.content[0].type == "text"
            outcomes.append("ok" if ok else f"unexpected {second.stop_reason}")
        except Exception as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}"[:200])
        durations.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for i in range(conversations):
            group.start_soon(converse, i)
    wall = time.perf_counter() - started
    await client.close()
    failures = [o for o in outcomes if o != "ok"]
    return {
        "conversations": conversations,
        "ok": len(outcomes) - len(failures),
        "failures": failures[:5],
        "wall": wall,
        "p50": quantile(durations, 0.5),
        "p99": quantile(durations, 0.99),
    }


# --------------------------------------------------------------------------- report


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def server_stack() -> str:
    """What uvicorn runs the gateway on here (its `auto` choice of HTTP parser and loop),
    and the HTTP client of the gateway's upstream requests."""
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    client = "aiohttp" if importlib.util.find_spec("aiohttp") else "httpx2"
    return f"uvicorn {uvicorn.__version__} ({http}, {loop}); upstream client: {client}"


def report(pt: dict[str, list[float]], fb: dict[str, list[float]], ld: dict[str, Any]) -> str:
    added50 = quantile(pt["gateway"], 0.5) - quantile(pt["direct"], 0.5)
    added99 = quantile(pt["gateway"], 0.99) - quantile(pt["direct"], 0.99)
    hop50 = quantile(pt["hop"], 0.5) - quantile(pt["direct"], 0.5)
    hop99 = quantile(pt["hop"], 0.99) - quantile(pt["direct"], 0.99)
    ttfb50 = quantile(fb["gateway"], 0.5) - quantile(fb["direct"], 0.5)
    ttfb99 = quantile(fb["gateway"], 0.99) - quantile(fb["direct"], 0.99)
    all_ok = ld["ok"] == ld["conversations"]
    completed = f"{ld['ok']}/{ld['conversations']}"

    def verdict(met: bool, detail: str) -> str:
        return f"{'met' if met else 'NOT met'} ({detail})"

    cpus = os.cpu_count()
    lines = [
        "# Gateway benchmark results",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {cpus} CPUs; {platform.platform()}",
        f"- Python {platform.python_version()}; anthropic {anthropic.__version__}; "
        f"gateway server: {server_stack()}",
        "- Command: `python -m benchmarks.gateway` (upstream, gateway, baseline hop and "
        "client in four processes on this machine; gateway store: sqlite)",
        "- The baseline hop is a bare ASGI app on the same uvicorn forwarding the bytes with "
        "the gateway's upstream HTTP client (no SDK, no loop, no sessions), measured in the "
        "same rotation as the direct and gateway requests.",
        "",
        "| Measure | Direct p50 | Direct p99 | Gateway p50 | Gateway p99 | Added p50 | Added p99 "
        "| Target | Verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
        f"| passthrough request, ms ({len(pt['direct'])} each) | {ms(quantile(pt['direct'], 0.5))} "
        f"| {ms(quantile(pt['direct'], 0.99))} | {ms(quantile(pt['gateway'], 0.5))} "
        f"| {ms(quantile(pt['gateway'], 0.99))} | {ms(added50)} | {ms(added99)} | ≤ 2 ms p50 added "
        f"| {verdict(added50 <= 0.002, f'{ms(added50)} ms')} |",
        f"| baseline: a bare forwarding hop, ms ({len(pt['hop'])} each) "
        f"| {ms(quantile(pt['direct'], 0.5))} | {ms(quantile(pt['direct'], 0.99))} "
        f"| {ms(quantile(pt['hop'], 0.5))} | {ms(quantile(pt['hop'], 0.99))} "
        f"| {ms(hop50)} | {ms(hop99)} | (none: what any hop costs here) "
        f"| gateway beyond the hop: {ms(added50 - hop50)} ms p50 |",
        f"| first streamed byte, ms ({len(fb['direct'])} each) | {ms(quantile(fb['direct'], 0.5))} "
        f"| {ms(quantile(fb['direct'], 0.99))} | {ms(quantile(fb['gateway'], 0.5))} "
        f"| {ms(quantile(fb['gateway'], 0.99))} | {ms(ttfb50)} | {ms(ttfb99)} "
        f"| ≤ 5 ms after the upstream's | {verdict(ttfb50 <= 0.005, f'{ms(ttfb50)} ms')} |",
        "",
        "| Load | Conversations | Completed | Wall s | Per conversation p50 ms | p99 ms | Target "
        "| Verdict |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        f"| mixed turns at once (2 requests, 3 upstream rounds each) | {ld['conversations']} "
        f"| {ld['ok']} | {ld['wall']:.2f} | {ms(ld['p50'])} | {ms(ld['p99'])} "
        f"| all complete, every upstream history valid "
        f"| {verdict(all_ok, completed)} |",
    ]
    if ld["failures"]:
        lines += ["", "First failures:", "", *[f"- `{f}`" for f in ld["failures"]]]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        upstream, gateway, processes = start_processes(Path(tmp))
        try:
            hop, forwarder = start_forwarder(upstream)
            processes.append(forwarder)
            targets = {"direct": upstream, "hop": hop, "gateway": gateway}
            pt = await passthrough(targets, args.requests)
            fb = await first_byte(upstream, gateway, args.requests)
            ld = await load(gateway, args.conversations)
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    return report(pt, fb, ld)


def main(argv: Sequence[str] | None = None, run: Callable[..., Any] = anyio.run) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway")
    parser.add_argument("--requests", type=int, default=1000, help="passthrough requests each")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-forwarder", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream)
        return
    if args.serve_forwarder is not None:
        serve_forwarder(args.serve_forwarder, args.upstream)
        return
    text = run(main_async, args)
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
        print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
