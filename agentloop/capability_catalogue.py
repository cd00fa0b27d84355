"""The capabilities plugins ship: one entry of the catalogue, and the `register` callable.

`agentloop.plugins.PluginManager` asks each plugin's `agentloop_register_capabilities`
hook for its capabilities through a `CapabilityRegistrar`, and keeps each as a
`PluginCapability` until an agent picks it by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .capabilities.base import Capability
from .errors import AgentloopError, ConfigurationError

__all__ = ("CapabilityRegistrar", "PluginCapability")


@dataclass(frozen=True)
class PluginCapability:
    """One capability of the catalogue: its name, its plugin, and what makes it."""

    name: str
    """The name it is picked by (`--capability NAME`, `select_capabilities`)."""
    source: str
    """The plugin that registered it."""
    given: Capability | Callable[[], Capability]
    """What the plugin registered: the capability, or a factory making one."""

    def create(self) -> Capability:
        """The capability for an agent: the one registered, or a new one from the factory.

        Raises:
            ConfigurationError: the factory failed, or made something that is not a
                `Capability` (the plugin is named).
        """
        if isinstance(self.given, Capability):
            return self.given
        where = f"plugin {self.source!r}: capability {self.name!r}"
        try:
            made = self.given()
        except AgentloopError:
            raise
        except Exception as exc:
            raise ConfigurationError(
                f"{where}: its factory failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(made, Capability):
            raise ConfigurationError(
                f"{where}: its factory returned {type(made).__name__}, not a Capability"
            )
        return made


class CapabilityRegistrar:
    """The `register` callable one plugin's `agentloop_register_capabilities` receives."""

    def __init__(self, plugin: str, found: list[PluginCapability]) -> None:
        self.plugin = plugin
        self.found = found

    def __call__(self, name: str, capability: Capability | Callable[[], Capability]) -> None:
        """Add the capability (or the factory making it) `name` for this plugin."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ConfigurationError(
                f"a capability's name must be a word such as 'redact', not {name!r}"
            )
        if not isinstance(capability, Capability) and not callable(capability):
            raise ConfigurationError(
                f"capability {name!r}: register a Capability or a function making one, "
                f"not {type(capability).__name__}"
            )
        self.found.append(PluginCapability(name, self.plugin, capability))
