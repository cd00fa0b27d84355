"""Files: uploaded through the Files API, then used by id in a prompt or a tool's result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest

from agentloop import (
    Agent,
    ConfigurationError,
    DocumentBlock,
    ImageBlock,
    ProviderError,
    TextBlock,
    tool,
)
from agentloop.files import FILES_BETA, UploadedFile, upload
from agentloop.testing import reply, tool_call

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


async def test_upload_sends_the_file_under_the_files_beta(serve: Any, tmp_path: Path) -> None:
    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF-1.4 quarterly figures")
    server = serve([])
    uploaded = await upload(server.client(), report)

    assert (uploaded.filename, uploaded.mime_type, uploaded.size_bytes) == (
        "report.pdf",
        "application/pdf",
        26,
    )
    (seen,) = server.recorded
    assert seen.path == "/v1/files" and seen.headers["anthropic-beta"] == FILES_BETA
    stored = server.files.get(uploaded.id)
    assert stored is not None and stored.data == report.read_bytes()
    assert uploaded.block(title="Q3", citations=True) == DocumentBlock.from_file_id(
        uploaded.id, title="Q3", citations=True
    )


async def test_a_prompt_refers_to_an_uploaded_document_by_id(serve: Any, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("The launch is on Tuesday.")
    server = serve([reply("Tuesday.")])
    client = server.client()
    uploaded = await upload(client, notes)
    agent = Agent(client=client, params={"betas": [FILES_BETA]})
    result = await agent.run([TextBlock(text="When is the launch?"), uploaded.block()])

    assert result.text == "Tuesday."
    sent = server.requests[-1]["messages"][0]["content"][1]
    assert sent["source"] == {"type": "file", "file_id": uploaded.id}
    assert server.recorded[-1].headers["anthropic-beta"] == FILES_BETA


async def test_a_tool_returns_an_uploaded_image(serve: Any, tmp_path: Path) -> None:
    chart = tmp_path / "chart.png"
    chart.write_bytes(PNG)
    server = serve([reply(tool_call("chart", {})), reply("A flat line.")])
    client = server.client()
    uploaded = await upload(client, chart)

    @tool
    def chart() -> list[Any]:
        """The latest chart."""
        return [uploaded.block()]

    agent = Agent(client=client, tools=[chart])  # the Files beta is added by itself
    result = await agent.run("Describe the chart.")

    assert result.text == "A flat line."
    first, second = [r for r in server.recorded if r.path == "/v1/messages"]
    assert first.headers.get("anthropic-beta") is None  # no file in the history yet
    assert second.headers["anthropic-beta"] == FILES_BETA
    answered = server.requests[-1]["messages"][2]["content"][0]
    assert answered["content"][0] == ImageBlock.from_file_id(uploaded.id).to_wire()


async def test_a_file_source_brings_the_files_beta_with_other_betas_kept(
    serve: Any, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("The launch is on Tuesday.")
    server = serve([reply("Tuesday.")])
    client = server.client()
    uploaded = await upload(client, notes)
    agent = Agent(client=client, params={"betas": ["context-1m-2025-08-07"]})
    result = await agent.run([TextBlock(text="When?"), uploaded.block()])

    assert result.text == "Tuesday."
    sent = server.recorded[-1].headers["anthropic-beta"]
    assert sent.split(",") == ["context-1m-2025-08-07", FILES_BETA]


async def test_the_server_refuses_a_file_it_does_not_hold(serve: Any) -> None:
    server = serve([reply("never")])
    agent = Agent(client=server.client(), params={"betas": [FILES_BETA]})
    with pytest.raises(ProviderError, match="File not found: file_missing"):
        await agent.run([TextBlock(text="read"), DocumentBlock.from_file_id("file_missing")])
    assert server.model.requests == []


async def test_the_servers_files_api_lists_retrieves_and_deletes(
    serve: Any, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("a")
    server = serve([])
    client = server.client()
    uploaded = await upload(client, tmp_path / "a.txt")
    files = client.beta.files
    listed = await files.list(betas=[FILES_BETA])
    assert [f.id for f in listed.data] == [uploaded.id]
    meta = await files.retrieve_metadata(uploaded.id, betas=[FILES_BETA])
    assert (meta.filename, meta.size_bytes) == ("a.txt", 1)
    await files.delete(uploaded.id, betas=[FILES_BETA])
    assert server.files.get(uploaded.id) is None
    with pytest.raises(anthropic.NotFoundError, match="File not found"):
        await files.retrieve_metadata(uploaded.id, betas=[FILES_BETA])
    with pytest.raises(anthropic.BadRequestError, match="requires the beta header"):
        await files.list()


async def test_an_unreadable_file_is_a_configuration_error(serve: Any, tmp_path: Path) -> None:
    server = serve([])
    with pytest.raises(ConfigurationError, match=r"cannot upload .*missing\.pdf"):
        await upload(server.client(), tmp_path / "missing.pdf")
    assert server.recorded == []


def test_an_image_upload_makes_an_image_block() -> None:
    image = UploadedFile("file_01", "c.png", "image/png", 3)
    assert image.block() == ImageBlock(source={"type": "file", "file_id": "file_01"})
    document = UploadedFile("file_02", "d.pdf", "application/pdf", 3).block()
    assert document.to_wire() == {
        "type": "document",
        "source": {"type": "file", "file_id": "file_02"},
    }
