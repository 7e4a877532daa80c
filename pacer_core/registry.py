"""Plugin discovery and the resolved strategy stack.

Every engine builds its own ``pluggy.PluginManager`` (none is global); the entry-point scan that
finds plugin modules is done once per process. ``check_hooks`` runs after the engine registered the
strategy objects, so a misspelled hook on one of them is an error, not a hook never called.
"""

from __future__ import annotations

import difflib
import functools
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import attrs
import pluggy

from . import hookcheck, hookspecs
from .errors import ConfigError, UnknownHookError
from .types import Component

KINDS = ("drafter", "stop", "verifier", "observer")

# capability → what it is; components declare them in ``needs`` / ``provides``
CAPABILITIES = {
    "greedy": "greedy decoding",  # supplied by the run when sampling.temperature = 0
    "draft_model": "a draft model",  # supplied by the run: draft.path, or the drafter's shipped draft
    "target_hidden": "the target's hidden states",  # supplied by the run: the target pass returns them
    "draft_probs": "the draft's probabilities",  # DraftBlock.draft_probs, from a drafter
    "draft_hidden": "the draft's hidden states",  # DraftBlock.hidden_states, from a drafter
    "metrics": "the step metrics",  # GenerationResult.metrics, from an observer
}
RUN_CAPABILITIES = frozenset({"greedy", "draft_model", "target_hidden"})  # supplied by the run


@functools.cache
def _entry_point_plugins() -> tuple[tuple[str, Any], ...]:
    """(name, module) of every plugin module in the entry-point group, loaded once per process."""
    found = []
    for ep in metadata.entry_points(group=hookspecs.PROJECT):
        found.append((ep.name, ep.load()))
    return tuple(found)


def new_plugin_manager(extra_plugins: Iterable[Any] = ()) -> pluggy.PluginManager:
    """A plugin manager with the hookspecs, the entry-point plugins and ``extra_plugins``."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, module in _entry_point_plugins():
        if not pm.is_registered(module) and pm.get_plugin(name) is None:
            pm.register(module, name=name)
    for plugin in extra_plugins:
        if not pm.is_registered(plugin) and _registered_copy(pm, plugin) is None:
            _refuse_taken_name(pm, plugin)
            pm.register(plugin)
    check_hooks(pm)
    return pm


def member_hooks(member: Any) -> pluggy.HookRelay:
    """The hooks of ``member``, a strategy object a composite component built (``hybrid``'s members),
    called through a plugin manager of its own exactly as the engine calls a component's: each
    implementation gets the arguments it declares, a hook it does not implement answers None
    (``pacer_propose``, ``pacer_verify``) or ``[]``, and a misspelled hook is refused when it is built."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(member)
    check_hooks(pm)
    return pm.hook


def _source(module: Any) -> Optional[Path]:
    """The resolved file a plugin module was loaded from; None for one without a file."""
    file = getattr(module, "__file__", None)
    try:
        return Path(file).resolve() if isinstance(file, str) else None
    except (OSError, RuntimeError, ValueError):
        return None


def _registered_copy(pm: pluggy.PluginManager, plugin: Any) -> Optional[Any]:
    """A registered module loaded from the same file as ``plugin`` (an installed plugin also named by
    ``--plugin FILE.py``): that file's hooks are registered once, as installed."""
    source = _source(plugin)
    return None if source is None else next((p for p in pm.get_plugins() if _source(p) == source), None)


def _refuse_taken_name(pm: pluggy.PluginManager, plugin: Any) -> None:
    """One line, instead of pluggy's ValueError and its dump of every plugin, when another plugin is
    registered under the name ``plugin`` would take."""
    name = pm.get_canonical_name(plugin)
    other = pm.get_plugin(name)
    if other is not None:
        raise ConfigError(
            f"plugin module '{name}' ({_source(plugin) or 'no file'}) has the name of an installed "
            f"plugin, a different module ({_source(other) or 'no file'}): rename one of them, or "
            "uninstall the installed one"
        )


def check_hooks(pm: pluggy.PluginManager) -> None:
    """Refuse ``pacer_*`` hook implementations that match no hook (misspelled names), in one line."""
    known = [name for name in dir(hookspecs) if name.startswith("pacer_") and callable(getattr(hookspecs, name))]
    for name, caller in list(vars(pm.hook).items()):
        if name.startswith("_") or caller.spec is not None:
            continue
        if any(not impl.optionalhook for impl in caller.get_hookimpls()):
            owners = ", ".join(sorted(pm.get_name(impl.plugin) or "?" for impl in caller.get_hookimpls()))
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"the hooks are: {', '.join(known)}"
            raise UnknownHookError(f"plugin {owners} implements unknown hook '{name}': {hint} (see docs/hooks.md)")


def components(pm: pluggy.PluginManager) -> dict[str, dict[str, Component]]:
    """kind → name → Component, from every registered plugin module's ``pacer_components``."""
    table: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}
    offered_all = [c for offered in offered_components(pm) for c in offered]
    supplied = RUN_CAPABILITIES | {cap for c in offered_all for cap in c.provides}
    for component in offered_all:
        if component.kind not in table:
            raise ConfigError(f"plugin offers component '{component.name}' of unknown kind '{component.kind}'")
        if component.name in table[component.kind]:
            raise ConfigError(f"two plugins offer a {component.kind} named '{component.name}': uninstall one of them")
        unknown = sorted(component.needs - supplied)
        if unknown:
            raise ConfigError(
                f"{component.kind} '{component.name}' needs {', '.join(map(repr, unknown))}, which no installed "
                f"component provides; known capabilities: {', '.join(sorted(supplied))}"
            )
        table[component.kind][component.name] = component
    return table


def offered_components(pm: pluggy.PluginManager) -> list[list[Component]]:
    """Each registered plugin's ``pacer_components()`` list, in pluggy's call order; a plugin whose
    hook raises or returns anything but a list of ``Component`` is refused in one line, named."""
    return [list(offered) for _, offered in module_answers(pm, "pacer_components")]


def module_answers(pm: pluggy.PluginManager, hook: str) -> list[tuple[str, Any]]:
    """(plugin name, answer) of each plugin module implementing ``hook`` (a hook taking no argument),
    in pluggy's call order, None answers left out; a plugin whose hook raises or answers what
    ``hookcheck`` refuses is refused in one line, named."""
    answers = []
    for impl in hookcheck.implementers(pm, hook):
        try:
            offered = impl.function()
        except Exception as exc:  # noqa: BLE001 - a plugin's bug, reported as one line naming it
            raise ConfigError(f"plugin {impl.plugin_name}: {hook} raised {hookcheck.describe(exc)}") from None
        if offered is None:
            continue
        problem = hookcheck.result_problem(hook, offered)
        if problem is not None:
            raise ConfigError(f"plugin {impl.plugin_name}: {hook} {problem}")
        answers.append((impl.plugin_name, offered))
    return answers


def shipped_by(pm: pluggy.PluginManager) -> dict[str, Path]:
    """Name → folder of the data the plugins registered with ``pm`` ship for other packages (their
    ``pacer_shipped``). A plugin whose hook raises or returns anything but a mapping of names to
    folders, or two plugins shipping one name, is refused in one line."""
    found: dict[str, Path] = {}
    for plugin, offered in module_answers(pm, "pacer_shipped"):
        for name, folder in offered.items():
            if name in found:
                raise ConfigError(f"two plugins ship data named '{name}' (one is {plugin}): uninstall one of them")
            found[name] = Path(folder)
    return found


@functools.cache
def shipped_folders() -> Mapping[str, Path]:
    """What the installed plugins ship (``shipped_by`` on the entry-point plugins), read once per
    process: how a package reaches a plugin's data without a path into the plugin's folder
    (docs/assets.md#shipped-data)."""
    return MappingProxyType(shipped_by(new_plugin_manager()))


def shipped_folder(name: str) -> Optional[Path]:
    """The folder an installed plugin ships under ``name`` (``shipped_folders``); None when no
    installed plugin ships it."""
    return shipped_folders().get(name)


def lookup(table: dict[str, dict[str, Component]], kind: str, name: Optional[str], where: str) -> Component:
    available = ", ".join(sorted(table[kind])) or "none installed"
    if not name:
        raise ConfigError(f"{where}: missing 'name'; available {kind}s: {available}")
    if name not in table[kind]:
        raise ConfigError(f"{where}: unknown {kind} '{name}'; available {kind}s: {available}")
    return table[kind][name]


def main_member(members: Sequence["ResolvedComponent"]) -> Optional["ResolvedComponent"]:
    """The member of a composite whose tokens form the main path: the first member that supplies
    draft probabilities (a model drafter), else the first member; None without members. Member order
    decides nothing else (``hybrid`` ranks every member's nodes by value)."""
    if not members:
        return None
    return next((m for m in members if "draft_probs" in m.provides), members[0])


@attrs.frozen
class ResolvedComponent:
    """A strategy entry matched to its plugin component, with its validated config object.

    A composite component (one whose config has a ``members`` field, like the ``hybrid`` drafter)
    also carries its members, resolved the same way: its factory builds them, and the stack needs
    what they need."""

    where: str  # e.g. "strategy.stop[0]"
    component: Component
    config: Any
    members: tuple["ResolvedComponent", ...] = ()

    def walk(self) -> Iterator["ResolvedComponent"]:
        """This entry and its members, depth first."""
        yield self
        for member in self.members:
            yield from member.walk()

    @property
    def main_member(self) -> Optional["ResolvedComponent"]:
        """A composite's member whose tokens form the main path (``main_member``); None for a plain
        component."""
        return main_member(self.members)

    @property
    def draft_folder(self) -> Any:
        """The folder of the draft weights it reads (``Component.draft_folder``), or a composite's main
        member's; None when it declares none."""
        main = self.main_member
        if self.component.draft_folder is not None:
            return self.component.draft_folder(self.config)
        return None if main is None else main.draft_folder

    @property
    def cost_kind(self) -> Optional[str]:
        """How cost profiles price its draft forwards: its component's ``cost_kind``, or a
        composite's main member's."""
        main = self.main_member
        return self.component.cost_kind or (main.cost_kind if main is not None else None)

    @property
    def provides(self) -> frozenset[str]:
        """What it supplies: its own capabilities, or a composite's main member's (its main path)."""
        main = self.main_member
        return self.component.provides | (main.provides if main is not None else frozenset())


@attrs.frozen
class ResolvedStack:
    """A checked strategy stack: one drafter, one verifier, the stop policies and the observers,
    each with its validated config. Iterating yields every entry in registration order."""

    drafter: ResolvedComponent
    verifier: ResolvedComponent
    stops: tuple[ResolvedComponent, ...] = ()
    observers: tuple[ResolvedComponent, ...] = ()

    def __iter__(self) -> Iterator[ResolvedComponent]:
        yield self.drafter
        yield self.verifier
        yield from self.stops
        yield from self.observers

    def needs(self, capability: str) -> bool:
        """Whether any component of the stack (members of composites included) needs ``capability``."""
        return any(capability in item.component.needs for top in self for item in top.walk())

    def provided(self) -> frozenset[str]:
        return frozenset(cap for item in self for cap in item.provides)

    def draft_model_entry(self) -> Optional[ResolvedComponent]:
        """The entry that needs a draft model: the drafter, or a composite drafter's first member that
        needs one; None when none does (only drafters need one)."""
        return next((item for item in self.drafter.walk() if "draft_model" in item.component.needs), None)

    def draft_model_user(self) -> Component:
        """The component whose shipped draft model a run loads when the config omits ``draft``:
        ``draft_model_entry``'s, else the drafter's."""
        entry = self.draft_model_entry()
        return self.drafter.component if entry is None else entry.component


def check_capabilities(
    stack: ResolvedStack, table: dict[str, dict[str, Component]], *, greedy: bool, draft_model: bool
) -> None:
    """Refuse a stack in which a component needs a capability nobody supplies (one line, with the fix)."""
    supplied = set(stack.provided()) | {"target_hidden"}
    if greedy:
        supplied.add("greedy")
    if draft_model:
        supplied.add("draft_model")
    for top in stack:
        for item in top.walk():
            for cap in sorted(item.component.needs - supplied):
                raise ConfigError(_missing_message(item, cap, stack, table))


def _missing_message(
    item: ResolvedComponent, cap: str, stack: ResolvedStack, table: dict[str, dict[str, Component]]
) -> str:
    c = item.component
    if cap == "greedy":
        return (
            f"{item.where}: '{c.name}' supports greedy decoding only; set sampling.temperature=0 "
            f"or choose a component that supports sampling"
        )
    if cap == "draft_model":
        free = (
            ", ".join(sorted(n for n, o in table[c.kind].items() if "draft_model" not in o.needs)) or "none installed"
        )
        return (
            f"{c.kind} '{c.name}' needs a draft model: set draft.path to an HF folder sharing the "
            f"target's tokenizer, or choose a {c.kind} without one ({free})"
        )
    what = CAPABILITIES.get(cap, repr(cap))
    offering = {kind: sorted(n for n, o in named.items() if cap in o.provides) for kind, named in table.items()}
    kind = next((k for k, names in offering.items() if names), "drafter")
    current = {"drafter": stack.drafter, "verifier": stack.verifier}.get(kind)
    who = f"{kind} '{current.component.name}'" if current else "this stack"
    return (
        f"{item.where}: {c.kind} '{c.name}' reads {what}, which {who} does not provide; "
        f"use a {kind} that does ({', '.join(offering[kind]) or 'none installed'})"
    )
