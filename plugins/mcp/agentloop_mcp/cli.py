"""`agentloop mcp`: a configured server's resources and prompts, from the command line.

    agentloop mcp resources SERVER            the resources it lists
    agentloop mcp templates SERVER            its resource templates (URIs to fill in)
    agentloop mcp read SERVER URI             one resource's contents
    agentloop mcp prompts SERVER              the prompts it lists, with their arguments
    agentloop mcp prompt SERVER NAME [K=V..]  one prompt, filled in
    agentloop mcp login SERVER                log in with OAuth (opens the browser)
    agentloop mcp logout SERVER               forget its OAuth tokens

The server comes from `--mcp-config FILE` (or `AGENTLOOP_MCP_CONFIG`); only that server
is started, and it stops when the command ends. Its arguments are added by
`agentloop_mcp.plugin`, which imports this module only when the command runs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import anyio
import mcp.types as mcp_types
from agentloop import ConfigurationError

from .config import MCPServer, load_config
from .source import MCPToolSource

__all__ = ("mcp_command",)


def mcp_command(args: argparse.Namespace) -> int:
    """Run `agentloop mcp`; prints the answer and returns 0.

    Raises:
        ConfigurationError: no config, an unknown server, a missing URI or prompt name.
    """
    path = args.mcp_config or os.environ.get("AGENTLOOP_MCP_CONFIG", "").strip()
    if not path:
        raise ConfigurationError("agentloop mcp needs --mcp-config FILE (or AGENTLOOP_MCP_CONFIG)")
    servers = {s.name: s for s in load_config(path)}
    if args.server not in servers:
        known = ", ".join(servers) or "none"
        raise ConfigurationError(f"no MCP server {args.server!r} in {path} (servers: {known})")
    if args.action in ("read", "prompt") and not args.item:
        what = "a resource URI" if args.action == "read" else "a prompt name"
        raise ConfigurationError(f"agentloop mcp {args.action} needs {what}")
    if args.action in ("login", "logout"):
        return _account(servers[args.server], args.action)
    lines = anyio.run(_answer, servers[args.server], args)
    print("\n".join(lines))
    return 0


async def _answer(server: Any, args: argparse.Namespace) -> list[str]:
    async with MCPToolSource([server], strict=True) as source:
        name = server.name
        if args.action == "resources":
            return [_resource(r) for r in await source.list_resources(name)] or ["(none)"]
        if args.action == "templates":
            templates = await source.list_resource_templates(name)
            return [_template(t) for t in templates] or ["(none)"]
        if args.action == "read":
            return [_contents(c) for c in await source.read_resource(name, args.item)]
        if args.action == "prompts":
            return [_prompt(p) for p in await source.list_prompts(name)] or ["(none)"]
        filled = await source.get_prompt(name, args.item, _pairs(args.arguments))
        return [f"{m.role}: {_text(m.content)}" for m in filled.messages]


def _account(server: MCPServer, action: str) -> int:
    """`login` or `logout`: the OAuth tokens of `server` (see `agentloop_mcp.auth`)."""
    from .auth import login, logout, token_path

    if server.auth is None:
        raise ConfigurationError(
            f'MCP server {server.name!r} does not use OAuth: add "auth": "oauth" to its entry'
        )
    if action == "logout":
        forgot = logout(server)
        print(f"{'Forgot' if forgot else 'There were no'} OAuth tokens for {server.name!r}")
        return 0
    anyio.run(login, server)
    print(f"Logged in to {server.name!r}; tokens kept in {token_path(server)}")
    return 0


def _pairs(words: list[str]) -> dict[str, str]:
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ConfigurationError(f"prompt arguments are KEY=VALUE, got {word!r}")
        pairs[key] = value
    return pairs


def _resource(resource: mcp_types.Resource) -> str:
    kind = f" ({resource.mime_type})" if resource.mime_type else ""
    about = f": {resource.description}" if resource.description else ""
    return f"{resource.uri}  {resource.name}{kind}{about}"


def _template(template: mcp_types.ResourceTemplate) -> str:
    kind = f" ({template.mime_type})" if template.mime_type else ""
    about = f": {template.description}" if template.description else ""
    return f"{template.uri_template}  {template.name}{kind}{about}"


def _contents(contents: mcp_types.TextResourceContents | mcp_types.BlobResourceContents) -> str:
    if isinstance(contents, mcp_types.TextResourceContents):
        return contents.text
    size = len(contents.blob) * 3 // 4
    return f"[{contents.uri}: {contents.mime_type or 'binary'}, about {size} bytes]"


def _prompt(prompt: mcp_types.Prompt) -> str:
    names = [a.name + ("" if a.required else "?") for a in prompt.arguments or []]
    about = f": {prompt.description}" if prompt.description else ""
    return f"{prompt.name}({', '.join(names)}){about}"


def _text(content: Any) -> str:
    if isinstance(content, mcp_types.TextContent):
        return content.text
    if isinstance(content, mcp_types.EmbeddedResource):
        return _contents(content.resource)
    return f"[{getattr(content, 'type', 'content')}]"
