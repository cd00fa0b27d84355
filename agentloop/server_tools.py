"""Tools the Messages API runs itself (web search, web fetch, code execution, tool search).

They are given in `Agent(tools=[...])` beside function tools. The agent keeps them out of
the registry (nothing runs locally) and adds their `tools[]` entries and the beta headers
their versions need to every request (`server_request_params`); their `server_tool_use`
and result blocks stay in the history verbatim.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .errors import ConfigurationError

__all__ = (
    "BETAS",
    "CodeExecution",
    "ServerTool",
    "ToolSearch",
    "WebFetch",
    "WebSearch",
    "check_announced",
    "server_request_params",
)

BETAS: Mapping[str, str] = {
    "web_fetch_20250910": "web-fetch-2025-09-10",
    "code_execution_20250522": "code-execution-2025-05-22",
    "code_execution_20250825": "code-execution-2025-08-25",
    "tool_search_tool_regex_20251119": "advanced-tool-use-2025-11-20",
    "tool_search_tool_bm25_20251119": "advanced-tool-use-2025-11-20",
}
"""The `anthropic-beta` header each server tool version was released under; a version
not listed needs none."""


@dataclass(frozen=True, kw_only=True)
class ServerTool:
    """A tool the API runs itself, announced as a `tools[]` entry of its own `type`.

    Subclasses set `name` and the default `version`; `to_wire()` is the entry sent.
    """

    name: ClassVar[str]
    """The tool's name on the wire (see `tool_name`)."""
    version: str
    """The tool's `type` on the wire (e.g. `web_search_20250305`): a dated version."""
    beta: str | None = field(default=None)
    """The `anthropic-beta` header sent with it; by default the one `BETAS` lists for
    `version` (pass `""` to send none, once the version is generally available)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further fields of the entry, sent as given (`cache_control`, `allowed_callers`,
    fields of a newer version)."""

    def __post_init__(self) -> None:
        """Check the fields the API would refuse."""
        if not isinstance(self.version, str) or not self.version:
            raise ConfigurationError(f"{type(self).__name__}: version must be a tool type")
        if not isinstance(self.extra, Mapping):
            raise ConfigurationError(f"{type(self).__name__}: extra must be a mapping")

    @property
    def tool_name(self) -> str:
        """The name the model calls the tool by (in its `server_tool_use` blocks)."""
        return self.name

    @property
    def betas(self) -> tuple[str, ...]:
        """The beta headers this tool needs (none, or one)."""
        beta = BETAS.get(self.version) if self.beta is None else self.beta
        return (beta,) if beta else ()

    def fields(self) -> dict[str, Any]:
        """The entry's own fields besides `type` and `name` (None values left out)."""
        return {}

    def to_wire(self) -> dict[str, Any]:
        """The `tools[]` entry of the request."""
        options = {k: v for k, v in self.fields().items() if v is not None}
        return {"type": self.version, "name": self.tool_name, **options, **self.extra}


def _max_uses(owner: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(f"{owner}: max_uses must be a whole number from 1, not {value!r}")


def _domains(owner: str, allowed: Sequence[str] | None, blocked: Sequence[str] | None) -> None:
    if allowed is not None and blocked is not None:
        raise ConfigurationError(
            f"{owner}: give allowed_domains or blocked_domains, not both (the API takes one)"
        )
    for given in (allowed, blocked):
        if given is not None and (
            isinstance(given, str) or not all(isinstance(d, str) and d for d in given)
        ):
            raise ConfigurationError(f"{owner}: domains must be a list of names, not {given!r}")


@dataclass(frozen=True, kw_only=True)
class WebSearch(ServerTool):
    """The API's web search: the model searches, the results come back as blocks.

    ```python
    agent = Agent(tools=[WebSearch(max_uses=3, allowed_domains=["python.org"]), add])
    ```
    """

    name: ClassVar[str] = "web_search"
    version: str = "web_search_20250305"
    max_uses: int | None = None
    """The most searches in one request."""
    allowed_domains: Sequence[str] | None = None
    """Only results from these domains (not with `blocked_domains`)."""
    blocked_domains: Sequence[str] | None = None
    """Never results from these domains (not with `allowed_domains`)."""
    user_location: Mapping[str, Any] | None = None
    """Where the user is, for local results: `{"type": "approximate", "city": ...,
    "region": ..., "country": ..., "timezone": ...}`."""

    def __post_init__(self) -> None:
        """Check the fields the API would refuse."""
        super().__post_init__()
        _max_uses("WebSearch", self.max_uses)
        _domains("WebSearch", self.allowed_domains, self.blocked_domains)

    def fields(self) -> dict[str, Any]:
        """The search's options."""
        return {
            "max_uses": self.max_uses,
            "allowed_domains": _listed(self.allowed_domains),
            "blocked_domains": _listed(self.blocked_domains),
            "user_location": None if self.user_location is None else dict(self.user_location),
        }


@dataclass(frozen=True, kw_only=True)
class WebFetch(ServerTool):
    """The API's web fetch: the model reads a page or PDF by URL."""

    name: ClassVar[str] = "web_fetch"
    version: str = "web_fetch_20250910"
    max_uses: int | None = None
    """The most fetches in one request."""
    allowed_domains: Sequence[str] | None = None
    """Only these domains may be fetched (not with `blocked_domains`)."""
    blocked_domains: Sequence[str] | None = None
    """These domains are never fetched (not with `allowed_domains`)."""
    citations: bool = False
    """Whether the model cites the fetched documents (`citations` blocks kept verbatim)."""
    max_content_tokens: int | None = None
    """About how many tokens of a page's text enter the context."""

    def __post_init__(self) -> None:
        """Check the fields the API would refuse."""
        super().__post_init__()
        _max_uses("WebFetch", self.max_uses)
        _domains("WebFetch", self.allowed_domains, self.blocked_domains)
        tokens = self.max_content_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
            raise ConfigurationError("WebFetch: max_content_tokens must be a whole number")
        if tokens is not None and tokens < 1:
            raise ConfigurationError("WebFetch: max_content_tokens must be at least 1")

    def fields(self) -> dict[str, Any]:
        """The fetch's options."""
        return {
            "max_uses": self.max_uses,
            "allowed_domains": _listed(self.allowed_domains),
            "blocked_domains": _listed(self.blocked_domains),
            "citations": {"enabled": True} if self.citations else None,
            "max_content_tokens": self.max_content_tokens,
        }


@dataclass(frozen=True, kw_only=True)
class CodeExecution(ServerTool):
    """The API's code execution: the model runs code in a sandbox (a container).

    The container id of a response is sent back with the next request of the run, so
    files and state carry over from round to round.
    """

    name: ClassVar[str] = "code_execution"
    version: str = "code_execution_20250825"


@dataclass(frozen=True, kw_only=True)
class ToolSearch(ServerTool):
    """The API's tool search, which loads deferred tools when the model looks for them.

    Tools marked `@tool(defer_loading=True)` stay out of the model's context until a
    search finds them.

    `kind` picks the search: `"regex"` (the model writes patterns) or `"bm25"` (natural
    language queries).
    """

    name: ClassVar[str] = "tool_search_tool_regex"
    kind: Literal["regex", "bm25"] = "regex"
    """How the model searches: regular expressions or BM25 queries."""
    version: str = ""
    """By default `tool_search_tool_{kind}_20251119`."""

    def __post_init__(self) -> None:
        """Pick the version of `kind` and check it."""
        if self.kind not in ("regex", "bm25"):
            raise ConfigurationError(
                f"ToolSearch: kind must be 'regex' or 'bm25', not {self.kind!r}"
            )
        if not self.version:
            object.__setattr__(self, "version", f"tool_search_tool_{self.kind}_20251119")
        super().__post_init__()

    @property
    def tool_name(self) -> str:
        """`tool_search_tool_regex` or `tool_search_tool_bm25`, after `kind`."""
        return f"tool_search_tool_{self.kind}"


def _listed(domains: Sequence[str] | None) -> list[str] | None:
    return None if domains is None else list(domains)


def server_request_params(tools: Sequence[ServerTool], params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with the entries of `tools` added to `params["tools"]` and their betas.

    Betas already in `params` are kept, and none is added twice.
    """
    if not tools:
        return dict(params)
    given = params.get("betas") or ()
    betas = [given] if isinstance(given, str) else list(given)
    for server_tool in tools:
        betas.extend(b for b in server_tool.betas if b not in betas)
    entries = [*(params.get("tools") or ()), *(t.to_wire() for t in tools)]
    updated = {**params, "tools": entries}
    if betas:
        updated["betas"] = betas
    return updated


def check_announced(
    function_tools: Collection[str], deferred: Collection[str], params: Mapping[str, Any]
) -> None:
    """Refuse what the API would refuse of an agent's tools, before any request.

    `function_tools` are the names of the agent's own tools, `deferred` those marked
    `defer_loading`; `params` are the request's parameters, whose `tools` hold the server
    tools' entries.

    Raises:
        ConfigurationError: a server tool has the name of a function tool, or a tool is
            deferred with no tool search to find it.
    """
    entries = [e for e in params.get("tools") or () if isinstance(e, Mapping)]
    if clash := sorted({str(e.get("name")) for e in entries} & set(function_tools)):
        raise ConfigurationError(
            f"tool name {', '.join(clash)} is both a function tool and a server tool; "
            "the model addresses tools by name, so rename the function"
        )
    searches = any(str(e.get("type", "")).startswith("tool_search_tool") for e in entries)
    if deferred and not searches:
        raise ConfigurationError(
            f"tool {', '.join(sorted(deferred))} is deferred (defer_loading=True) but no "
            "tool search is given to find it: add ToolSearch() to the tools"
        )
