"""Plugin discovery: from installed entry points to catalogues of tools and capabilities.

Plugins are found in the `agentloop` entry-point group, asked through the hooks in
`agentloop.hookspecs` for their tools and capabilities, and kept as catalogues each agent
picks from explicitly (`select()`, `select_capabilities()`); the tools then run in the
registry like any others, the capabilities around the runs that were given them.

An installed plugin never adds a tool or a capability to an agent by itself: with no
names, `select()` returns no tools and `select_capabilities()` none, so installing a
package cannot change what a model may do or what wraps a run.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs
from .capabilities.base import Capability
from .capability_catalogue import CapabilityRegistrar, PluginCapability
from .errors import ConfigurationError, DuplicateToolError
from .hookspecs import PROJECT_NAME
from .logs import get_logger

if TYPE_CHECKING:
    from .tools import Tool

__all__ = (
    "ENV_VAR",
    "PluginCapability",
    "PluginInfo",
    "PluginLoadError",
    "PluginManager",
    "default_manager",
    "installed_plugins",
    "pinned_plugins",
    "plugin_capabilities",
    "plugin_tools",
)

ENV_VAR = "AGENTLOOP_PLUGINS"
"""Comma-separated entry-point names to load; unset loads all, empty loads none."""

_REFUSING_HOOKS = frozenset({"agentloop_run_setup"})
"""Hooks whose `ConfigurationError` refuses the command's options (the command stops)
rather than being recorded as the plugin's failure."""

_log = get_logger()


@dataclass(frozen=True)
class PluginLoadError:
    """A plugin that could not be loaded; kept in `PluginManager.failures`."""

    name: str
    """The entry-point (plugin) name."""
    value: str
    """The entry point's target (`package.module`), or "" when there is none."""
    error: str
    """What went wrong: the exception's type and message."""


@dataclass(frozen=True)
class PluginInfo:
    """One loaded plugin, as `PluginManager.plugins()` describes it."""

    name: str
    """The plugin name (the entry-point name, or the name given to `register`)."""
    module: str
    """The plugin's module (or object type) name."""
    dist: str | None
    """The distribution that installed it; None for plugins registered in code."""
    version: str | None
    """That distribution's version, when there is one."""
    tools: tuple[str, ...]
    """The names of the tools it registers, in registration order."""
    capabilities: tuple[str, ...] = ()
    """The names of the capabilities it registers, in registration order."""


@dataclass(frozen=True)
class _Dist:
    name: str
    version: str


class PluginManager:
    """Loads plugins and builds the catalogue of the tools they register.

    ```python
    manager = PluginManager()
    manager.load_entry_points()
    agent = Agent(tools=[*my_tools, *manager.select(plugins=["weather"])])
    ```
    """

    def __init__(self) -> None:
        """Create a manager with no plugins loaded."""
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._dists: dict[str, _Dist] = {}
        self._values: dict[str, str] = {}
        self._catalogue: dict[str, Tool] | None = None
        self._capabilities: dict[str, PluginCapability] | None = None
        self.failures: list[PluginLoadError] = []
        """Plugins that failed to load or to register their tools."""
        self.left_out: list[str] = []
        """Tools left out of the catalogue because they give way to another plugin's tool
        of the same name (registered with `gives_way`), each as a one-line warning."""

    # ------------------------------------------------------------------ loading

    def load_entry_points(self) -> list[str]:
        """Load the plugins installed in the `agentloop` entry-point group.

        `AGENTLOOP_PLUGINS` pins the list: unset loads every installed plugin, an empty
        value loads none, and names without an installed entry point become failures.
        A plugin that fails to import is recorded in `failures` and logged
        (`plugin.load_failed`); it never stops the others from loading.

        Returns:
            The names of the plugins loaded by this call.
        """
        available = _entry_points()
        wanted = _pinned_names()
        if wanted is None:
            wanted = sorted(available)
        loaded: list[str] = []
        for name in wanted:
            entry_point = available.get(name)
            if entry_point is None:
                self._fail(name, "", f"no installed plugin is called {name!r} (set by {ENV_VAR})")
            elif self._pm.has_plugin(name):
                continue  # loaded by an earlier call
            elif self._load(entry_point):
                loaded.append(name)
        return loaded

    def _load(self, entry_point: metadata.EntryPoint) -> bool:
        try:
            plugin = entry_point.load()
            _check_hashable(plugin, entry_point.name)
            self._pm.register(plugin, name=entry_point.name)
        except Exception as exc:
            self._fail(entry_point.name, entry_point.value, _describe(exc))
            return False
        self._values[entry_point.name] = entry_point.value
        dist = entry_point.dist
        if dist is not None:
            self._dists[entry_point.name] = _Dist(dist.metadata["Name"], dist.version)
        self._catalogue = self._capabilities = None
        return True

    def _fail(self, name: str, value: str, error: str) -> None:
        self.failures.append(PluginLoadError(name, value, error))
        _log.warning("plugin.load_failed", plugin=name, entry_point=value, error=error)

    def register(self, plugin: object, name: str) -> None:
        """Add a plugin given in code: a module or object with hook implementations.

        The object must be hashable: pluggy keeps plugins in sets when it calls one
        plugin's hooks on their own.

        Raises:
            ConfigurationError: `name` is taken, the plugin's hooks are invalid, or the
                plugin is not hashable.
        """
        _check_hashable(plugin, name)
        try:
            self._pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise ConfigurationError(f"cannot register plugin {name!r}: {exc}") from exc
        self._catalogue = self._capabilities = None

    # ------------------------------------------------------------------ catalogue

    def tools(self) -> list[Tool]:
        """Every tool of every loaded plugin, in plugin then registration order.

        Each plugin's hook is called on its own, so each tool's `source` is its plugin's
        name. A plugin whose hook fails is recorded in `failures` and contributes nothing.

        Raises:
            DuplicateToolError: two plugins register one tool name (both are named).
        """
        return list(self._build().values())

    def _build(self) -> dict[str, Tool]:
        if self._catalogue is None:
            catalogue: dict[str, Tool] = {}
            self.left_out = []
            yielding: dict[str, str] = {}
            for name, plugin in self._pm.list_name_plugin():
                if plugin is not None:
                    self._collect(name, plugin, catalogue, yielding)
            self._catalogue = catalogue
        return self._catalogue

    def _collect(
        self, name: str, plugin: object, catalogue: dict[str, Tool], yielding: dict[str, str]
    ) -> None:
        caller = self._caller_for(plugin, "agentloop_register_tools")
        found: list[Tool] = []
        registrar = _Registrar(name, found)
        try:
            caller(register=registrar)
        except Exception as exc:
            self._fail(name, self._values.get(name, ""), _describe(exc))
            return
        for item in found:
            hint = registrar.gives_way.get(id(item))
            if item.name in catalogue:
                first = catalogue[item.name]
                if hint is not None:
                    self._leave_out(item, first, hint)
                    continue
                if item.name not in yielding:
                    raise DuplicateToolError(
                        f"tool name {item.name!r} is registered by plugin {first.source!r} and "
                        f"by plugin {name!r}; the model addresses tools by name, so uninstall "
                        f"one or pin the plugins with {ENV_VAR}"
                    )
                self._leave_out(first, item, yielding.pop(item.name))
                del catalogue[item.name]
            catalogue[item.name] = item
            if hint is not None:
                yielding[item.name] = hint

    def _leave_out(self, tool: Tool, kept: Tool, hint: str) -> None:
        """Record (and log) that `tool` gave way to `kept`, another plugin's of its name."""
        line = (
            f"tool {tool.name!r} of plugin {tool.source!r} left out: plugin {kept.source!r} "
            f"registers a tool of that name; {hint}"
        )
        self.left_out.append(line)
        _log.warning("plugin.tool_left_out", tool=tool.name, plugin=tool.source, message=line)

    def capabilities(self) -> list[PluginCapability]:
        """Every capability of every loaded plugin, in plugin then registration order.

        Each plugin's hook is called on its own, so each capability's `source` is its
        plugin's name. A plugin whose hook fails is recorded in `failures` and
        contributes nothing.

        Raises:
            ConfigurationError: two plugins register one capability name (both are named).
        """
        return list(self._build_capabilities().values())

    def _build_capabilities(self) -> dict[str, PluginCapability]:
        if self._capabilities is None:
            catalogue: dict[str, PluginCapability] = {}
            for name, plugin in self._pm.list_name_plugin():
                if plugin is None:
                    continue
                caller = self._caller_for(plugin, "agentloop_register_capabilities")
                found: list[PluginCapability] = []
                try:
                    caller(register=CapabilityRegistrar(name, found))
                except Exception as exc:
                    why = f"agentloop_register_capabilities: {_describe(exc)}"
                    self._fail(name, self._values.get(name, ""), why)
                    continue
                for item in found:
                    if item.name in catalogue:
                        raise ConfigurationError(
                            f"capability name {item.name!r} is registered by plugin "
                            f"{catalogue[item.name].source!r} and by plugin {name!r}; "
                            f"uninstall one or pin the plugins with {ENV_VAR}"
                        )
                    catalogue[item.name] = item
            self._capabilities = catalogue
        return self._capabilities

    def _caller_for(self, plugin: object, hook: str) -> Any:
        """`hook`'s caller restricted to one plugin's implementation."""
        others = [p for _, p in self._pm.list_name_plugin() if p is not plugin]
        return self._pm.subset_hook_caller(hook, remove_plugins=others)

    def call_each(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call a hook of `agentloop.hookspecs` on each loaded plugin on its own.

        Plugins are called in load order, so each result can be attributed to its plugin.
        A plugin whose implementation raises is recorded in `failures`, logged as
        `plugin.load_failed`, and left out; the others are still called. The exception:
        a `ConfigurationError` from `agentloop_run_setup` is the plugin refusing the
        command's options, and propagates.

        Args:
            hook: The hook's name, e.g. `"agentloop_run_setup"`.
            **kwargs: The hook's arguments, by name.

        Returns:
            `(plugin name, result)` for each plugin that implements the hook and returned
            something other than None.

        Raises:
            ConfigurationError: a plugin refused the command's options (see above).
        """
        results: list[tuple[str, Any]] = []
        for name, plugin in self._pm.list_name_plugin():
            if plugin is None:
                continue
            try:
                answers = self._caller_for(plugin, hook)(**kwargs)
            except Exception as exc:
                if isinstance(exc, ConfigurationError) and hook in _REFUSING_HOOKS:
                    raise
                self._fail(name, self._values.get(name, ""), f"{hook}: {_describe(exc)}")
                continue
            results += [(name, answer) for answer in answers if answer is not None]
        return results

    def plugins(self) -> list[PluginInfo]:
        """The loaded plugins with their distribution, version, tool and capability names."""
        by_plugin: dict[str, list[str]] = {}
        for item in self._build().values():
            by_plugin.setdefault(item.source or "", []).append(item.name)
        capabilities: dict[str, list[str]] = {}
        for entry in self._build_capabilities().values():
            capabilities.setdefault(entry.source, []).append(entry.name)
        infos = []
        for name, plugin in self._pm.list_name_plugin():
            dist = self._dists.get(name)
            infos.append(
                PluginInfo(
                    name=name,
                    module=_module_name(plugin),
                    dist=dist.name if dist else None,
                    version=dist.version if dist else None,
                    tools=tuple(by_plugin.get(name, ())),
                    capabilities=tuple(capabilities.get(name, ())),
                )
            )
        return infos

    def select(
        self, *, plugins: Sequence[str] | None = None, tools: Sequence[str] | None = None
    ) -> list[Tool]:
        """The tools an agent should expose, chosen explicitly.

        With neither argument this returns `[]`: an agent never gains a tool just
        because a package was installed. `plugins` picks every tool of those plugins;
        `tools` picks tools by name; given both, `tools` narrows the plugins' tools.
        Tools come back in catalogue order, so requests stay byte-stable.

        Args:
            plugins: Plugin names whose tools to expose.
            tools: Tool names to expose (within `plugins`, when both are given).

        Raises:
            ConfigurationError: a name is unknown; the message lists what is available.
            DuplicateToolError: two plugins register one tool name.
        """
        if plugins is None and tools is None:
            return []
        chosen = self.tools()
        if plugins is not None:
            known = [name for name, _ in self._pm.list_name_plugin()]
            _check_names("plugin", plugins, known)
            chosen = [t for t in chosen if t.source in plugins]
        if tools is not None:
            _check_names("tool", tools, [t.name for t in chosen])
            chosen = [t for t in chosen if t.name in tools]
        return chosen

    def select_capabilities(self, names: Sequence[str] | None = None) -> list[Capability]:
        """The capabilities named, in the order given (the first is the outermost).

        With no names this returns `[]` without building the catalogue: a run never gains
        a capability because a package was installed. A capability registered as a
        factory is made anew on each call; one registered as an instance is shared.

        ```python
        agent = Agent(tools=my_tools, capabilities=manager.select_capabilities(["redact"]))
        ```

        Args:
            names: Capability names (as registered by the plugins).

        Raises:
            ConfigurationError: a name is unknown (the message lists what is available),
                two plugins register one name, or a factory fails.
        """
        if not names:
            return []
        catalogue = self._build_capabilities()
        _check_names("capability", names, list(catalogue))
        return [catalogue[name].create() for name in names]


class _Registrar:
    """The `register` callable one plugin's hook receives."""

    def __init__(self, plugin: str, found: list[Tool]) -> None:
        self.plugin = plugin
        self.found = found
        self.gives_way: dict[int, str] = {}
        """The tools registered with `gives_way` (by `id`), and its text."""

    def __call__(
        self,
        item: Tool | Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        eager: bool | None = None,
        deps: Any = None,
        deps_factory: Callable[[], Any] | None = None,
        gives_way: str | None = None,
    ) -> Tool:
        """Add one tool for this plugin, with `@tool`'s options; returns the `Tool`.

        `deps` (or `deps_factory`, making it at each call) is what the tool gets as
        `RunContext.deps` instead of the run's: the plugin's own, wherever it runs.
        `gives_way`: when another plugin registers a tool of the same name, leave this
        one out (with a warning ending in this text, which says how to keep it) rather
        than fail with `DuplicateToolError`. For tools a plugin does not name itself
        (an MCP server's, say).
        """
        options = (name, description, timeout, eager, deps, deps_factory)
        # Here, not at the top: loading plugins (for `agentloop --help`) needs no pydantic.
        from .tools import Tool

        if not isinstance(item, Tool):
            new = Tool(
                item,
                name=name,
                description=description,
                timeout=timeout,
                eager=True if eager is None else eager,
                deps=deps,
                deps_factory=deps_factory,
            )
        elif all(option is None for option in options):
            new = copy.copy(item)  # a module-level Tool may be shared: give ours the source
        else:
            new = item.replace(
                name=name,
                description=description,
                timeout=timeout,
                eager=eager,
                deps=deps,
                deps_factory=deps_factory,
            )
        new.source = self.plugin
        self.found.append(new)
        if gives_way is not None:
            self.gives_way[id(new)] = gives_way
        return new


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """Installed entry points of the group by name; the first of a repeated name wins."""
    found: dict[str, metadata.EntryPoint] = {}
    for entry_point in metadata.entry_points(group=PROJECT_NAME):
        found.setdefault(entry_point.name, entry_point)
    return found


def _pinned_names() -> list[str] | None:
    value = os.environ.get(ENV_VAR)
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _check_hashable(plugin: object, name: str) -> None:
    """Refuse a plugin pluggy could register but never call on its own (it hashes them)."""
    try:
        hash(plugin)
    except TypeError:
        kind = type(plugin).__name__
        raise ConfigurationError(
            f"cannot register plugin {name!r}: a {kind} instance is not hashable (its class "
            "defines __eq__ without __hash__, as @dataclass does by default), and the plugin "
            "manager keeps plugins in sets; register a module or a class, or give the class "
            "a __hash__ (@dataclass(eq=False), or frozen=True)"
        ) from None


def _check_names(kind: str, asked: Iterable[str], known: Sequence[str]) -> None:
    unknown = [name for name in asked if name not in known]
    if unknown:
        listed = ", ".join(known) or "none"
        raise ConfigurationError(
            f"unknown {kind} name(s): {', '.join(unknown)}; available: {listed}"
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _module_name(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    return name if isinstance(name, str) else type(plugin).__qualname__


def installed_plugins() -> dict[str, str]:
    """Every plugin installed in the `agentloop` entry-point group, loaded or not.

    Unlike `PluginManager.plugins()`, this ignores `AGENTLOOP_PLUGINS` and imports nothing.

    Returns:
        Plugin name -> its distribution and version (`"agentloop-weather 1.0"`), or the
        entry point's target when no distribution is known.
    """
    found: dict[str, str] = {}
    for name, entry_point in sorted(_entry_points().items()):
        dist = entry_point.dist
        found[name] = f"{dist.metadata['Name']} {dist.version}" if dist else entry_point.value
    return found


def pinned_plugins() -> list[str] | None:
    """The plugin names `AGENTLOOP_PLUGINS` pins, or None when it is unset (load all)."""
    return _pinned_names()


def default_manager() -> PluginManager:
    """A new manager with the installed plugins loaded (honouring `AGENTLOOP_PLUGINS`)."""
    manager = PluginManager()
    manager.load_entry_points()
    return manager


def plugin_tools(
    plugins: Sequence[str] | None = None, tools: Sequence[str] | None = None
) -> list[Tool]:
    """Tools from installed plugins, chosen by plugin and/or tool name.

    `Agent(tools=[*my_tools, *plugin_tools(plugins=["weather"])])`. With no names it
    returns `[]` (see `PluginManager.select`).

    Raises:
        ConfigurationError: a name is unknown; the message lists what is available.
        DuplicateToolError: two plugins register one tool name.
    """
    return default_manager().select(plugins=plugins, tools=tools)


def plugin_capabilities(names: Sequence[str] | None = None) -> list[Capability]:
    """Capabilities from installed plugins, by name, in the order given.

    `Agent(capabilities=plugin_capabilities(["redact"]))`. With no names it returns `[]`
    (see `PluginManager.select_capabilities`).

    Raises:
        ConfigurationError: a name is unknown (the message lists what is available), two
            plugins register one name, or a factory fails.
    """
    return default_manager().select_capabilities(names)
