from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import agentloop.hookspecs
import pluggy
import pytest
from agentloop import Agent, Tool
from agentloop.testing import ScriptedProvider, reply, tool_call

import agentloop_cortex
from agentloop_cortex import CortexConfig, plugin

NAMES = ["read_file", "write_file", "append_file", "replace_in_file"]


def test_entry_point_is_installed() -> None:
    points = importlib.metadata.entry_points(group="agentloop")
    cortex = [p for p in points if p.name == "cortex"]
    assert len(cortex) == 1
    assert cortex[0].value == "agentloop_cortex.plugin"
    assert cortex[0].dist is not None
    assert cortex[0].dist.name == "agentloop-cortex"
    assert cortex[0].load() is plugin


def test_loaded_module_registers_the_tools() -> None:
    (point,) = [p for p in importlib.metadata.entry_points(group="agentloop") if p.name == "cortex"]
    module = point.load()
    registered: list[Any] = []
    module.agentloop_register_tools(register=registered.append)
    assert [t.name for t in registered] == NAMES
    assert all(isinstance(t, Tool) for t in registered)


def test_hook_through_pluggy() -> None:
    manager = pluggy.PluginManager(agentloop.hookspecs.PROJECT_NAME)
    manager.add_hookspecs(agentloop.hookspecs)
    assert manager.load_setuptools_entrypoints("agentloop", name="cortex") == 1
    registered: list[Any] = []
    manager.hook.agentloop_register_tools(register=registered.append)
    assert [t.name for t in registered] == NAMES


def test_schemas() -> None:
    by_name = {t.name: t for t in agentloop_cortex.TOOLS}
    for name, tool in by_name.items():
        schema = tool.input_schema
        assert schema["properties"]["filename"]["enum"] == [
            "memory.md",
            "soul.md",
            "relationship.md",
        ], name
        assert "ctx" not in schema["properties"]
        assert schema["additionalProperties"] is False
        assert all(p.get("description") for p in schema["properties"].values()), name
        assert tool.description and "Args" not in tool.description
    assert by_name["read_file"].input_schema["required"] == ["filename"]
    assert by_name["write_file"].input_schema["required"] == ["filename", "content"]
    assert by_name["append_file"].input_schema["required"] == ["filename", "content"]
    assert by_name["replace_in_file"].input_schema["required"] == ["filename", "old", "new"]


async def test_agentloop_plugin_manager_finds_cortex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = pytest.importorskip("agentloop.plugins")
    monkeypatch.delenv(getattr(plugins, "ENV_VAR", "AGENTLOOP_PLUGINS"), raising=False)
    tools = plugins.plugin_tools(plugins=["cortex"])
    assert [t.name for t in tools] == NAMES
    assert {t.source for t in tools} == {"cortex"}
    script = [
        reply(tool_call("append_file", {"filename": "memory.md", "content": "- sailing\n"})),
        reply("noted"),
    ]
    agent = Agent(provider=ScriptedProvider(script), tools=tools)
    result = await agent.run("I like sailing.", deps=CortexConfig(root=tmp_path, persona="ada"))
    assert result.tool_calls[0].output == "Appended 10 bytes to memory.md (now 10 bytes)."
    assert (tmp_path / "ada" / "memory.md").read_text() == "- sailing\n"
