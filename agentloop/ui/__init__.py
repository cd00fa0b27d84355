"""Front ends watching runs: AG-UI and the AI SDK's UI message stream, and a chat page.

Each protocol has a plain translation of a run's events (`AGUIEvents`,
`UIMessageChunks`) and an ASGI endpoint serving it (`AGUIEndpoint`, `VercelAIEndpoint`)
that a Starlette, FastAPI or Django (ASGI) service mounts; `chat_app` is the page that
`agentloop chat --web` serves. Needs the `ui` extra (Starlette, uvicorn) for the page.
"""

from .agui import AGUIEvents as AGUIEvents
from .agui_endpoint import AGUIEndpoint as AGUIEndpoint
from .history import agui_history as agui_history
from .history import ui_message_history as ui_message_history
from .page import chat_app as chat_app
from .paused import PausedRun as PausedRun
from .paused import PausedRuns as PausedRuns
from .serving import OnResult as OnResult
from .serving import UIEndpoint as UIEndpoint
from .vercel import UIMessageChunks as UIMessageChunks
from .vercel_endpoint import VercelAIEndpoint as VercelAIEndpoint

__all__ = (
    "AGUIEndpoint",
    "AGUIEvents",
    "OnResult",
    "PausedRun",
    "PausedRuns",
    "UIEndpoint",
    "UIMessageChunks",
    "VercelAIEndpoint",
    "agui_history",
    "chat_app",
    "ui_message_history",
)
