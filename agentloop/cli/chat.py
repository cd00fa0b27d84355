"""`agentloop chat --web`: the chat page (`agentloop.ui.chat_app`) on uvicorn.

The agent is built as `agentloop run` builds it: the plugins' setups, the exposed tools,
`--require-approval`, and the model (Claude with an API key, else the first exposed
plugin's offline model). Calls that wait for approval show approve/deny buttons on the
page.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from agentloop.defaults import DEFAULT_MODEL
from agentloop.errors import ConfigurationError

from .exits import EXIT_OK
from .values import port, whole_number

if TYPE_CHECKING:
    from agentloop.plugins import PluginManager

__all__ = ("add_chat_options", "chat_command")


def add_chat_options(chat: argparse.ArgumentParser) -> None:
    """The options of `agentloop chat` (the plugins add theirs through their hook)."""
    chat.add_argument("--web", action="store_true", help="serve the chat page (required)")
    chat.add_argument("--host", default="127.0.0.1", help="address to listen on")
    chat.add_argument("--port", type=port, default=8000, help="port to listen on")
    chat.add_argument("--model", default=DEFAULT_MODEL, help="model name")
    chat.add_argument("--system", help="system prompt")
    chat.add_argument(
        "--plugin",
        action="append",
        dest="plugins",
        metavar="NAME",
        help="expose this plugin's tools (repeatable; default: the plugins that ask for it)",
    )
    chat.add_argument(
        "--tool", action="append", dest="tools", metavar="NAME", help="expose only these tools"
    )
    chat.add_argument(
        "--require-approval",
        action="append",
        metavar="TOOL",
        help="ask on the page before each call of this tool (repeatable)",
    )
    chat.add_argument("--max-rounds", type=whole_number, default=10, help="model requests")
    chat.add_argument(
        "--offline", action="store_true", help="run on a plugin's offline model even with a key"
    )


def chat_command(args: argparse.Namespace, *, manager: PluginManager) -> int:
    """`agentloop chat --web`: serve the chat page until Ctrl-C."""
    if not args.web:
        raise ConfigurationError(
            "agentloop chat has one front end today, the web page: add --web "
            "(`agentloop run PROMPT` runs one prompt in the terminal)"
        )
    # Imported here, not at the top: building the parser stays quick.
    from agentloop.agent import Agent

    from .logs import configure_logging
    from .setups import choose_tools, provider_for, run_deps, run_setups, system_prompt

    try:
        import uvicorn

        from agentloop.ui import chat_app
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"{exc.name} is not installed: pip install 'agentloop-runner[ui]'"
        ) from exc
    setups = run_setups(manager, args)
    tools = choose_tools(manager, setups, plugins=args.plugins, tools=args.tools)
    sources = {t.source for t in tools}
    exposed = {name: setup for name, setup in setups.items() if name in sources}
    provider = provider_for(exposed, tools, offline=args.offline)
    configure_logging(json_logs=args.log_json, verbose=args.verbose, progress=None)
    agent = Agent(
        model=args.model,
        provider=provider,
        system=system_prompt(args.system, exposed),
        tools=tools,
        max_rounds=args.max_rounds,
        approval_required=set(args.require_approval or ()),
    )
    app = chat_app(agent, deps=run_deps(exposed))
    print(f"agentloop chat on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK
