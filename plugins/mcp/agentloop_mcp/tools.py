"""An MCP server's tool as an agentloop `Tool`: its name, description and `inputSchema`.

The registry treats it like any other tool (parallel, capped, timed out). `validate`
checks the model's input against the server's JSON schema, so a bad call is answered
with an `is_error` result naming each problem without reaching the server; `invoke`
sends the call to the server's supervisor and turns the result into tool_result content,
showing the blocks meant for the user alone as a `ToolUserContent` event of the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
import mcp.types as mcp_types
from agentloop import RunContext, Tool, ToolError, ToolUserContent
from agentloop.logs import get_logger
from agentloop.messages import ContentBlock
from agentloop.progress import progress_reporter
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from .config import MCPServer
from .connection import MCPRequestError, ServerConnection
from .content import for_user, to_content
from .sampling import Caller

__all__ = ("MCPResourceTool", "MCPTool")

_log = get_logger()


class MCPTool(Tool):
    """One tool of an MCP server, under the name the model sees.

    Made by `MCPToolSource`; calling it needs the source to be open.
    """

    def __init__(self, connection: ServerConnection, spec: mcp_types.Tool, name: str) -> None:
        """Describe `spec` (from the server's listing) as the tool `name`."""
        # The server's schema is the input schema: `_call` gets the input dict as it is,
        # checked by `validate` below.
        super().__init__(
            self._call,
            name=name,
            description=spec.description or "",
            timeout=connection.server.timeout,
            input_schema=spec.input_schema,
            requires_approval=_approval(connection.server.name, connection.server, spec),
        )
        self.source = f"mcp:{connection.server.name}"
        self.__doc__ = self.description
        self.mcp_name: str = spec.name
        """The tool's name on its server (without prefix)."""
        self.server: str = connection.server.name
        """The name of the server it belongs to."""
        self.origin: str = self.server
        """Where the tool comes from, for listings such as `agentloop tools` (its server)."""
        self.annotations: mcp_types.ToolAnnotations | None = spec.annotations
        """The server's hints about the tool (read-only, idempotent, destructive, ...)."""
        self.retryable: bool = bool(
            spec.annotations
            and (spec.annotations.read_only_hint or spec.annotations.idempotent_hint)
        )
        """Whether a call cut off by a dropped connection is sent again after reconnecting."""
        self._connection = connection
        self._validator = _validator(self.input_schema, connection.server.name, spec.name)

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.server!r})"

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check the model's input against the server's `inputSchema`.

        Raises:
            pydantic.ValidationError: the input does not fit; one entry per problem, so the
                registry's `is_error` message names each field.
        """
        if self._validator is None:
            return dict(arguments)
        try:
            errors = list(self._validator.iter_errors(dict(arguments)))
        except Exception as exc:  # an unresolvable $ref and the like: the server decides
            _log.debug("mcp.schema_unusable", tool=self.name, error=str(exc))
            return dict(arguments)
        if errors:
            raise ValidationError.from_exception_data(f"{self.name}_input", _details(errors))
        return dict(arguments)

    def __call__(self, **arguments: Any) -> Any:
        """Call the tool directly, with its arguments by name (a coroutine), in no run."""
        return self._call(RunContext("", 0, tool_name=self.name), arguments)

    async def _call(
        self, ctx: RunContext[Any], arguments: dict[str, Any]
    ) -> str | list[ContentBlock] | None:
        """Call the tool on its server; the result as tool_result content.

        `ctx` is the call's: a server's sampling request during the call is answered by,
        and counted in, its run; the result's blocks for the user alone are its event.

        Raises:
            ToolError: the server reported an error, or the call could not be completed.
        """
        caller = Caller.here(ctx)
        result = await self._connection.call(
            self.mcp_name,
            arguments,
            retryable=self.retryable,
            on_progress=progress_reporter(),
            caller=caller,
        )
        shown = for_user(result)
        if shown:
            event = ToolUserContent(ctx.round, ctx.tool_use_id, ctx.tool_name, tuple(shown))
            await caller.emit(event)
        return to_content(result, self.name, max_chars=self._connection.server.max_result_chars)


class MCPResourceTool(MCPTool):
    """A tool that reads one of a server's resources by URI (the `resources_tool` option).

    Its description lists the resources the server listed when the source opened (the
    first 50), so the model knows what it may read; the contents reach the model as an
    embedded resource in a tool result would.
    """

    def __init__(
        self,
        connection: ServerConnection,
        name: str,
        resources: list[mcp_types.Resource],
        templates: Sequence[mcp_types.ResourceTemplate] = (),
    ) -> None:
        """Describe the reading tool `name` of `connection`'s server."""
        shown = [f"- {r.uri} ({r.name})" for r in resources[:50]]
        more = [f"- ... and {len(resources) - 50} more"] if len(resources) > 50 else []
        patterns = [f"- {t.uri_template} ({t.name})" for t in templates[:20]]
        if patterns:
            patterns.insert(0, "URI templates (fill in each {placeholder}):")
        description = "\n".join(
            [
                f"Read a resource of MCP server '{connection.server.name}' by its URI.",
                *shown,
                *more,
                *patterns,
            ]
        )
        spec = mcp_types.Tool(
            name="read_resource",
            description=description,
            input_schema={
                "type": "object",
                "properties": {"uri": {"type": "string", "description": "The resource's URI"}},
                "required": ["uri"],
            },
            annotations=mcp_types.ToolAnnotations(read_only_hint=True),
        )
        super().__init__(connection, spec, name)

    async def _call(
        self, ctx: RunContext[Any], arguments: dict[str, Any]
    ) -> str | list[ContentBlock] | None:
        """Read the resource; its contents as tool_result content.

        Raises:
            ToolError: the server refused (an unknown URI) or is gone.
        """
        try:
            contents = await self._connection.fetch("read_resource", uri=arguments["uri"])
        except MCPRequestError as exc:
            raise ToolError(str(exc)) from None
        embedded = [
            mcp_types.EmbeddedResource(type="resource", resource=item) for item in contents.contents
        ]
        result = mcp_types.CallToolResult(content=embedded)
        return to_content(result, self.name, max_chars=self._connection.server.max_result_chars)


def _approval(name: str, server: MCPServer, spec: mcp_types.Tool) -> Any:
    """The tool's `requires_approval`, from the server's `require_approval` option.

    `destructive` follows the MCP hints: a tool is destructive unless it says it is
    read-only or says `destructiveHint: false` (the specification's default is true).
    """
    choice = server.require_approval
    if choice == "always":
        reason = f"MCP server '{name}' requires approval for each call (require_approval)"
    elif choice == "destructive" and _destructive(spec.annotations):
        reason = f"MCP server '{name}' says {spec.name!r} may be destructive (require_approval)"
    else:
        return False

    def ask(ctx: RunContext[Any], arguments: dict[str, Any]) -> str:
        return reason

    return ask


def _destructive(hints: mcp_types.ToolAnnotations | None) -> bool:
    if hints is None:
        return True
    if hints.read_only_hint:
        return False
    return hints.destructive_hint is not False


def _validator(schema: dict[str, Any], server: str, tool: str) -> Any:
    """A JSON-schema validator for `schema`, or None when the schema itself is invalid."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        _log.warning("mcp.invalid_schema", mcp_server=server, tool=tool, error=exc.message)
        return None
    return cls(schema)


def _details(errors: list[jsonschema.ValidationError]) -> list[InitErrorDetails]:
    """Each schema violation as a pydantic error entry, in the wording the registry uses."""
    details: list[InitErrorDetails] = []
    seen: set[tuple[str, tuple[Any, ...], str]] = set()

    def add(kind: str, loc: tuple[Any, ...], value: Any, message: str = "") -> None:
        if (kind, loc, message) in seen:
            return
        seen.add((kind, loc, message))
        if kind in ("missing", "extra_forbidden"):
            details.append({"type": kind, "loc": loc, "input": value})
        else:
            error = PydanticCustomError("json_schema", "{message}", {"message": message})
            details.append({"type": error, "loc": loc, "input": value})

    for error in errors:
        path = tuple(error.absolute_path)
        instance = error.instance
        required = error.validator_value
        if (
            error.validator == "required"
            and isinstance(instance, dict)
            and isinstance(required, list)
        ):
            for name in required:
                if name not in instance:
                    add("missing", (*path, name), instance)
        elif (
            error.validator == "additionalProperties"
            and isinstance(instance, dict)
            and isinstance(error.schema, dict)
            and "patternProperties" not in error.schema
        ):
            known = error.schema.get("properties", {})
            for name in instance:
                if name not in known:
                    add("extra_forbidden", (*path, name), instance[name])
        else:
            add("json_schema", path, instance, error.message)
    return details
