"""Plugin discovery end to end, with real installed distributions.

The example plugins (weather's tools, redact's capability) are pip-installed into this
environment for the session (and removed afterwards unless they were there before);
throwaway plugins (one that fails to import, one that clashes with the weather tools, one
whose tool returns personal data) are pip-installed into private target directories that
only the tests that need them put on `sys.path`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import agentloop
from agentloop import Agent, Capability, ConfigurationError, RunContext, Tool, tool
from agentloop.calls import ToolCall, ToolResult
from agentloop.capabilities import NextCall
from agentloop.errors import DuplicateToolError
from agentloop.plugins import (
    ENV_VAR,
    PluginManager,
    default_manager,
    plugin_capabilities,
    plugin_tools,
)
from agentloop.testing import MessagesServer, ScriptedProvider, reply, tool_call

ROOT = Path(__file__).resolve().parents[2]
WEATHER = ROOT / "examples" / "weather_plugin"
WEATHER_DIST = "agentloop-weather-example"
REDACT = ROOT / "examples" / "redact_plugin"
REDACT_DIST = "agentloop-redact-example"


def pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def install_example(
    tmp_path_factory: pytest.TempPathFactory, folder: Path, dist: str
) -> Iterator[None]:
    """An example plugin, installed into the running environment until the generator ends."""
    was_there = installed(dist)
    source = tmp_path_factory.mktemp(dist) / folder.name  # builds leave files behind
    shutil.copytree(folder, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip("install", "--no-deps", str(source))
    yield
    if not was_there:
        pip("uninstall", "-y", dist)


@pytest.fixture(scope="session")
def weather_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The example weather plugin, installed into the running environment for the session."""
    yield from install_example(tmp_path_factory, WEATHER, WEATHER_DIST)


@pytest.fixture(scope="session")
def redact_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The example redact plugin, installed into the running environment for the session."""
    yield from install_example(tmp_path_factory, REDACT, REDACT_DIST)


def make_dist(root: Path, name: str, entry_point: str, module_source: str) -> Path:
    """Write a one-module distribution registering `module_source` as plugin `entry_point`."""
    package = name.replace("-", "_")
    project = root / name
    project.mkdir(parents=True)
    (project / f"{package}.py").write_text(textwrap.dedent(module_source))
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name}"
            version = "0.0.1"

            [project.entry-points.agentloop]
            {entry_point} = "{package}"

            [tool.setuptools]
            py-modules = ["{package}"]
            """
        )
    )
    return project


BROKEN_MODULE = """\
raise RuntimeError("this plugin is broken on purpose")
"""

CLASHING_MODULE = """\
import agentloop


def get_weather(city: str) -> str:
    \"\"\"Weather, again.\"\"\"
    return "rain"


@agentloop.hookimpl
def agentloop_register_tools(register):
    register(get_weather)
"""


CONTACTS_MODULE = """\
import agentloop


def contact(name: str) -> str:
    \"\"\"How to reach a customer, and the card on file.\"\"\"
    return f"{name}: ada@example.com, card 4111 1111 1111 1111, order 1042"


@agentloop.hookimpl
def agentloop_register_tools(register):
    register(contact)
"""


@pytest.fixture(scope="session")
def throwaway_dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Site directories holding real installed plugins: broken, clashing, and contacts."""
    root = tmp_path_factory.mktemp("dists")
    sites = {}
    for name, entry_point, source in [
        ("agentloop-broken-example", "broken", BROKEN_MODULE),
        ("agentloop-clash-example", "clash", CLASHING_MODULE),
        ("agentloop-contacts-example", "contacts", CONTACTS_MODULE),
    ]:
        project = make_dist(root / "src", name, entry_point, source)
        site = root / entry_point
        pip("install", "--no-deps", "--target", str(site), str(project))
        sites[entry_point] = site
    return sites


@pytest.fixture(autouse=True)
def no_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "ANTHROPIC_API_KEY")}
    return {**env, **extra}


# --------------------------------------------------------------------------- discovery


def test_installed_plugin_is_discovered_without_code(weather_installed: None) -> None:
    manager = default_manager()
    info = {i.name: i for i in manager.plugins()}["weather"]
    assert info.dist == WEATHER_DIST
    assert info.version == "0.1.0"
    assert info.module == "agentloop_weather.tools"
    assert info.tools == ("get_weather", "get_forecast")
    assert manager.failures == []
    weather = {t.name: t for t in manager.tools() if t.source == "weather"}
    assert set(weather) == {"get_weather", "get_forecast"}
    assert weather["get_weather"].input_schema["properties"]["units"]["enum"] == [
        "metric",
        "imperial",
    ]
    assert weather["get_forecast"].is_async
    assert weather["get_forecast"].timeout == 5.0


async def test_plugin_tools_reach_the_model(weather_installed: None) -> None:
    script = [
        reply(
            tool_call("get_weather", {"city": "Paris", "units": "imperial"}),
            tool_call("get_forecast", {"city": "Rome", "days": 2}),
        ),
        reply("Mild in both."),
    ]
    with MessagesServer(script) as server:
        async with server.client() as client:
            agent = Agent(client=client, tools=plugin_tools(plugins=["weather"]))
            result = await agent.run("Weather in Paris, forecast for Rome?")
    announced = {t["name"]: t for t in server.requests[0]["tools"]}
    assert set(announced) == {"get_weather", "get_forecast"}
    assert announced["get_weather"]["input_schema"]["properties"]["units"]["enum"] == [
        "metric",
        "imperial",
    ]
    assert result.text == "Mild in both."
    outputs = {c.name: c for c in result.tool_calls}
    assert outputs["get_weather"].output.endswith("°F") and not outputs["get_weather"].is_error
    assert outputs["get_forecast"].output.startswith('["day 1:')
    answered = server.requests[1]["messages"][-1]["content"]
    assert [b["type"] for b in answered] == ["tool_result", "tool_result"]


def test_cli_lists_plugin_tools(weather_installed: None) -> None:
    command = [sys.executable, "-m", "agentloop", "tools"]
    done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "[weather]" in lines["get_weather"]
    assert "[weather]" in lines["get_forecast"]

    done = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, env=subprocess_env()
    )
    tools = {t["name"]: t for t in json.loads(done.stdout)}
    assert tools["get_weather"]["plugin"] == "weather"
    assert tools["get_weather"]["input_schema"]["required"] == ["city"]


REDACTED = "Ada: [email], card [card ending 1111], order 1042"


def test_an_installed_capability_is_discovered_without_code(redact_installed: None) -> None:
    manager = default_manager()
    info = {i.name: i for i in manager.plugins()}["redact"]
    assert (info.dist, info.version, info.module) == (
        REDACT_DIST,
        "0.1.0",
        "agentloop_redact.capability",
    )
    assert (info.tools, info.capabilities) == ((), ("redact",))
    (entry,) = [c for c in manager.capabilities() if c.source == "redact"]
    assert entry.name == "redact"
    assert manager.failures == []
    first, second = (manager.select_capabilities(["redact"])[0] for _ in range(2))
    assert isinstance(first, agentloop.Capability) and first is not second  # a class: made anew


async def test_a_plugin_capability_redacts_what_the_model_is_sent(redact_installed: None) -> None:
    def contact(name: str) -> str:
        """How to reach a customer."""
        return f"{name}: ada@example.com, card 4111 1111 1111 1111, order 1042"

    script = [reply(tool_call("contact", {"name": "Ada"})), reply("Reached.")]
    with MessagesServer(script) as server:
        async with server.client() as client:
            agent = Agent(
                client=client, tools=[contact], capabilities=plugin_capabilities(["redact"])
            )
            result = await agent.run("How do I reach Ada?")
    answered = server.requests[1]["messages"][-1]["content"][0]
    assert answered["type"] == "tool_result" and answered["content"] == REDACTED
    assert result.tool_calls[0].output == REDACTED
    assert "ada@example.com" not in json.dumps(result.messages)


def test_cli_run_with_an_installed_capability(
    redact_installed: None, throwaway_dists: dict[str, Path]
) -> None:
    script = [reply(tool_call("contact", {"name": "Ada"})), reply("Reached.")]
    command = [sys.executable, "-m", "agentloop", "run", "How do I reach Ada?", "--json"]
    with MessagesServer(script) as server:
        done = subprocess.run(
            [*command, "--plugin", "contacts", "--capability", "redact"],
            capture_output=True,
            text=True,
            env=subprocess_env(
                PYTHONPATH=str(throwaway_dists["contacts"]),
                ANTHROPIC_API_KEY="sk-ant-test",
                ANTHROPIC_BASE_URL=server.base_url,
            ),
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tool_calls"][0]["output"] == REDACTED
    assert server.requests[1]["messages"][-1]["content"][0]["content"] == REDACTED


# --------------------------------------------------------------------------- AGENTLOOP_PLUGINS


def test_unset_env_loads_every_installed_plugin(weather_installed: None) -> None:
    manager = PluginManager()
    loaded = manager.load_entry_points()
    expected = sorted({ep.name for ep in metadata.entry_points(group="agentloop")})
    assert loaded == expected
    assert "weather" in loaded
    assert manager.load_entry_points() == [], "loading again adds nothing"
    assert manager.failures == []


def test_empty_env_loads_none(weather_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "")
    manager = default_manager()
    assert manager.plugins() == []
    assert manager.tools() == []
    assert manager.failures == []


def test_env_pins_the_plugin_list(weather_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "weather, nonexistent")
    manager = PluginManager()
    assert manager.load_entry_points() == ["weather"]
    assert [i.name for i in manager.plugins()] == ["weather"]
    assert [(f.name, f.value) for f in manager.failures] == [("nonexistent", "")]
    assert ENV_VAR in manager.failures[0].error


# --------------------------------------------------------------------------- failures


def test_broken_plugin_is_reported_and_others_load(
    weather_installed: None,
    throwaway_dists: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(throwaway_dists["broken"]))
    with capture_logs() as logs:
        manager = default_manager()
    assert [(f.name, f.value) for f in manager.failures] == [("broken", "agentloop_broken_example")]
    assert "RuntimeError: this plugin is broken on purpose" in manager.failures[0].error
    assert "weather" in [i.name for i in manager.plugins()]
    assert {t.name for t in manager.select(plugins=["weather"])} == {"get_weather", "get_forecast"}
    failed = [e for e in logs if e["event"] == "plugin.load_failed"]
    assert failed[0]["plugin"] == "broken" and failed[0]["log_level"] == "warning"


def test_cli_plugins_reports_failures(
    weather_installed: None, throwaway_dists: dict[str, Path]
) -> None:
    env = subprocess_env(PYTHONPATH=str(throwaway_dists["broken"]))
    done = subprocess.run(
        [sys.executable, "-m", "agentloop", "plugins"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "weather 0.1.0 (agentloop-weather-example): get_weather, get_forecast" in done.stdout
    assert "FAILED broken (agentloop_broken_example): RuntimeError:" in done.stdout
    # Reported once, by the command itself; the log event shows with -v.
    assert "plugin.load_failed" not in done.stderr
    verbose = subprocess.run(
        [sys.executable, "-m", "agentloop", "plugins", "-v"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "plugin.load_failed" in verbose.stderr


@pytest.mark.parametrize("order", ["giver-first", "giver-last"])
def test_a_tool_registered_to_give_way_is_left_out_with_a_warning(order: str) -> None:
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    class Owner:
        @staticmethod
        @agentloop.hookimpl
        def agentloop_register_tools(register: Callable[..., Any]) -> None:
            register(lookup)

    class Giver:
        @staticmethod
        @agentloop.hookimpl
        def agentloop_register_tools(register: Callable[..., Any]) -> None:
            register(lookup, gives_way="rename it to keep it")
            register(lookup, name="other_lookup", gives_way="unused")

    manager = PluginManager()
    plugins = [("giver", Giver), ("owner", Owner)]
    for name, plugin in plugins if order == "giver-first" else plugins[::-1]:
        manager.register(plugin, name=name)
    with capture_logs() as logs:
        tools = {t.name: t.source for t in manager.tools()}
    assert tools == {"lookup": "owner", "other_lookup": "giver"}
    line = (
        "tool 'lookup' of plugin 'giver' left out: plugin 'owner' registers a tool of that "
        "name; rename it to keep it"
    )
    assert manager.left_out == [line]
    assert [e["message"] for e in logs if e["event"] == "plugin.tool_left_out"] == [line]


def test_duplicate_tool_across_installed_plugins_names_both(
    weather_installed: None,
    throwaway_dists: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(throwaway_dists["clash"]))
    monkeypatch.setenv(ENV_VAR, "clash,weather")
    manager = default_manager()
    with pytest.raises(DuplicateToolError) as caught:
        manager.tools()
    assert "'get_weather'" in str(caught.value)
    assert "'clash'" in str(caught.value) and "'weather'" in str(caught.value)


class _Plugin:
    """A plugin given in code: any object with hook implementations."""

    def __init__(self, *tools: Any, **options: Any) -> None:
        self.tools = tools
        self.options = options

    @agentloop.hookimpl
    def agentloop_register_tools(self, register: Callable[..., Any]) -> None:
        for item in self.tools:
            register(item, **self.options)


def ping() -> str:
    """Answer pong."""
    return "pong"


def test_duplicate_tool_in_code_names_both_plugins() -> None:
    manager = PluginManager()
    manager.register(_Plugin(ping), "first")
    manager.register(_Plugin(ping), "second")
    with pytest.raises(DuplicateToolError, match=r"'first' and by plugin 'second'"):
        manager.tools()


def test_plugin_whose_hook_fails_is_recorded() -> None:
    manager = PluginManager()
    manager.register(_Plugin(ping), "good")
    manager.register(_Plugin(lambda *args: None), "bad")  # *args: no schema possible
    assert [t.name for t in manager.tools()] == ["ping"]
    assert [f.name for f in manager.failures] == ["bad"]
    assert "ConfigurationError" in manager.failures[0].error


def test_register_name_taken_is_a_configuration_error() -> None:
    manager = PluginManager()
    manager.register(_Plugin(ping), "same")
    with pytest.raises(ConfigurationError, match="'same'"):
        manager.register(_Plugin(ping), "same")


@dataclass
class _DataPlugin:
    """A dataclass plugin: `eq=True` (the default) leaves it without a hash."""

    greeting: str = "hello"

    @agentloop.hookimpl
    def agentloop_register_tools(self, register: Callable[..., Any]) -> None:
        register(ping)


class _EqualPlugin(_Plugin):
    """A plugin class that defines `__eq__` without `__hash__`."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _EqualPlugin) and other.tools == self.tools


@pytest.mark.parametrize(
    "plugin",
    [
        pytest.param(_DataPlugin(), id="dataclass"),
        pytest.param(_EqualPlugin(ping), id="eq-without-hash"),
    ],
)
def test_an_unhashable_plugin_is_refused_with_the_reason(plugin: object) -> None:
    manager = PluginManager()
    manager.register(_Plugin(ping, name="pong"), "other")
    with pytest.raises(ConfigurationError, match=r"'unhashable'.* not hashable") as caught:
        manager.register(plugin, "unhashable")
    assert "__hash__" in str(caught.value)
    # Nothing of it was kept: the manager goes on as before.
    assert [t.name for t in manager.tools()] == ["pong"]
    assert [p.name for p in manager.plugins()] == ["other"]
    assert manager.failures == []


def test_a_hashable_dataclass_plugin_works() -> None:
    @dataclass(frozen=True)
    class Frozen:
        @agentloop.hookimpl
        def agentloop_register_tools(self, register: Callable[..., Any]) -> None:
            register(ping)

    manager = PluginManager()
    manager.register(Frozen(), "frozen")
    assert [(t.name, t.source) for t in manager.tools()] == [("ping", "frozen")]


# --------------------------------------------------------------------------- registration


def test_each_tool_records_its_plugin_and_options_apply() -> None:
    shared = tool(ping)
    manager = PluginManager()
    manager.register(_Plugin(shared), "plain")
    manager.register(_Plugin(ping, name="ping2", timeout=2.5, eager=False), "options")
    plain, renamed = manager.tools()
    assert (plain.name, plain.source) == ("ping", "plain")
    assert shared.source is None, "a shared Tool object is not changed by registering it"
    assert (renamed.name, renamed.source, renamed.timeout, renamed.eager) == (
        "ping2",
        "options",
        2.5,
        False,
    )
    assert isinstance(renamed, Tool) and renamed.description == "Answer pong."
    info = {i.name: i for i in manager.plugins()}
    assert info["options"].tools == ("ping2",) and info["options"].dist is None


# --------------------------------------------------------------------------- select


@pytest.fixture
def two_plugins() -> PluginManager:
    def pong() -> str:
        """Answer ping."""
        return "ping"

    manager = PluginManager()
    manager.register(_Plugin(ping), "a")
    manager.register(_Plugin(pong), "b")
    return manager


def test_select_defaults_to_no_tools(two_plugins: PluginManager) -> None:
    assert two_plugins.select() == []
    assert plugin_tools() == []


@pytest.mark.parametrize(
    ("plugins", "tools", "expected"),
    [
        pytest.param(["a"], None, ["ping"], id="by-plugin"),
        pytest.param(["b", "a"], None, ["ping", "pong"], id="catalogue-order"),
        pytest.param(None, ["pong"], ["pong"], id="by-tool"),
        pytest.param(["a", "b"], ["pong"], ["pong"], id="tool-narrows-plugins"),
        pytest.param([], None, [], id="no-plugins"),
    ],
)
def test_select(
    two_plugins: PluginManager,
    plugins: list[str] | None,
    tools: list[str] | None,
    expected: list[str],
) -> None:
    assert [t.name for t in two_plugins.select(plugins=plugins, tools=tools)] == expected


@pytest.mark.parametrize(
    ("plugins", "tools", "message"),
    [
        pytest.param(["c"], None, "unknown plugin name(s): c; available: a, b", id="plugin"),
        pytest.param(
            None, ["nope"], "unknown tool name(s): nope; available: ping, pong", id="tool"
        ),
        pytest.param(["a"], ["pong"], "unknown tool name(s): pong; available: ping", id="outside"),
    ],
)
def test_select_unknown_names(
    two_plugins: PluginManager, plugins: list[str] | None, tools: list[str] | None, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        two_plugins.select(plugins=plugins, tools=tools)
    assert str(caught.value) == message


# --------------------------------------------------------------------------- capabilities


class Stamp(Capability):
    """Marks each tool result with its label."""

    def __init__(self, label: str = "stamped") -> None:
        self.label = label

    async def wrap_tool_call(
        self, ctx: RunContext[Any], call: ToolCall, call_next: NextCall
    ) -> ToolResult:
        result = await call_next(call)
        return replace(result, content=f"{result.text} [{self.label}]")


class _CapabilityPlugin:
    """A plugin given in code that registers capabilities: `(name, what)` pairs."""

    def __init__(self, *registered: tuple[Any, Any]) -> None:
        self.registered = registered

    @agentloop.hookimpl
    def agentloop_register_capabilities(self, register: Callable[..., Any]) -> None:
        for name, given in self.registered:
            register(name, given)


def test_capabilities_are_picked_by_name_in_the_order_given() -> None:
    shared = Stamp("shared")
    manager = PluginManager()
    manager.register(_Plugin(ping), "tools")
    manager.register(_CapabilityPlugin(("shared", shared), ("fresh", Stamp)), "stamps")
    assert manager.select_capabilities() == [] and manager.select_capabilities([]) == []
    assert [(c.name, c.source) for c in manager.capabilities()] == [
        ("shared", "stamps"),
        ("fresh", "stamps"),
    ]
    fresh, again = manager.select_capabilities(["fresh", "shared"])
    assert isinstance(fresh, Stamp) and fresh.label == "stamped" and again is shared
    assert manager.select_capabilities(["fresh"])[0] is not fresh  # a factory: made anew
    info = {i.name: i for i in manager.plugins()}
    assert (info["stamps"].tools, info["stamps"].capabilities) == ((), ("shared", "fresh"))
    assert (info["tools"].tools, info["tools"].capabilities) == (("ping",), ())

    provider = ScriptedProvider([reply(tool_call("ping", {})), reply("ok")])
    outer_first = manager.select_capabilities(["shared", "fresh"])
    agent = Agent(provider=provider, tools=manager.select(plugins=["tools"]))
    result = agent.run_sync("go", capabilities=outer_first)
    assert result.tool_calls[0].output == "pong [stamped] [shared]"


def test_an_unknown_capability_name_lists_the_known_ones() -> None:
    manager = PluginManager()
    manager.register(_CapabilityPlugin(("b", Stamp), ("a", Stamp)), "stamps")
    with pytest.raises(ConfigurationError) as caught:
        manager.select_capabilities(["a", "nope"])
    assert str(caught.value) == "unknown capability name(s): nope; available: b, a"


def test_a_duplicate_capability_name_names_both_plugins_when_capabilities_are_asked_for() -> None:
    manager = PluginManager()
    manager.register(_CapabilityPlugin(("stamp", Stamp)), "first")
    manager.register(_CapabilityPlugin(("stamp", Stamp)), "second")
    manager.register(_Plugin(ping), "tools")
    # Runs that name no capability do not build the catalogue: the clash does not stop them.
    assert manager.select_capabilities() == [] and [t.name for t in manager.tools()] == ["ping"]
    with pytest.raises(
        ConfigurationError, match=r"'stamp' is registered by plugin 'first' and by plugin 'second'"
    ):
        manager.select_capabilities(["stamp"])


@pytest.mark.parametrize(
    ("registered", "error"),
    [
        pytest.param(("", Stamp), "a capability's name must be a word", id="empty-name"),
        pytest.param((" x", Stamp), "a capability's name must be a word", id="spaced-name"),
        pytest.param((3, Stamp), "a capability's name must be a word", id="not-a-name"),
        pytest.param(("x", "Stamp"), "register a Capability or a function making one", id="str"),
    ],
)
def test_a_plugin_registering_a_bad_capability_is_recorded_and_adds_nothing(
    registered: tuple[Any, Any], error: str
) -> None:
    manager = PluginManager()
    manager.register(_CapabilityPlugin(("good", Stamp), registered), "bad")
    manager.register(_CapabilityPlugin(("other", Stamp)), "fine")
    assert [c.name for c in manager.capabilities()] == ["other"]
    (failure,) = manager.failures
    assert failure.name == "bad" and error in failure.error
    assert failure.error.startswith("agentloop_register_capabilities: ConfigurationError")


def _broken_factory() -> Capability:
    raise RuntimeError("no licence key")


@pytest.mark.parametrize(
    ("factory", "error"),
    [
        pytest.param(
            _broken_factory,
            "plugin 'maker': capability 'x': its factory failed: RuntimeError: no licence key",
            id="raises",
        ),
        pytest.param(
            lambda: "not one",
            "plugin 'maker': capability 'x': its factory returned str, not a Capability",
            id="not-a-capability",
        ),
    ],
)
def test_a_factory_that_fails_is_a_configuration_error_naming_the_plugin(
    factory: Callable[[], Any], error: str
) -> None:
    manager = PluginManager()
    manager.register(_CapabilityPlugin(("x", factory)), "maker")
    with pytest.raises(ConfigurationError) as caught:
        manager.select_capabilities(["x"])
    assert str(caught.value) == error
