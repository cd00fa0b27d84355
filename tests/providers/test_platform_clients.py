"""Every client class the `anthropic` SDK ships runs a tool loop against the local server.

The platform clients (Bedrock, Bedrock Mantle, Vertex AI, Foundry, Claude Platform on AWS
and on Google Cloud) each get explicit fake credentials, so none asks a cloud for them:
AWS keys that are really signed with SigV4 (botocore), a Google access token or token
provider, a Foundry key. The server answers each on the paths and in the wire format its
client uses (Bedrock's `invoke` paths and AWS event streams, Vertex's `rawPredict`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest

from agentloop import Agent, AnthropicProvider, tool
from agentloop.errors import (
    BadRequestError,
    ConfigurationError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from agentloop.messages import Message
from agentloop.providers.base import ModelRequest
from agentloop.testing import Fault, MessagesServer, reply, tool_call

MODEL = "claude-sonnet-5-5"
AWS_KEYS = {
    "aws_access_key": "AKIDLOCALTEST",
    "aws_secret_key": "local-secret",
    "aws_region": "us-east-1",
}


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@dataclass(frozen=True)
class Platform:
    """One client class with fake credentials, and how its requests look on the wire."""

    cls: type[Any]
    options: dict[str, Any]
    """The constructor's arguments besides `base_url`: fake credentials, region, ..."""
    path: str
    """Where a (non-streamed) message request goes."""
    auth: Callable[[dict[str, str]], bool]
    """Whether a request's headers carry this client's credentials."""
    counts_tokens: bool = True
    rebuilds_requests: bool = False
    """The client rebuilds a `/v1/messages` request from its JSON (model into the path)."""

    def make(self, base_url: str) -> Any:
        return self.cls(base_url=base_url, max_retries=0, **self.options)


def signed(headers: dict[str, str]) -> bool:
    """Signed with AWS SigV4 (by botocore), with the fake access key."""
    return headers.get("authorization", "").startswith("AWS4-HMAC-SHA256 Credential=AKIDLOCALTEST/")


def bearer(token: str) -> Callable[[dict[str, str]], bool]:
    return lambda headers: headers.get("authorization") == f"Bearer {token}"


def workspace_signed(headers: dict[str, str]) -> bool:
    return signed(headers) and headers.get("anthropic-workspace-id") == "wrkspc_local"


def foundry_key(headers: dict[str, str]) -> bool:
    return headers.get("x-api-key") == headers.get("api-key") == "foundry-key"


BEDROCK_PATH = f"/model/{MODEL}/invoke"
VERTEX_PATH = (
    f"/projects/local-project/locations/us-east5/publishers/anthropic/models/{MODEL}:rawPredict"
)
VERTEX = {"region": "us-east5", "project_id": "local-project", "access_token": "vertex-token"}
BEDROCK = Platform(
    anthropic.AsyncAnthropicBedrock,
    AWS_KEYS,
    BEDROCK_PATH,
    signed,
    counts_tokens=False,
    rebuilds_requests=True,
)

PLATFORMS = [
    pytest.param(
        Platform(
            anthropic.AsyncAnthropic, {"api_key": "sk-local"}, "/v1/messages", bearer("sk-local")
        ),
        id="anthropic",
    ),
    pytest.param(BEDROCK, id="bedrock"),
    pytest.param(
        Platform(
            anthropic.AsyncAnthropicBedrock,
            {"api_key": "bedrock-key", "aws_region": "us-east-1"},
            BEDROCK_PATH,
            bearer("bedrock-key"),
            counts_tokens=False,
            rebuilds_requests=True,
        ),
        id="bedrock-api-key",
    ),
    pytest.param(
        Platform(anthropic.AsyncAnthropicBedrockMantle, AWS_KEYS, "/v1/messages", signed),
        id="bedrock-mantle",
    ),
    pytest.param(
        Platform(
            anthropic.AsyncAnthropicVertex,
            VERTEX,
            VERTEX_PATH,
            bearer("vertex-token"),
            rebuilds_requests=True,
        ),
        id="vertex",
    ),
    pytest.param(
        Platform(
            anthropic.AsyncAnthropicFoundry, {"api_key": "foundry-key"}, "/v1/messages", foundry_key
        ),
        id="foundry",
    ),
    pytest.param(
        Platform(
            anthropic.AsyncAnthropicAWS,
            {"workspace_id": "wrkspc_local", **AWS_KEYS},
            "/v1/messages",
            workspace_signed,
        ),
        id="aws",
    ),
    pytest.param(
        Platform(
            anthropic.AsyncAnthropicGoogleCloud,
            {"token_provider": lambda: "gcp-token"},
            "/v1/messages",
            bearer("gcp-token"),
        ),
        id="google-cloud",
    ),
]

MODES = [pytest.param(False, id="json"), pytest.param(True, id="sse")]


def streamed_path(platform: Platform) -> str:
    return platform.path.replace("/invoke", "/invoke-with-response-stream").replace(
        ":rawPredict", ":streamRawPredict"
    )


@pytest.fixture
async def connect(serve: Callable[..., MessagesServer]) -> Any:
    """A server for `script` and a client of `platform` pointed at it (closed at the end)."""
    clients: list[Any] = []

    def start(platform: Platform, script: Any) -> tuple[MessagesServer, Any]:
        server = serve(script)
        client = platform.make(server.base_url)
        clients.append(client)
        return server, client

    yield start
    for client in clients:
        await client.close()


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("platform", PLATFORMS)
async def test_every_client_runs_a_tool_loop(
    connect: Any, platform: Platform, stream: bool
) -> None:
    script = [reply(tool_call("add", {"a": 1, "b": 2}, id="toolu_1")), reply("3")]
    server, client = connect(platform, script)
    agent = (
        Agent(model=MODEL, provider=AnthropicProvider(client, stream=True), tools=[add])
        if stream
        else Agent(model=MODEL, client=client, tools=[add])
    )
    result = await agent.run("1 + 2?")
    assert (result.text, result.stop_reason) == ("3", "end_turn")
    assert [call.output for call in result.tool_calls] == ["3"]
    first, second = server.model.requests
    assert first["model"] == second["model"] == MODEL
    assert bool(first.get("stream")) is stream
    (answer,) = second["messages"][-1]["content"]
    assert (answer["type"], answer["tool_use_id"], answer["content"]) == (
        "tool_result",
        "toolu_1",
        "3",
    )
    path = streamed_path(platform) if stream else platform.path
    assert [seen.path for seen in server.recorded] == [path, path]
    assert all(platform.auth(seen.headers) for seen in server.recorded)


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_every_client_counts_tokens_or_says_it_cannot(
    connect: Any, platform: Platform
) -> None:
    server, client = connect(platform, [])
    request = ModelRequest(model=MODEL, max_tokens=8, messages=[Message.user("hi")])
    if platform.counts_tokens:
        assert await AnthropicProvider(client).count_tokens(request) > 0
        assert len(server.recorded) == 1 and platform.auth(server.recorded[0].headers)
    else:
        with pytest.raises(ConfigurationError, match="not supported") as info:
            await AnthropicProvider(client).count_tokens(request)
        assert isinstance(info.value.__cause__, anthropic.AnthropicError)
        assert server.recorded == []


@pytest.mark.parametrize(
    ("error_type", "expected"),
    [
        pytest.param("overloaded_error", OverloadedError, id="overloaded"),
        pytest.param("rate_limit_error", RateLimitError, id="rate-limited"),
        pytest.param("api_error", ServerError, id="server-error"),
    ],
)
async def test_a_bedrock_stream_exception_is_typed_and_retried_before_any_block(
    connect: Any, error_type: str, expected: type[Exception]
) -> None:
    broken = Fault.stream_error(reply("never"), after_blocks=0, error_type=error_type)
    server, client = connect(BEDROCK, [broken, broken, reply("ok")])
    request = ModelRequest(model=MODEL, max_tokens=8, messages=[Message.user("hi")])
    provider = AnthropicProvider(client.with_options(max_retries=1), stream=True)
    with pytest.raises(expected) as info:
        await provider.complete(request)
    assert isinstance(info.value.__cause__, anthropic.APIStatusError)
    assert len(server.recorded) == 2
    assert (await provider.complete(request)).text == "ok"


SURROGATE = "name: \udce9"  # a lone surrogate, as os.fsdecode gives for a non-UTF-8 name


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("platform", PLATFORMS)
async def test_a_lone_surrogate_is_sent_escaped_or_refused_before_sending(
    connect: Any, platform: Platform, stream: bool
) -> None:
    server, client = connect(platform, [reply("ok")])
    provider = AnthropicProvider(client, stream=stream)
    request = ModelRequest(model=MODEL, max_tokens=8, messages=[Message.user(SURROGATE)])
    if platform.rebuilds_requests:
        with pytest.raises(BadRequestError, match="lone surrogate") as info:
            await provider.complete(request)
        assert type(client).__name__ in str(info.value)
        assert server.recorded == []
        return
    assert (await provider.complete(request)).text == "ok"
    (sent,) = server.recorded
    assert sent.body["messages"][0]["content"] == SURROGATE
    assert platform.auth(sent.headers)


SYNC_CLIENTS = [
    pytest.param(anthropic.Anthropic, {"api_key": "k"}, id="anthropic"),
    pytest.param(anthropic.AnthropicBedrock, AWS_KEYS, id="bedrock"),
    pytest.param(anthropic.AnthropicBedrockMantle, AWS_KEYS, id="bedrock-mantle"),
    pytest.param(anthropic.AnthropicVertex, VERTEX, id="vertex"),
    pytest.param(anthropic.AnthropicFoundry, {"api_key": "k"}, id="foundry"),
    pytest.param(anthropic.AnthropicAWS, {"workspace_id": "w", **AWS_KEYS}, id="aws"),
    pytest.param(
        anthropic.AnthropicGoogleCloud, {"token_provider": lambda: "t"}, id="google-cloud"
    ),
]


@pytest.mark.parametrize(("cls", "options"), SYNC_CLIENTS)
def test_a_synchronous_client_is_refused_with_the_async_class_to_use(
    cls: type[Any], options: dict[str, Any]
) -> None:
    with cls(base_url="http://127.0.0.1:9", **options) as client:
        with pytest.raises(ConfigurationError, match=f"anthropic.Async{cls.__name__}"):
            Agent(client=client)


async def test_a_refusal_of_the_sdk_itself_is_a_configuration_error() -> None:
    """The SDK checks a platform client's setup as it builds a request: a typed error."""
    client = anthropic.AsyncAnthropicGoogleCloud(
        project="local-project", token_provider=lambda: "gcp-token"
    )  # no workspace and no base_url: the SDK cannot tell where a message goes
    try:
        with pytest.raises(ConfigurationError, match="workspace") as info:
            await Agent(model=MODEL, client=client).run("hi")
    finally:
        await client.close()
    assert isinstance(info.value.__cause__, anthropic.AnthropicError)
    assert info.value.result is not None
    assert info.value.result.messages == [{"role": "user", "content": "hi"}]


def test_every_client_class_the_sdk_exports_is_covered() -> None:
    """A client class a new SDK adds gets a case here."""
    exported = {
        getattr(anthropic, name)
        for name in dir(anthropic)
        if name.startswith(("Anthropic", "AsyncAnthropic"))
        and not issubclass(getattr(anthropic, name), Exception)
    }
    tested = {case.values[0].cls for case in PLATFORMS} | {case.values[0] for case in SYNC_CLIENTS}
    assert exported == tested
