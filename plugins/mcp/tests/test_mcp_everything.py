"""The reference server, `@modelcontextprotocol/server-everything`, over stdio and HTTP.

Every tool it lists once the client announces its capabilities is called once, and what
the model would receive is checked. The server is installed from the npm registry into a
cache directory (`.ci/run` does it first; the fixture does it when it is missing); the
tests are skipped, saying why, when npm is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp.types as mcp_types
import pytest
from _mcp_support import free_port, wait_until
from agentloop import Agent, AnthropicProvider, ToolProgress, ToolUserContent
from agentloop.messages import ImageBlock, TextBlock
from agentloop.pricing import cost_of
from agentloop.result import Usage
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

from agentloop_mcp import MCPSampling, MCPServer, MCPToolSource

PACKAGE = "@modelcontextprotocol/server-everything@2026.8.31"
PREFIX = Path(
    os.environ.get("AGENTLOOP_TEST_NPM_PREFIX")
    or Path.home() / ".cache" / "agentloop-tests" / "npm"
)
"""Where `.ci/run` and this module install the server (`npm install --prefix`)."""


@pytest.fixture(scope="module")
def everything() -> str:
    """The server's executable, installed on first use; skips without npm."""
    binary = PREFIX / "node_modules" / ".bin" / "mcp-server-everything"
    if binary.exists():
        return str(binary)
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: these tests run @modelcontextprotocol/server-everything")
    done = subprocess.run(
        [npm, "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", PACKAGE],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not binary.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"npm could not install {PACKAGE} into {PREFIX}: {last}")
    return str(binary)


@pytest.fixture(params=["stdio", "http"])
async def declared(
    request: pytest.FixtureRequest, everything: str, tmp_path: Path
) -> AsyncIterator[MCPServer]:
    options: dict[str, Any] = {"name": "everything", "roots": (str(tmp_path),)}
    if request.param == "stdio":
        yield MCPServer.stdio(everything, ["stdio"], **options)
        return
    port = free_port()
    process = await anyio.open_process(
        [everything, "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def accepts() -> bool:
            import socket

            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        await wait_until(accepts, "server-everything over HTTP")
        yield MCPServer.http(f"http://127.0.0.1:{port}/mcp", **options)
    finally:
        process.kill()
        await process.wait()
        await process.aclose()


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.text for b in content or [] if isinstance(b, TextBlock))


def images(content: Any) -> list[ImageBlock]:
    return [b for b in content if isinstance(b, ImageBlock)] if isinstance(content, list) else []


CALLS: dict[str, tuple[dict[str, Any], Callable[[Any, Path], None]]] = {}


def expect(
    name: str, arguments: dict[str, Any] | None = None
) -> Callable[[Callable[[Any, Path], None]], None]:
    def register(check: Callable[[Any, Path], None]) -> None:
        CALLS[name] = (arguments or {}, check)

    return register


@expect("echo", {"message": "hello"})
def _echo(content: Any, root: Path) -> None:
    assert content == "Echo: hello"


@expect("get-sum", {"a": 2, "b": 3})
def _sum(content: Any, root: Path) -> None:
    assert "5" in content


@expect("get-env")
def _env(content: Any, root: Path) -> None:
    assert isinstance(json.loads(content), dict)


@expect("get-tiny-image")
def _image(content: Any, root: Path) -> None:
    [image] = images(content)
    assert image.source["media_type"] == "image/png"
    assert image.source["data"] not in text_of(content)  # the image once, not as text too


@expect("get-annotated-message", {"messageType": "debug", "includeImage": True})
def _annotated(content: Any, root: Path) -> None:
    # The debug text is for the assistant; the image is annotated for the user only.
    assert isinstance(content, str) and "debug" in content.lower()


@expect("get-structured-content", {"location": "Chicago"})
def _structured(content: Any, root: Path) -> None:
    text = text_of(content)
    assert "temperature" in text and text.count("temperature") == 1  # once, not twice


@expect("get-resource-links", {"count": 2})
def _links(content: Any, root: Path) -> None:
    assert text_of(content).count("Resource link:") == 2


@expect("get-resource-reference", {"resourceType": "Text", "resourceId": 1})
def _reference(content: Any, root: Path) -> None:
    assert "\nResource demo://" in "\n" + text_of(content)  # the embedded text resource, once


@expect("get-roots-list")
def _roots(content: Any, root: Path) -> None:
    assert root.as_uri() in text_of(content)


@expect(
    "gzip-file-as-resource",
    {"name": "a.gz", "data": "data:text/plain;base64,aGVsbG8=", "outputType": "resource"},
)
def _gzip(content: Any, root: Path) -> None:
    assert "a.gz" in text_of(content)


@expect("toggle-simulated-logging")
def _logging(content: Any, root: Path) -> None:
    assert "logging" in text_of(content).lower()


@expect("toggle-subscriber-updates")
def _updates(content: Any, root: Path) -> None:
    assert "update" in text_of(content).lower()


@expect("trigger-elicitation-request")
def _elicit(content: Any, root: Path) -> None:
    assert "accept" in text_of(content).lower()


@expect("trigger-url-elicitation", {"url": "https://example.com/consent"})
def _url_elicit(content: Any, root: Path) -> None:
    assert "accept" in text_of(content).lower()


@expect("trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 20})
def _sample(content: Any, root: Path) -> None:
    assert "sampled answer" in text_of(content)


@expect("trigger-long-running-operation", {"duration": 0.4, "steps": 2})
def _long(content: Any, root: Path) -> None:
    assert "completed" in text_of(content).lower()


async def test_every_tool_once_capabilities_are_announced(
    declared: MCPServer, tmp_path: Path
) -> None:
    asked: list[str] = []

    async def elicit(server: str, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        if isinstance(params, mcp_types.ElicitRequestURLParams):
            return mcp_types.ElicitResult(action="accept")
        fields = (params.requested_schema or {}).get("properties", {})
        content = {name: _sample_value(spec) for name, spec in fields.items()}
        return mcp_types.ElicitResult(action="accept", content=content)

    model = ScriptedProvider(lambda request: reply("a sampled answer"))
    sampling = MCPSampling(provider=model, model="claude-test")
    async with MCPToolSource([declared], sampling=sampling, elicitation=elicit) as source:
        assert source.errors == []
        assert [p.tool for p in source.skipped] == ["simulate-research-query"]  # needs tasks
        tools = {t.name: t for t in source.tools()}
        assert sorted(tools) == sorted(CALLS), "server-everything's tools changed"
        results = {}
        for name, (arguments, _check) in CALLS.items():
            try:
                results[name] = await tools[name](**arguments)
            except Exception as exc:  # collected: one failing tool names itself
                results[name] = exc
        failures = {n: r for n, r in results.items() if isinstance(r, Exception)}
        assert failures == {}
        for name, (_arguments, check) in CALLS.items():
            check(results[name], tmp_path)
        assert len(asked) == 2

        # Progress notifications of the long operation reach a streamed run.
        script = [
            reply(
                tool_call("trigger-long-running-operation", {"duration": 0.4, "steps": 2}, id="t1")
            ),
            reply("done"),
        ]
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        async with agent.run_stream("go") as stream:
            progress = [e for e in [e async for e in stream] if isinstance(e, ToolProgress)]
        assert [(p.progress, p.total) for p in progress] == [(1, 2), (2, 2)]


def _sample_value(spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    if "enum" in spec:
        return spec["enum"][0]
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return spec.get("minimum", 1)
    return spec.get("default", "Ada")


async def test_sampling_is_answered_by_the_run_model_and_counted(declared: MCPServer) -> None:
    """With no `MCPSampling`, `trigger-sampling-request` reaches the calling run's model."""
    model_name = "claude-sonnet-4-6"
    script = [
        reply(
            tool_call("trigger-sampling-request", {"prompt": "Say hi", "maxTokens": 20}),
            usage={"input_tokens": 100, "output_tokens": 20},
        ),
        reply("hi from the run's model", usage={"input_tokens": 30, "output_tokens": 5}),
        reply("done", usage={"input_tokens": 150, "output_tokens": 10}),
    ]
    async with MessagesServer(script) as model, MCPToolSource([declared]) as source:
        provider = AnthropicProvider(model.client())
        agent = Agent(provider=provider, model=model_name, tools=source.tools())
        result = await agent.run("Ask the server to sample.")
    [call] = result.tool_calls
    assert not call.is_error and "hi from the run's model" in text_of(call.output)
    sampled = model.requests[1]
    assert sampled["model"] == model_name and sampled["max_tokens"] == 20
    assert "Say hi" in json.dumps(sampled["messages"])
    assert (result.usage.input_tokens, result.usage.output_tokens) == (280, 35)
    assert result.usage.requests == 3
    costs = [
        cost_of(model_name, Usage(i, o, requests=1)) for i, o in [(100, 20), (30, 5), (150, 10)]
    ]
    assert result.cost == pytest.approx(sum(c for c in costs if c is not None))


async def test_a_block_for_the_user_reaches_the_user_and_not_the_model(everything: str) -> None:
    """`get-annotated-message` annotates its image for the user alone."""
    arguments = {"messageType": "debug", "includeImage": True}
    script = [reply(tool_call("get-annotated-message", arguments, id="t1")), reply("done")]
    async with MCPToolSource([MCPServer.stdio(everything, ["stdio"], name="everything")]) as source:
        agent = Agent(provider=ScriptedProvider(script), tools=source.tools())
        async with agent.start("go") as run:
            shown = [e async for e in run if isinstance(e, ToolUserContent)]
    [event] = shown
    assert (event.tool_use_id, event.name) == ("t1", "get-annotated-message")
    [image] = images(list(event.content))
    assert image.source["media_type"] == "image/png"
    [call] = run.result.tool_calls
    assert "debug" in call.output.lower() and image.source["data"] not in call.output
