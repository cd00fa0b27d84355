"""The front-end layer: the adapters against the protocols' npm clients, the chat page
in Chromium. Helpers are in _ui.py and tests/support.py."""

from __future__ import annotations

import pytest
from _ui import NodeClient, npm_prefix


@pytest.fixture(scope="module")
def agui_client() -> NodeClient:
    """`@ag-ui/client`'s `HttpAgent` (tests/ui/agui_client.mjs) for an `AGUIEndpoint`."""
    return _installed(NodeClient("@ag-ui/client", "agui_client.mjs", "/agui"))


@pytest.fixture(scope="module")
def ai_chat() -> NodeClient:
    """The `ai` package's chat (tests/ui/ai_chat.mjs) for a `VercelAIEndpoint`."""
    return _installed(NodeClient("ai", "ai_chat.mjs", "/api/chat"))


def _installed(client: NodeClient) -> NodeClient:
    npm_prefix(client.package)  # installs it on first use, or skips the module's tests
    return client
