"""The recipe guard of a run folder.

A run folder keeps ``recipe.json``: the full recipe (config) of the run that made it. When a command
is run again on the same folder, the options that decide what the folder already holds (a trainer's
``data_keys``: its corpus, target, drafter, ... sections) are compared with the stored recipe;
training options (learning rate, epochs, model shape, ...) may change between runs. The rule, for
every option of the current config schema under those keys:

1. recorded in the stored recipe: the value now must equal the recorded one;
2. not recorded (an option added to the schema since the folder was made): the old run behaved as
   the option's default, so the value now must equal the default;
3. recorded, but no longer in the schema (an option since removed): ignored.

Sections are compared option by option (recursively, so rule 2 applies to a nested option added
later); free-form values (the ``drafter`` dict, lists) are compared whole. Any difference refuses the
run in one line naming the first differing option, its stored and current values, and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Optional

import attrs

from pacer_core.errors import InputError

from .files import atomic_write_json, read_json

RECIPE = "recipe.json"
ABSENT = "<not recorded>"


def _plain(value: Any) -> Any:
    """A config value as JSON stores it (attrs instances as dicts, tuples as lists)."""
    if attrs.has(type(value)):
        value = attrs.asdict(value)
    return json.loads(json.dumps(value, default=str))


def _default(field: attrs.Attribute) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return None if default is attrs.NOTHING else default


def recipe_difference(
    before: dict[str, Any], now: Any, keys: Optional[Iterable[str]] = None, prefix: str = ""
) -> Optional[tuple[str, Any, Any, bool]]:
    """The first option of ``now`` (an attrs config) that the rule above refuses, limited to the
    top-level ``keys`` (all when None): (dotted name, the value it must have, its current value,
    whether that value was recorded or is the option's default); None when ``now`` agrees."""
    wanted = None if keys is None else set(keys)
    for field in attrs.fields(type(now)):
        if wanted is not None and field.name not in wanted:
            continue
        name, value = prefix + field.name, getattr(now, field.name)
        recorded = before.get(field.name, ABSENT) if isinstance(before, dict) else ABSENT
        nested = isinstance(recorded, dict) if recorded is not ABSENT else attrs.has(type(_default(field)))
        if attrs.has(type(value)) and nested:
            found = recipe_difference({} if recorded is ABSENT else recorded, value, None, name + ".")
            if found:
                return found
            continue
        reference = _plain(_default(field)) if recorded is ABSENT else recorded
        if _plain(value) != reference:
            return name, reference, _plain(value), recorded is not ABSENT
    return None


def guard_recipe(folder: Path, cfg: Any, data_keys: Iterable[str], free: str) -> dict[str, Any]:
    """Refuse ``cfg`` for ``folder`` if the folder's stored recipe disagrees under ``data_keys`` (the
    rule above); then store ``cfg`` as the folder's recipe. ``free`` names, for the message, what may
    change between runs. Returns the recipe as stored."""
    recipe = _plain(cfg)
    path = Path(folder) / RECIPE
    if path.exists():
        before = read_json(path, "run recipe")
        found = recipe_difference(before if isinstance(before, dict) else {}, cfg, data_keys)
        if found:
            name, old, new, recorded = found
            shown = json.dumps(old) + (
                ""
                if recorded
                else " (not recorded: the option is newer than the run, which therefore used its default)"
            )
            raise InputError(
                f"'{folder}' holds a run made with {name}={shown}, and this run has {name}="
                f"{json.dumps(new)}: choose a new out= folder, or rerun with the folder's "
                f"value ({free} may change between runs on one folder)"
            )
    atomic_write_json(path, recipe)
    return recipe
