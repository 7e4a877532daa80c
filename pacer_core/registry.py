"""Plugin discovery: every engine builds its own ``pluggy.PluginManager`` (none is global)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import pluggy

from . import hookspecs
from .errors import ConfigError
from .types import Component

KINDS = ("drafter", "stop", "verifier", "observer")


def new_plugin_manager(extra_plugins: Iterable[Any] = ()) -> pluggy.PluginManager:
    """A plugin manager with the hookspecs, the entry-point plugins and ``extra_plugins``."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    for plugin in extra_plugins:
        if not pm.is_registered(plugin):
            pm.register(plugin)
    pm.check_pending()  # a misspelled hook name fails here, not silently
    return pm


def components(pm: pluggy.PluginManager) -> dict[str, dict[str, Component]]:
    """kind → name → Component, from every registered plugin module's ``pacer_components``."""
    table: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}
    for offered in pm.hook.pacer_components():
        for component in offered or ():
            if component.kind not in table:
                raise ConfigError(f"plugin offers component '{component.name}' of unknown kind '{component.kind}'")
            if component.name in table[component.kind]:
                raise ConfigError(
                    f"two plugins offer a {component.kind} named '{component.name}': uninstall one of them"
                )
            table[component.kind][component.name] = component
    return table


def lookup(table: dict[str, dict[str, Component]], kind: str, name: Optional[str], where: str) -> Component:
    available = ", ".join(sorted(table[kind])) or "none installed"
    if not name:
        raise ConfigError(f"{where}: missing 'name'; available {kind}s: {available}")
    if name not in table[kind]:
        raise ConfigError(f"{where}: unknown {kind} '{name}'; available {kind}s: {available}")
    return table[kind][name]
