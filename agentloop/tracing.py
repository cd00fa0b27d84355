"""OpenTelemetry spans of a run, named and shaped by the GenAI semantic conventions.

The agent opens `invoke_agent {name}` around a run and `chat {model}` around each model
request; `ToolRegistry.run_call` opens `execute_tool {tool}` around each tool call. A
trace shows the run as it happened: requests in order, tool calls in parallel under it. Only
`opentelemetry-api` is needed; with no tracer provider configured, a run asks once and
records nothing. Message content (prompts, tool arguments and results) is recorded only
when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is `true`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, TracerProvider

__all__ = ("CAPTURE_CONTENT_ENV", "Tracing", "fail", "record_response", "record_run", "tracing_for")

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' switch for recording message content on spans."""

_SCOPE = "agentloop"


def tracing_for(provider: TracerProvider | None) -> Tracing | None:
    """The spans of one run, or None when nothing would record them.

    `provider` is the agent's tracer provider; None means OpenTelemetry's global one,
    which records nothing until an application installs an SDK.
    """
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
    from . import __version__

    capture = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("true", "1")
    return Tracing(provider.get_tracer(_SCOPE, __version__), capture)


class Tracing:
    """Opens a run's spans; one per run, made by `tracing_for`."""

    def __init__(self, tracer: Tracer, capture_content: bool) -> None:
        """Open spans with `tracer`; record message content when `capture_content`."""
        self.tracer = tracer
        self.capture_content = capture_content
        self.parent: Span | None = None
        """The run's span: tool calls are its children, even those that start while a
        streamed response (inside its `chat` span) is still arriving."""

    @contextmanager
    def run(self, name: str, model: str, provider: str, run_id: str) -> Iterator[Span]:
        """The `invoke_agent` span around a run (current while it lasts)."""
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": run_id,
        }
        with self._span(f"invoke_agent {name}", SpanKind.INTERNAL, attributes) as span:
            self.parent = span
            yield span

    @contextmanager
    def chat(
        self, provider: str, model: str, max_tokens: int, messages: Sequence[Any]
    ) -> Iterator[Span]:
        """The `chat` span around one model request."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": max_tokens,
        }
        if self.capture_content:
            attributes["gen_ai.input.messages"] = _json([m.wire for m in messages])
        with self._span(f"chat {model}", SpanKind.CLIENT, attributes) as span:
            yield span

    @contextmanager
    def tool(self, name: str, call_id: str, arguments: Any) -> Iterator[Span]:
        """The `execute_tool` span around one tool call."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _json(arguments)
        parent = trace.set_span_in_context(self.parent) if self.parent is not None else None
        with self._span(f"execute_tool {name}", SpanKind.INTERNAL, attributes, parent) as span:
            yield span

    @contextmanager
    def _span(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        parent: Context | None = None,
    ) -> Iterator[Span]:
        span = self.tracer.start_span(name, parent, kind=kind, attributes=attributes)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False):
                yield span
        except BaseException as exc:
            if "error.type" not in (getattr(span, "attributes", None) or {}):
                fail(span, _error_type(exc))
            raise
        finally:
            span.end()


def fail(span: Span, error_type: str, description: str | None = None) -> None:
    """Mark `span` as failed with the `error.type` the conventions ask for."""
    span.set_attribute("error.type", error_type)
    span.set_status(StatusCode.ERROR, description)


def record_response(span: Span, response: Any, capture_content: bool) -> None:
    """A model response's attributes on its `chat` span."""
    span.set_attributes(
        {
            "gen_ai.response.finish_reasons": [response.stop_reason or ""],
            **_usage(response.usage),
        }
    )
    if response.id:
        span.set_attribute("gen_ai.response.id", response.id)
    if response.model:
        span.set_attribute("gen_ai.response.model", response.model)
    if capture_content:
        span.set_attribute("gen_ai.output.messages", _json([response.message.wire]))


def record_run(span: Span, result: Any) -> None:
    """A run's outcome on its `invoke_agent` span: usage over every request, why it ended."""
    span.set_attributes(
        {
            "gen_ai.response.finish_reasons": [result.stop_reason],
            **_usage(result.usage),
            "agentloop.rounds": result.rounds,
        }
    )


def _usage(usage: Any) -> dict[str, int]:
    """Token counts as the GenAI conventions name them.

    The conventions count cache reads and writes in `gen_ai.usage.input_tokens` too;
    Anthropic's `input_tokens` leaves them out, so they are added here.
    """
    cached = usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens + cached,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
    }


def _error_type(exc: BaseException) -> str:
    import anyio

    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "cancelled"
    return type(exc).__qualname__


def _json(value: Any) -> str:
    return json.dumps(value, default=repr)
