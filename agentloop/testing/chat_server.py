"""A local Chat Completions server on 127.0.0.1 that answers from the same scripts.

`ChatCompletionsServer` speaks enough of `POST /v1/chat/completions` for the official
`openai` SDK: JSON responses, SSE chunk streams (`stream: true`, usage with
`stream_options.include_usage`), OpenAI-shaped errors, and the same `Fault`s and `Paced`
messages as `MessagesServer` (the HTTP side is theirs: `agentloop.testing.http`). Scripts
stay in the Messages API shape (`reply(...)`, `tool_call(...)`): each request is checked
against the Chat Completions rules (`chat_request`), read back into a block history,
linted and handed to the script; the script's answer is sent as a chat completion
(`chat_response`).

Options act out what real servers do differently (calls sent whole with index 0, ids
missing, short ids required, one system message, refused `tool_choice` values or fields,
content a chat template cannot render, tools hidden without a `tool_choice`, no usage in
streams), so each `ChatCompat` flag can be shown against the quirk it is for; `like=`
names a real server and turns on all of its quirks at once.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Literal, cast

from agentloop.errors import AgentloopError, ConfigurationError

from .chat_request import check_chat_request as check_chat_request
from .chat_request import read_chat_request as read_chat_request
from .chat_request import template_problem
from .chat_response import ChatQuirks, Chunk, chat_chunks, completion_of
from .http import Events, RecordedRequest, ScriptedHandler, ScriptedServer
from .scripted import Fault, Script, ScriptedModel
from .structured import check_response_format

__all__ = ("LIKE", "ChatCompletionsServer", "check_chat_request", "read_chat_request")

LIKE: Mapping[str, Mapping[str, Any]] = {
    "llama-cpp-python": {
        "strict": True,
        "tools_need_choice": True,
        "tool_choices": frozenset({"auto", "none", "function"}),
        "response_formats": frozenset({"text", "json_object"}),
        "stream_usage": False,
        "refusal_status": 500,
    },
}
"""The quirks of each real server `ChatCompletionsServer(like=...)` acts out: those of
llama-cpp-python's server (`python -m llama_cpp.server`) as of 0.3."""


def _error_body(kind: str, message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _sse(chunk: Chunk) -> bytes:
    data = chunk if isinstance(chunk, str) else json.dumps(chunk)
    return f"data: {data}\n\n".encode()


class _ChatHandler(ScriptedHandler):
    """Answers `POST /v1/chat/completions` from the script."""

    routes = ("/v1/chat/completions", "/chat/completions")
    not_found_type = "invalid_request_error"
    malformed_json = b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"mess'
    malformed_sse = b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "cho\n\n'
    quirks = ChatQuirks()
    """The server's quirks, for the request being answered."""
    usage = False
    """Whether the request asked for usage in its stream (`stream_options`)."""

    def error_body(self, kind: str, message: str) -> Any:
        """OpenAI's error shape."""
        return _error_body(kind, message)

    def fault_body(self, fault: Fault) -> Any:
        """The fault's error, in OpenAI's shape."""
        return _error_body(fault.error_type, fault.message)

    def message_body(self, message: dict[str, Any]) -> Any:
        """The `chat.completion` for the message."""
        return completion_of(message, self.quirks)

    def stream(self, events: Events, message: dict[str, Any]) -> list[tuple[float, bytes]]:
        """The chunks for the events, as SSE `data:` lines."""
        chunks = chat_chunks(events, message, self.quirks, usage=self.usage)
        return [(pause, _sse(chunk)) for pause, chunk in chunks]

    def stream_error(self, fault: Fault) -> bytes:
        """An error object in place of a chunk."""
        return _sse(_error_body(fault.error_type, fault.message))

    def do_GET(self) -> None:
        """No `GET` route here (the model list is the Messages server's)."""
        self._json(404, self.error_body("invalid_request_error", f"no route {self.path}"))

    def respond(self, seen: RecordedRequest, arrived: float) -> None:
        """Check the request, read it for the script, answer as a chat completion."""
        owner = cast("ChatCompletionsServer", self.server.owner)
        owner.record(seen, arrived)
        body, quirks = seen.body, owner.quirks
        refused = _refusal(body, quirks)
        if refused is not None:
            status, message = refused
            kind = "invalid_request_error" if status < 500 else "internal_server_error"
            self._json(status, _error_body(kind, message))
            return
        options = body.get("stream_options") or {}
        asked = bool(isinstance(options, Mapping) and options.get("include_usage"))
        self.usage = asked and quirks.stream_usage
        self.quirks = quirks
        if quirks.tools_need_choice and body.get("tool_choice") in (None, "none"):
            body = {k: v for k, v in body.items() if k != "tools"}  # the model never sees them
        self.answer_from_script(read_chat_request(body), stream=bool(body.get("stream")))


def _refusal(body: Any, quirks: ChatQuirks) -> tuple[int, str] | None:
    """The status and message a request is refused with, or None to answer it."""
    problem = check_chat_request(
        body,
        id_length=quirks.id_length,
        single_system=quirks.single_system,
        tool_choices=quirks.tool_choices,
        refuse_fields=quirks.refuse_fields,
    )
    form = body.get("response_format") if problem is None else None
    if form is not None and quirks.response_formats is not None:
        kind = form.get("type") if isinstance(form, Mapping) else None
        if kind not in quirks.response_formats:
            allowed = " or ".join(repr(k) for k in sorted(quirks.response_formats))
            problem = f"response_format.type: Input should be {allowed}, not {kind!r}"
    if problem is None:
        try:
            check_response_format(body)
        except AgentloopError as exc:
            problem = str(exc)
    if problem is not None:
        return quirks.refusal_status, problem
    problem = template_problem(body) if quirks.strict else None
    return None if problem is None else (500, problem)  # the template fails on the server


class ChatCompletionsServer(ScriptedServer):
    """A scripted Chat Completions API on 127.0.0.1, for the real `AsyncOpenAI` to talk to.

    ```python
    script = [reply(tool_call("add", {"a": 1, "b": 2})), reply("3")]
    async with ChatCompletionsServer(script) as server:
        agent = Agent(provider=OpenAIChatProvider(server.client()), tools=[add])
        result = await agent.run("1 + 2?")
    ```

    The script is the same as for `MessagesServer` (`reply`, `tool_call`, `Fault`,
    `Paced`, `RawResponse`; a `RawResponse` is sent as it is, so it holds Chat
    Completions JSON or SSE). `requests` are the Chat Completions bodies received;
    `model.requests` are the same requests read into the Messages API shape the script
    saw. A request that breaks the format's rules gets a 400 `invalid_request_error`.
    """

    handler = _ChatHandler

    def __init__(
        self,
        script: Script | ScriptedModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        whole_tool_calls: bool = False,
        ids: Literal["first", "every", "none"] = "first",
        id_length: int | None = None,
        tool_choices: Collection[str] | None = None,
        single_system: bool = False,
        refuse_fields: Collection[str] = (),
        finish_reason_with_tools: str = "tool_calls",
        reasoning_field: str = "reasoning_content",
        strict: bool | None = None,
        tools_need_choice: bool | None = None,
        response_formats: Collection[str] | None = None,
        stream_usage: bool | None = None,
        refusal_status: int | None = None,
        like: Literal["llama-cpp-python"] | None = None,
    ) -> None:
        """Create (but do not start) a server answering from `script`.

        Args:
            script: A script or a `ScriptedModel`, as `MessagesServer` takes it.
            host: Address to listen on.
            port: Port to listen on (0: any free one).
            whole_tool_calls: Stream each tool call whole in one chunk, every one with
                `index: 0` (as Ollama does).
            ids: Send a streamed call's id on its first chunk (`"first"`, as OpenAI
                does), on every chunk (`"every"`), or never (`"none"`, in JSON too).
            id_length: Refuse tool-call ids that are not exactly this many letters and
                digits (as Mistral templates do).
            tool_choices: The `tool_choice` values accepted (`"auto"`, `"none"`,
                `"required"`, `"function"`); others are refused. None accepts all.
            single_system: Refuse a system message that is not the first message, or a
                second one.
            refuse_fields: Request fields refused with a 400 (`"max_tokens"`,
                `"stream_options"`, ...).
            finish_reason_with_tools: The `finish_reason` sent with tool calls (some
                servers send `"stop"`).
            reasoning_field: Where reasoning text goes (`"reasoning_content"` or
                `"reasoning"`).
            strict: Answer 500, as a server rendering the model's own chat template
                does, a request with a `content` the template cannot add to a string:
                `null` (an assistant message of tool calls only), or a list of parts
                other than a user message's with an image or a file.
            tools_need_choice: Hand the script a request without `tool_choice` (or with
                `"none"`) without its tools, as llama-cpp-python's function-calling
                format never shows them to the model then.
            response_formats: The `response_format` types accepted (`"text"`,
                `"json_object"`, `"json_schema"`); others are refused. None accepts all.
            stream_usage: Send usage in a stream that asks for it
                (`stream_options.include_usage`); False ignores the option.
            refusal_status: The HTTP status of a refused request (400;
                llama-cpp-python answers 500, to a request it cannot validate too).
            like: A real server whose quirks to act out (`"llama-cpp-python"`, see
                `LIKE`); an option given here as well wins over it.
        """
        super().__init__(script, host=host, port=port)
        if like is not None and like not in LIKE:
            raise ConfigurationError(f"like={like!r}: use one of {', '.join(LIKE)}")
        preset = LIKE[like] if like is not None else {}
        if tool_choices is None:
            tool_choices = preset.get("tool_choices")
        if response_formats is None:
            response_formats = preset.get("response_formats")
        self.quirks = ChatQuirks(
            whole_tool_calls=whole_tool_calls,
            ids=ids,
            id_length=id_length,
            tool_choices=frozenset(tool_choices) if tool_choices is not None else None,
            single_system=single_system,
            refuse_fields=frozenset(refuse_fields),
            finish_reason_with_tools=finish_reason_with_tools,
            reasoning_field=reasoning_field,
            strict=_either(strict, preset.get("strict", False)),
            tools_need_choice=_either(tools_need_choice, preset.get("tools_need_choice", False)),
            response_formats=(
                frozenset(response_formats) if response_formats is not None else None
            ),
            stream_usage=_either(stream_usage, preset.get("stream_usage", True)),
            refusal_status=(
                refusal_status
                if refusal_status is not None
                else int(preset.get("refusal_status", 400))
            ),
        )
        """How this server answers differently from OpenAI."""

    def client(self, **options: Any) -> Any:
        """An `openai.AsyncOpenAI` pointed at this server (no retries by default).

        `options` go to `AsyncOpenAI`, e.g. `max_retries=2` or `timeout=0.2`.
        """
        import openai

        options.setdefault("api_key", "sk-local-test")
        options.setdefault("max_retries", 0)
        if "http_client" not in options:
            # This server speaks plain HTTP: no CA bundle to load (the SDK's default
            # client loads one, about 0.1 s of CPU per client).
            options["http_client"] = openai.DefaultAsyncHttpxClient(verify=False)
        client = openai.AsyncOpenAI(base_url=self.base_url + "/v1", **options)
        self._clients.append(client)
        return client


def _either(given: bool | None, otherwise: bool) -> bool:
    return otherwise if given is None else given
