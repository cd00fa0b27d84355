"""Server tools for `MessagesServer`: the blocks a script answers with, and the API's checks.

A script plays the API's side of a server tool with these blocks: `server_tool_use`
(the call the API made) followed, in the same assistant message, by its result
(`web_search_result`, `web_fetch_result`, `code_execution_result`,
`tool_search_result`), shaped as the API returns them. The server refuses, as the API
does, a request announcing a tool version without the beta header it needs, or a
deferred tool (`defer_loading`) with no tool search to find it (`request_problem`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.server_tools import BETAS

__all__ = (
    "code_execution_result",
    "request_problem",
    "server_tool_use",
    "tool_search_result",
    "web_fetch_result",
    "web_search_result",
)


def server_tool_use(
    name: str, input: Mapping[str, Any] | None = None, *, id: str | None = None
) -> dict[str, Any]:
    """A `server_tool_use` block: the API calling its tool `name` (a fresh id unless given)."""
    return {
        "type": "server_tool_use",
        "id": id or "srvtoolu_01" + secrets.token_hex(11),
        "name": name,
        "input": dict(input or {}),
    }


def web_search_result(use: Mapping[str, Any], results: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The `web_search_tool_result` answering `use`, one `(url, title)` per result."""
    return {
        "type": "web_search_tool_result",
        "tool_use_id": use["id"],
        "content": [
            {
                "type": "web_search_result",
                "url": url,
                "title": title,
                "encrypted_content": "enc_" + secrets.token_hex(8),
                "page_age": None,
            }
            for url, title in results
        ],
    }


def web_fetch_result(use: Mapping[str, Any], url: str, text: str) -> dict[str, Any]:
    """The `web_fetch_tool_result` answering `use`: the page at `url`, as plain text."""
    return {
        "type": "web_fetch_tool_result",
        "tool_use_id": use["id"],
        "content": {
            "type": "web_fetch_result",
            "url": url,
            "retrieved_at": "2025-01-01T00:00:00Z",
            "content": {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": text},
                "title": url,
            },
        },
    }


def code_execution_result(
    use: Mapping[str, Any], stdout: str, *, stderr: str = "", return_code: int = 0
) -> dict[str, Any]:
    """The `bash_code_execution_tool_result` answering `use` (a `bash_code_execution`)."""
    return {
        "type": "bash_code_execution_tool_result",
        "tool_use_id": use["id"],
        "content": {
            "type": "bash_code_execution_result",
            "stdout": stdout,
            "stderr": stderr,
            "return_code": return_code,
            "content": [],
        },
    }


def tool_search_result(use: Mapping[str, Any], tool_names: Sequence[str]) -> dict[str, Any]:
    """The `tool_search_tool_result` answering `use`: references to the tools found."""
    return {
        "type": "tool_search_tool_result",
        "tool_use_id": use["id"],
        "content": {
            "type": "tool_search_tool_search_result",
            "tool_references": [{"type": "tool_reference", "tool_name": n} for n in tool_names],
        },
    }


def request_problem(body: Mapping[str, Any], betas: Sequence[str]) -> str | None:
    """Why the API would refuse a request's server tools, or None.

    `betas` are the request's beta names (its `anthropic-beta` header, split).
    """
    tools = [t for t in body.get("tools") or () if isinstance(t, Mapping)]
    for entry in tools:
        needed = BETAS.get(str(entry.get("type")))
        if needed is not None and needed not in betas:
            return (
                f"tools: the tool type {entry.get('type')} requires the beta header "
                f"'anthropic-beta: {needed}'"
            )
    deferred = [str(t.get("name")) for t in tools if t.get("defer_loading") is True]
    searches = any(str(t.get("type", "")).startswith("tool_search_tool") for t in tools)
    if deferred and not searches:
        return (
            f"tools: {', '.join(deferred)} set defer_loading but no tool search tool is "
            "given to load them"
        )
    return None
