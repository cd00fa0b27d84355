"""From an MCP tool result to what the model sees in its `tool_result`.

Text stays text, images become Anthropic image blocks, embedded resources become text,
image or document blocks as their type allows, and anything the Messages API cannot carry
becomes a short note, so a result never makes the next request invalid. An `isError`
result raises `ToolError`, which the registry turns into an `is_error` tool_result.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mcp_types
from agentloop import ToolError
from agentloop.messages import ContentBlock, DocumentBlock, ImageBlock, TextBlock

__all__ = ("IMAGE_TYPES", "to_content")

IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Image media types the Messages API accepts in a base64 source."""

_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml")


def to_content(result: mcp_types.CallToolResult, tool: str) -> str | list[ContentBlock] | None:
    """The tool_result content for an MCP result; raises `ToolError` for an `isError` one.

    `structuredContent` is kept: when the content has no text block (for example a
    result with only `structuredContent`, or only an image), its JSON is added as a text
    block. When there is text, the text is sent as it is: the MCP specification asks
    servers that return structured content to put its JSON in a text block as well, so
    adding it again would only repeat it.

    Args:
        result: What `tools/call` returned.
        tool: The tool's name, for messages.

    Raises:
        ToolError: the server marked the result as an error; the message is its text.
    """
    blocks: list[ContentBlock] = []
    for item in result.content:
        blocks.extend(_convert(item))
    has_text = any(isinstance(b, TextBlock) for b in blocks)
    if result.structured_content is not None and not has_text:
        blocks.append(TextBlock(text=_json(result.structured_content)))
    if result.is_error:
        message = "\n".join(b.text for b in blocks if isinstance(b, TextBlock)).strip()
        raise ToolError(message or f"MCP tool '{tool}' failed and gave no message.")
    if not blocks:
        return None
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    return blocks


def _convert(item: Any) -> list[ContentBlock]:
    if isinstance(item, mcp_types.TextContent):
        return [TextBlock(text=item.text)]
    if isinstance(item, mcp_types.ImageContent):
        return [_image(item.data, item.mime_type, "image")]
    if isinstance(item, mcp_types.AudioContent):
        return [TextBlock(text=f"[audio ({item.mime_type}) omitted: the model cannot hear it]")]
    if isinstance(item, mcp_types.ResourceLink):
        return [TextBlock(text=_link(item))]
    if isinstance(item, mcp_types.EmbeddedResource):
        return [_resource(item.resource)]
    kind = getattr(item, "type", type(item).__name__)
    return [TextBlock(text=f"[{kind} content omitted: not supported]")]


def _image(data: str, media_type: str, what: str) -> ContentBlock:
    if media_type not in IMAGE_TYPES:
        return TextBlock(
            text=f"[{what} ({media_type}) omitted: the model reads JPEG, PNG, GIF, WebP only]"
        )
    if not _is_base64(data):
        return TextBlock(text=f"[{what} omitted: the server sent invalid base64 data]")
    return ImageBlock(source={"type": "base64", "media_type": media_type, "data": data})


def _resource(
    resource: mcp_types.TextResourceContents | mcp_types.BlobResourceContents,
) -> ContentBlock:
    uri = str(resource.uri)
    media_type = resource.mime_type or ""
    if isinstance(resource, mcp_types.TextResourceContents):
        return TextBlock(text=f"Resource {uri}:\n{resource.text}")
    if media_type in IMAGE_TYPES:
        return _image(resource.blob, media_type, f"image resource {uri}")
    if media_type == "application/pdf" and _is_base64(resource.blob):
        return DocumentBlock.model_validate(
            {
                "source": {
                    "type": "base64",
                    "media_type": "application/pdf",
                    "data": resource.blob,
                },
                "title": uri,
            }
        )
    if media_type.startswith(_TEXT_TYPES):
        try:
            text = base64.b64decode(resource.blob, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            pass
        else:
            return TextBlock(text=f"Resource {uri}:\n{text}")
    size = len(resource.blob) * 3 // 4
    return TextBlock(
        text=f"[resource {uri} ({media_type or 'binary'}, about {size} bytes) omitted: "
        "the model cannot read this type]"
    )


def _link(link: mcp_types.ResourceLink) -> str:
    parts = [f"Resource link: {link.name} <{link.uri}>"]
    if link.mime_type:
        parts.append(f"({link.mime_type})")
    text = " ".join(parts)
    if link.description:
        text += f"\n{link.description}"
    return text


def _is_base64(data: str) -> bool:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    return bool(data)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
