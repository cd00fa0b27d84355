"""Test doubles for agentloop and its plugins: a scripted model and a local Messages API.

`ScriptedProvider` answers in process; `MessagesServer` serves the same script over HTTP
on 127.0.0.1 (JSON and SSE) so the real `AsyncAnthropic` client and `AnthropicProvider`
are exercised end to end. Both check every request's history with the linter.
"""

from ..providers.scripted import RawResponse as RawResponse
from ..providers.scripted import ScriptedModel as ScriptedModel
from ..providers.scripted import ScriptedProvider as ScriptedProvider
from ..providers.scripted import ScriptExhausted as ScriptExhausted
from ..providers.scripted import reply as reply
from ..providers.scripted import text as text
from ..providers.scripted import tool_call as tool_call
from .server import MessagesServer as MessagesServer
from .server import sse_events as sse_events

__all__ = (
    "MessagesServer",
    "RawResponse",
    "ScriptExhausted",
    "ScriptedModel",
    "ScriptedProvider",
    "reply",
    "sse_events",
    "text",
    "tool_call",
)
