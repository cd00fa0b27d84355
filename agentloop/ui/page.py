"""The chat page: a Starlette app serving the page and the AG-UI endpoint it talks to.

`chat_app(agent)` serves `static/index.html` (plain HTML, CSS and JS shipped in the
package: no build step, nothing fetched from elsewhere) at `/`, and the run behind it at
`/agui` (`AGUIEndpoint`). `agentloop chat --web` runs it on uvicorn.
"""

from __future__ import annotations

from typing import Any

from agentloop.agent import Agent

from .agui_endpoint import AGUIEndpoint
from .serving import OnResult

__all__ = ("chat_app",)


def chat_app(agent: Agent[Any], *, deps: Any = None, on_result: OnResult | None = None) -> Any:
    """A Starlette app: the chat page at `/`, its AG-UI endpoint at `/agui`.

    Args:
        agent: The agent each prompt of the page runs.
        deps: The runs' `deps`, handed to the tools.
        on_result: Called with each run's result, final or partial (see `AGUIEndpoint`).

    Returns:
        The ASGI app (`starlette.applications.Starlette`), with `/healthz` too.

    Raises:
        ModuleNotFoundError: Starlette is not installed (the `ui` extra).
    """
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, PlainTextResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    static = StaticFiles(packages=[("agentloop.ui", "static")])
    index = static.lookup_path("index.html")[0]

    async def page(request: Any) -> Response:
        return FileResponse(index, media_type="text/html")

    async def healthz(request: Any) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/", page, methods=["GET"]),
            Route("/agui", AGUIEndpoint(agent, deps=deps, on_result=on_result), methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Mount("/static", static),
        ]
    )
