"""The Chat Completions provider (OpenAI, Ollama, vLLM, llama.cpp, LM Studio), one job a file.

`compat` holds what servers do differently; `request` turns the block history into
`chat.completions.create` arguments; `response` and `stream` turn answers back into
blocks; `provider` sends with the `openai` SDK, which is imported only when it is used.
"""

from .compat import PRESETS as PRESETS
from .compat import ChatCompat as ChatCompat
from .compat import preset as preset
from .compat import wire_id as wire_id
from .provider import OpenAIChatProvider as OpenAIChatProvider
from .provider import provider_from_options as provider_from_options
from .request import ERROR_PREFIX as ERROR_PREFIX
from .request import to_chat_messages as to_chat_messages
from .response import parse_completion as parse_completion
from .stream import ChatStreamAssembler as ChatStreamAssembler

__all__ = (
    "ERROR_PREFIX",
    "PRESETS",
    "ChatCompat",
    "ChatStreamAssembler",
    "OpenAIChatProvider",
    "parse_completion",
    "preset",
    "provider_from_options",
    "to_chat_messages",
    "wire_id",
)
