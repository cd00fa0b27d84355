"""OAuth for HTTP servers, against a real server process (tests/oauth_server.py) that is its
own authorization server: the login with the browser step driven by the test, the token
file, its reuse, a refresh, a revoked token, and the configuration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from _mcp_support import free_port
from mcp.shared.auth import OAuthToken

from agentloop_mcp import (
    MCPConfigError,
    MCPConnectError,
    MCPOAuth,
    MCPServer,
    MCPToolSource,
    parse_config,
)
from agentloop_mcp.auth import TOKENS_ENV_VAR, TokenFile, login, token_path

OAUTH_SERVER = Path(__file__).with_name("oauth_server.py")
BROWSER = Path(__file__).with_name("oauth_browser.py")


class OAuthServer:
    """tests/oauth_server.py in a subprocess on 127.0.0.1, and its test-only endpoints."""

    def __init__(self, *, sse: bool = False) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/{'sse' if sse else 'mcp'}"
        self.process = subprocess.Popen(
            [sys.executable, str(OAUTH_SERVER), str(self.port), *(["--sse"] if sse else [])],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not self._answers():
            assert time.monotonic() < deadline, "the OAuth test server did not start"
            time.sleep(0.05)  # polling another process's port; there is no event to wait on

    def _answers(self) -> bool:
        assert self.process.poll() is None, "the OAuth test server exited"
        try:
            return httpx2.get(f"{self.base}/test/counts").status_code == 200
        except httpx2.TransportError:
            return False

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

    def declare(self, name: str = "secured", **auth: object) -> MCPServer:
        # A callback port of the test's own: tests in parallel must not share one.
        oauth = MCPOAuth(callback_port=free_port(), **auth)  # type: ignore[arg-type]
        return MCPServer.http(self.url, name=name, auth=oauth)

    async def counts(self) -> dict[str, int]:
        async with httpx2.AsyncClient() as http:
            response = await http.get(f"{self.base}/test/counts")
        return dict(response.json())

    async def post(self, action: str) -> None:
        async with httpx2.AsyncClient() as http:
            response = await http.post(f"{self.base}/test/{action}")
        assert response.status_code == 200


@pytest.fixture(scope="module")
def oauth_process() -> Iterator[OAuthServer]:
    """One server process for the module (it takes seconds to start); reset for each test."""
    server = OAuthServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def oauth_server(oauth_process: OAuthServer) -> OAuthServer:
    assert httpx2.post(f"{oauth_process.base}/test/reset").status_code == 200
    return oauth_process


@pytest.fixture(autouse=True)
def tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tokens"
    monkeypatch.setenv(TOKENS_ENV_VAR, str(folder))
    return folder


async def approve(url: str) -> None:
    """What a person does with the URL: open it; the server approves at once and sends the
    browser back to the callback page, which this GET follows to its answer."""
    async with httpx2.AsyncClient(follow_redirects=True) as browser:
        page = await browser.get(url)
    assert page.status_code == 200, page.text
    assert "Logged in" in page.text


async def login_in_browser(server: MCPServer) -> None:
    await login(server, approve)


async def whoami(server: MCPServer) -> str:
    async with MCPToolSource([server], strict=True) as source:
        (tool,) = source.tools()
        return str(await tool())


async def test_login_keeps_tokens_in_a_private_file_that_later_runs_use(
    oauth_server: OAuthServer, tokens: Path
) -> None:
    server = oauth_server.declare()
    await login_in_browser(server)

    path = token_path(server)
    assert path.parent == tokens
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored["tokens"]["access_token"] and stored["tokens"]["refresh_token"]
    assert stored["client_info"]["client_id"]
    assert stored["server_url"] == server.url
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 0}

    # Two runs later: the stored token is used, nobody is asked again.
    assert await whoami(server) == "signed in"
    assert await whoami(server) == "signed in"
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 0}


async def test_a_run_without_a_login_fails_with_one_line_saying_how_to_log_in(
    oauth_server: OAuthServer,
) -> None:
    server = oauth_server.declare("remote")
    with pytest.raises(MCPConnectError) as caught:
        await whoami(server)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"cannot connect to MCP server 'remote' ({server.url}): it needs an OAuth login "
        "(no usable token is stored): run `agentloop mcp login remote`"
    )
    # The client registration made on the way is kept for the login; no token is.
    assert "tokens" not in json.loads(token_path(server).read_text())
    await login_in_browser(server)
    assert await whoami(server) == "signed in"
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 0}


async def test_an_expired_access_token_is_refreshed_and_the_new_one_kept(
    oauth_server: OAuthServer,
) -> None:
    server = oauth_server.declare()
    await login_in_browser(server)
    path = token_path(server)
    before = json.loads(path.read_text())
    # An hour later: the server no longer takes the token, and the file says it expired.
    await oauth_server.post("expire")
    path.write_text(json.dumps({**before, "expires_at": before["expires_at"] - 3601}))

    assert await whoami(server) == "signed in"
    after = json.loads(path.read_text())
    assert after["tokens"]["access_token"] != before["tokens"]["access_token"]
    assert after["expires_at"] > before["expires_at"] - 3601
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 1}


async def test_a_refreshed_token_the_server_still_refuses_fails_clearly(
    oauth_server: OAuthServer,
) -> None:
    server = oauth_server.declare()
    await login_in_browser(server)
    path = token_path(server)
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "expires_at": stored["expires_at"] - 3601}))
    await oauth_server.post("refuse")

    with pytest.raises(MCPConnectError, match=r"run `agentloop mcp login secured`$"):
        await whoami(server)
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 1}


async def test_a_revoked_token_fails_clearly_and_a_new_login_mends_it(
    oauth_server: OAuthServer,
) -> None:
    server = oauth_server.declare()
    await login_in_browser(server)
    await oauth_server.post("revoke")

    with pytest.raises(MCPConnectError, match=r"run `agentloop mcp login secured`$"):
        await whoami(server)

    await login_in_browser(server)
    assert await whoami(server) == "signed in"
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 2, "refreshes": 0}

    # The callback port changed in the config: the client registered for the old one is
    # replaced (the authorization server would refuse the new redirect URI).
    moved = oauth_server.declare()
    assert moved.auth != server.auth
    await oauth_server.post("revoke")
    await login_in_browser(moved)
    assert await whoami(moved) == "signed in"
    assert await oauth_server.counts() == {"registrations": 2, "authorizations": 3, "refreshes": 0}


async def test_the_login_command_opens_the_browser_and_runs_use_its_tokens(
    oauth_server: OAuthServer, tmp_path: Path, tokens: Path
) -> None:
    config = tmp_path / "mcp.json"
    entry = {"url": f"{oauth_server.base}/mcp", "auth": {"callback_port": free_port()}}
    config.write_text(json.dumps({"mcpServers": {"secured": entry}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOOP_")}
    env.update(
        AGENTLOOP_MCP_TOKENS=str(tokens),
        AGENTLOOP_MCP_PROTOCOL_CACHE=str(tmp_path / "protocols.json"),
        BROWSER=f"{sys.executable} {BROWSER} %s",
    )

    async def agentloop(*words: str) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "agentloop", *words, "--mcp-config", str(config)]
        return await anyio.run_process(command, env=env, check=False)

    logged_in = await agentloop("mcp", "login", "secured")
    assert logged_in.returncode == 0, logged_in.stderr.decode()
    assert f"{oauth_server.base}/authorize?" in logged_in.stderr.decode()
    assert logged_in.stdout.decode() == (
        f"Logged in to 'secured'; tokens kept in {tokens / 'secured.json'}\n"
    )
    listed = await agentloop("tools", "--mcp-strict")
    assert listed.returncode == 0, listed.stderr.decode()
    assert "whoami" in listed.stdout.decode()

    forgot = await agentloop("mcp", "logout", "secured")
    assert forgot.stdout.decode() == "Forgot OAuth tokens for 'secured'\n"
    refused = await agentloop("tools", "--mcp-strict")
    assert refused.returncode == 2
    errors = refused.stderr.decode()
    assert errors.count("\n") == 1, errors  # one line, no traceback
    assert (
        "it needs an OAuth login (no usable token is stored): run `agentloop mcp login secured`"
        in errors
    )
    assert await oauth_server.counts() == {"registrations": 2, "authorizations": 1, "refreshes": 0}


async def test_a_client_registered_beforehand_logs_in_with_its_id_and_secret(
    oauth_server: OAuthServer,
) -> None:
    port = free_port()
    async with httpx2.AsyncClient() as http:
        registered = await http.post(
            f"{oauth_server.base}/register",
            json={
                "redirect_uris": [f"http://127.0.0.1:{port}/callback"],
                "token_endpoint_auth_method": "client_secret_post",
                "grant_types": ["authorization_code", "refresh_token"],
            },
        )
    client = registered.json()
    server = MCPServer.http(
        oauth_server.url,
        name="mine",
        auth=MCPOAuth(
            client_id=client["client_id"],
            client_secret=client["client_secret"],
            callback_port=port,
        ),
    )
    await login_in_browser(server)
    assert await whoami(server) == "signed in"
    assert "client_info" not in json.loads(token_path(server).read_text())
    assert await oauth_server.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 0}


async def test_oauth_over_the_legacy_sse_transport() -> None:
    sse = OAuthServer(sse=True)
    try:
        server = sse.declare("old")
        assert server.transport == "sse"
        with pytest.raises(MCPConnectError, match=r"run `agentloop mcp login old`$"):
            await whoami(server)
        await login_in_browser(server)
        assert await whoami(server) == "signed in"
        assert await sse.counts() == {"registrations": 1, "authorizations": 1, "refreshes": 0}
    finally:
        sse.stop()


async def test_the_token_file_is_created_private_and_a_garbled_one_is_replaced(
    tokens: Path,
) -> None:
    server = MCPServer.http("https://a.example/mcp", name="a", auth=MCPOAuth())
    storage = TokenFile(token_path(server), "https://a.example/mcp", MCPOAuth())
    storage.path.parent.mkdir()
    storage.path.write_text('{"server_url": "https://a.example/mcp", "tok')  # cut short
    storage.path.chmod(0o644)
    assert await storage.get_tokens() is None

    await storage.set_tokens(OAuthToken(access_token="a1", expires_in=60, refresh_token="r1"))
    assert stat.S_IMODE(storage.path.stat().st_mode) == 0o600
    assert await storage.get_tokens() == OAuthToken(
        access_token="a1", expires_in=60, refresh_token="r1"
    )
    assert storage.path.parent == tokens
    assert [p.name for p in storage.path.parent.iterdir()] == [
        "a.json"
    ]  # no file left half-written
    # Another URL under the same name: its tokens are not these.
    elsewhere = TokenFile(storage.path, "https://b.example/mcp", MCPOAuth())
    assert await elsewhere.get_tokens() is None


def test_auth_in_a_config_file() -> None:
    servers = parse_config(
        {
            "mcpServers": {
                "a": {"url": "https://a.example/mcp", "auth": "oauth"},
                "b": {
                    "url": "https://b.example/mcp",
                    "auth": {"client_id": "agent", "scopes": "read write", "callback_port": 9000},
                },
                "c": {"url": "https://c.example/mcp"},
            }
        }
    )
    assert [s.auth for s in servers] == [
        MCPOAuth(),
        MCPOAuth(client_id="agent", scopes=("read", "write"), callback_port=9000),
        None,
    ]
    assert servers[1].auth is not None
    assert servers[1].auth.redirect_uri == "http://127.0.0.1:9000/callback"


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ("basic", r"mcpServers\.a\.auth: expected \"oauth\" or an object"),
        ({"client": "x"}, r"mcpServers\.a\.auth: unknown key 'client'"),
        ({"callback_port": 70000}, r"mcpServers\.a\.auth: callback_port must be a TCP port"),
        ({"client_secret": "s"}, r"mcpServers\.a\.auth: client_secret needs the client_id"),
        ({"scopes": [1]}, r"mcpServers\.a\.auth\.scopes: expected a list of strings"),
    ],
)
def test_bad_auth_config_is_refused_with_where_and_why(auth: object, message: str) -> None:
    with pytest.raises(MCPConfigError, match=message):
        parse_config({"mcpServers": {"a": {"url": "https://a.example/mcp", "auth": auth}}})


def test_oauth_is_for_http_servers() -> None:
    with pytest.raises(MCPConfigError, match=r"OAuth .* is for servers reached over HTTP"):
        MCPServer.stdio("server", auth=MCPOAuth())
