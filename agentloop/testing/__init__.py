"""Test doubles for agentloop and its plugins: a scripted model and a local Messages API.

`ScriptedProvider` answers in process (`SteppedProvider` streams the answers event by
event, with a hook to hold the stream at any point); `MessagesServer` serves the same
script over HTTP on 127.0.0.1 (JSON and SSE) so the real `AsyncAnthropic` client and
`AnthropicProvider` are exercised end to end; `ChatCompletionsServer` serves the same
scripts in the Chat Completions format for `AsyncOpenAI` and `OpenAIChatProvider`. All
check every request's history with the linter.

Scripts hold messages (`reply(...)`), exact HTTP answers (`RawResponse`), failures
(`Fault.rate_limited(retry_after=0.2)`, `Fault.dropped()`, `Fault.stream_error(...)`, ...)
and messages streamed with real pauses (`Paced(reply(...), block_delay=0.25)`).
`MessagesServer(script, prompt_cache=True)` bills each request as Anthropic's prompt
caching would (`PromptCache`). Server tools are scripted with `server_tool_use(...)` and
their results (`web_search_result`, `web_fetch_result`, `code_execution_result`,
`tool_search_result`).
"""

from .caching import PromptCache as PromptCache
from .chat_server import ChatCompletionsServer as ChatCompletionsServer
from .http import RecordedRequest as RecordedRequest
from .scripted import Fault as Fault
from .scripted import Paced as Paced
from .scripted import RawResponse as RawResponse
from .scripted import ScriptedModel as ScriptedModel
from .scripted import ScriptedProvider as ScriptedProvider
from .scripted import ScriptExhausted as ScriptExhausted
from .scripted import reply as reply
from .scripted import text as text
from .scripted import tool_call as tool_call
from .server import MessagesServer as MessagesServer
from .server import sse_events as sse_events
from .server_tools import code_execution_result as code_execution_result
from .server_tools import server_tool_use as server_tool_use
from .server_tools import tool_search_result as tool_search_result
from .server_tools import web_fetch_result as web_fetch_result
from .server_tools import web_search_result as web_search_result
from .stepped import SteppedProvider as SteppedProvider
from .structured import schema_reply as schema_reply

__all__ = (
    "ChatCompletionsServer",
    "Fault",
    "MessagesServer",
    "Paced",
    "PromptCache",
    "RawResponse",
    "RecordedRequest",
    "ScriptExhausted",
    "ScriptedModel",
    "ScriptedProvider",
    "SteppedProvider",
    "code_execution_result",
    "reply",
    "schema_reply",
    "server_tool_use",
    "sse_events",
    "text",
    "tool_call",
    "tool_search_result",
    "web_fetch_result",
    "web_search_result",
)
