"""From an MCP tool result to what the model sees in its `tool_result`.

Text stays text, images become Anthropic image blocks, embedded resources become text,
image or document blocks as their type allows, resource links a line of text, audio and
anything else the Messages API cannot carry a short note, so a result never makes the next
request invalid. Each item is sent once (structured content only when there are no content
blocks), and a result over the size cut is cut with a note. An `isError`
result raises `ToolError`, which the registry turns into an `is_error` tool_result.
Blocks whose audience is the user alone are kept from the model: `for_user` converts them
for the user, to whom the tool shows them as an event.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mcp_types
from agentloop import ToolError
from agentloop.logs import get_logger
from agentloop.messages import ContentBlock, DocumentBlock, ImageBlock, TextBlock

__all__ = (
    "DEFAULT_MAX_RESULT_CHARS",
    "FOR_USER_ONLY_NOTE",
    "IMAGE_TYPES",
    "for_user",
    "to_content",
)

_log = get_logger()

IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Image media types the Messages API accepts in a base64 source."""

DEFAULT_MAX_RESULT_CHARS = 1_000_000
"""The default size cut of one tool result: characters of text plus base64 data."""

_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml")

FOR_USER_ONLY_NOTE = (
    "[The tool's result was shown to the user; it held nothing meant for the model.]"
)
"""What the model gets when every block of a result was for the user alone."""


def to_content(
    result: mcp_types.CallToolResult,
    tool: str,
    *,
    max_chars: int | None = DEFAULT_MAX_RESULT_CHARS,
) -> str | list[ContentBlock] | None:
    """The tool_result content for an MCP result; raises `ToolError` for an `isError` one.

    Each content block is sent once. `structuredContent` is sent (as JSON text) only when
    there are no content blocks: the specification asks a server that returns structured
    content to carry it in its content blocks too (serialised in a text block, or as the
    image it describes), so adding it beside them would send the same data twice. A block
    whose `annotations.audience` leaves out the assistant is meant for the user only and
    is not sent to the model (see `for_user`); when nothing else is left, the model gets
    `FOR_USER_ONLY_NOTE` rather than an empty result. A result larger than `max_chars`
    (characters of text plus base64 data) is cut there, with a note saying so.

    Args:
        result: What `tools/call` returned.
        tool: The tool's name, for messages.
        max_chars: The size cut; None sends results whole.

    Raises:
        ToolError: the server marked the result as an error; the message is its text.
    """
    blocks: list[ContentBlock] = []
    hidden = 0
    for item in result.content:
        if _for_user_only(item):
            hidden += 1
            continue
        blocks.extend(_convert(item))
    if result.structured_content is not None and not result.content:
        blocks.append(TextBlock(text=_json(result.structured_content)))
    if max_chars is not None:
        blocks = _cut(blocks, max_chars, tool)
    if result.is_error:
        message = "\n".join(b.text for b in blocks if isinstance(b, TextBlock)).strip()
        raise ToolError(message or f"MCP tool '{tool}' failed and gave no message.")
    if not blocks:
        return FOR_USER_ONLY_NOTE if hidden else None
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    return blocks


def for_user(result: mcp_types.CallToolResult) -> list[ContentBlock]:
    """The blocks of `result` meant for the user alone (`audience: ["user"]`), converted.

    They are kept from the model (see `to_content`). They take the conversion the model's
    blocks take, so what the user is shown is what a model could have read: text, images
    (JPEG, PNG, GIF, WebP), documents, and a short note for anything else.
    """
    return [block for item in result.content if _for_user_only(item) for block in _convert(item)]


def _for_user_only(item: Any) -> bool:
    annotations = getattr(item, "annotations", None)
    audience = getattr(annotations, "audience", None)
    return audience is not None and "assistant" not in audience


def _size(block: ContentBlock) -> int:
    if isinstance(block, TextBlock):
        return len(block.text)
    if isinstance(block, (ImageBlock, DocumentBlock)):
        return len(str(block.source.get("data", "")))
    return 0


def _cut(blocks: list[ContentBlock], limit: int, tool: str) -> list[ContentBlock]:
    """The blocks that fit in `limit` characters, a text cut at the edge, then a note."""
    total = sum(_size(b) for b in blocks)
    if total <= limit:
        return blocks
    kept: list[ContentBlock] = []
    room = limit
    for block in blocks:
        size = _size(block)
        if size <= room:
            kept.append(block)
            room -= size
        elif isinstance(block, TextBlock) and room > 0:
            kept.append(TextBlock(text=block.text[:room]))
            room = 0
        else:
            room = 0  # keep the order: nothing after a block that did not fit
    sent = sum(_size(b) for b in kept)
    _log.warning("mcp.result_cut", tool=tool, size=total, limit=limit)
    kept.append(
        TextBlock(
            text=f"[result cut: the tool returned {total:,} characters of content, over the "
            f"limit of {limit:,}; the first {sent:,} are above, the rest was not sent]"
        )
    )
    return kept


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
    found = sniff_image(base64.b64decode(data[:64]))
    if found != media_type:
        # The API refuses the whole request over one image whose bytes are not its type.
        actual = f"look like {found}" if found else "are not an image the model reads"
        return TextBlock(text=f"[{what} omitted: labelled {media_type}, but its bytes {actual}]")
    return ImageBlock(source={"type": "base64", "media_type": media_type, "data": data})


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image(head: bytes) -> str | None:
    """The image type (of `IMAGE_TYPES`) that an image's first bytes show, or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


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
