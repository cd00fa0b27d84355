"""An MCP server over streamable HTTP that wants OAuth, with its own authorization server.

Run as `python oauth_server.py PORT [--sse]`: the MCP endpoint is `/mcp` (streamable HTTP)
or `/sse` (the legacy SSE transport), and the mcp SDK's auth
routes (metadata, `/register`, `/authorize`, `/token`, `/revoke`) are served on the same
port by an in-memory provider that approves every authorization at once (the browser
step a test drives is one GET that redirects to the client's callback). `/test/...` lets
a test look at and change the server's state: counts, expire or revoke every token,
refuse every token while still refreshing them, or start afresh.
"""

from __future__ import annotations

import secrets
import sys
import time

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer as SDKServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class AutoApprove:
    """An authorization server in memory that says yes to every client and request."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every client, code and token, as a fresh server would."""
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.counts = {"registrations": 0, "authorizations": 0, "refreshes": 0}
        self.refuse_all = False  # the MCP endpoint takes no token (refreshes still work)

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info
        self.counts["registrations"] += 1

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        code = AuthorizationCode(
            code=secrets.token_urlsafe(16),
            scopes=params.scopes or ["tools"],
            expires_at=time.time() + 300,
            client_id=str(client.client_id),
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        self.codes[code.code] = code
        self.counts["authorizations"] += 1
        return construct_redirect_uri(str(params.redirect_uri), code=code.code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[authorization_code.code]
        return self._issue(str(client.client_id), authorization_code.scopes)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self,
        client: OAuthClientInformationFull,
        refresh_token: RefreshToken,
        scopes: list[str],
    ) -> OAuthToken:
        del self.refresh[refresh_token.token]
        self.counts["refreshes"] += 1
        return self._issue(str(client.client_id), scopes or refresh_token.scopes)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if (
            found is None
            or self.refuse_all
            or (found.expires_at is not None and found.expires_at < time.time())
        ):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client_id: str, scopes: list[str]) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=int(time.time()) + 3600
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes)
        return OAuthToken(
            access_token=access, expires_in=3600, refresh_token=refresh, scope=" ".join(scopes)
        )


def build(port: int, endpoint: str = "/mcp") -> SDKServer:
    base = f"http://127.0.0.1:{port}"
    provider = AutoApprove()
    server = SDKServer(
        "oauth-test",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,  # type: ignore[arg-type]
            resource_server_url=f"{base}{endpoint}",  # type: ignore[arg-type]
            validate_token_resource=False,
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=["tools"], default_scopes=["tools"]
            ),
            revocation_options=RevocationOptions(enabled=True),
            required_scopes=["tools"],
        ),
    )

    @server.tool()
    def whoami() -> str:
        """Say that the caller got in."""
        return "signed in"

    @server.custom_route("/test/counts", methods=["GET"])
    async def counts(request: Request) -> Response:
        return JSONResponse(provider.counts)

    @server.custom_route("/test/expire", methods=["POST"])
    async def expire(request: Request) -> Response:
        for token in provider.access.values():
            token.expires_at = int(time.time()) - 1
        return JSONResponse({"expired": len(provider.access)})

    @server.custom_route("/test/reset", methods=["POST"])
    async def reset(request: Request) -> Response:
        provider.reset()
        return JSONResponse({"reset": True})

    @server.custom_route("/test/refuse", methods=["POST"])
    async def refuse(request: Request) -> Response:
        provider.refuse_all = True
        return JSONResponse({"refusing": True})

    @server.custom_route("/test/revoke", methods=["POST"])
    async def revoke(request: Request) -> Response:
        provider.access.clear()
        provider.refresh.clear()
        return JSONResponse({"revoked": True})

    return server


if __name__ == "__main__":
    port = int(sys.argv[1])
    if sys.argv[2:] == ["--sse"]:
        build(port, "/sse").run("sse", host="127.0.0.1", port=port)
    else:
        build(port).run("streamable-http", host="127.0.0.1", port=port)
