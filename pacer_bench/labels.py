"""Short names of ablation grid points, and the stack names a user types back.

A grid point is one value per grid key; its name joins one part per key with ``·``, e.g.
``eagle·margin(0.3)`` or ``gamma=4·max_ngram_size=3``. A part is the label the grid file declares
for that value (``labels:``), else one generated from the value:

- a strategy entry ``{name: margin, threshold: 0.3}`` → ``margin(0.3)`` (one option: its value;
  several: ``margin(threshold=0.3,max_tokens=8)``); a list of entries joins them with ``+``; a
  hybrid's ``members`` are entries too: ``hybrid(eagle+prompt_lookup)``;
- a scalar → ``key=value`` with the key's last part (the whole key where two keys share it).

Where the short form would give two points one name, the options are spelled ``key=value``; where
even that collides, the grid file must declare labels. The name is used everywhere a stack is
named: the answer log, the report, ``ablation.md``, the plots, Spec-Bench's file names (made ASCII
by ``specbench.file_names``: ``eagle_margin(0.3).jsonl``) and ``pacer report --compare``, which also
takes a name in that ASCII form (``resolve_name``).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Mapping, Optional, Sequence

from pacer_core.errors import ConfigError

SEP = "·"  # between the parts of one point's name
_FORBIDDEN = re.compile(r"[|`\n\r\t]")  # a name sits in markdown table cells and on one line


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def value_label(value: Any, spelled: bool = False) -> str:
    """The short text of one grid value (module docstring); ``spelled`` names every option."""
    if isinstance(value, Mapping):
        options = {k: v for k, v in value.items() if k != "name"}
        if "name" not in value:
            return ",".join(f"{k}={value_label(v, spelled)}" for k, v in options.items())
        if not options:
            return str(value["name"])
        if len(options) == 1 and not spelled:
            inner = value_label(next(iter(options.values())), spelled)
        else:
            inner = ",".join(f"{k}={value_label(v, spelled)}" for k, v in options.items())
        return f"{value['name']}({inner})"
    if isinstance(value, (list, tuple)):
        return "+".join(value_label(v, spelled) for v in value) if value else "none"
    return _scalar(value)


def _key_names(keys: Sequence[str]) -> list[str]:
    short = [k.split(".")[-1] for k in keys]
    return short if len(set(short)) == len(short) else list(keys)


def _part(key_name: str, value: Any, spelled: bool) -> str:
    text = value_label(value, spelled)
    return text if isinstance(value, (Mapping, list, tuple)) else f"{key_name}={text}"


def check_declared(grid: Mapping[str, list], declared: Mapping[str, Any], where: str) -> None:
    """Declared labels: for a grid key, one distinct one-line label per value, in the values' order."""
    for key, labels in declared.items():
        if key not in grid:
            raise ConfigError(f"{where}: labels.{key} names no grid key; grid keys: {', '.join(grid)}")
        values = grid[key]
        if not isinstance(labels, list) or len(labels) != len(values):
            raise ConfigError(
                f"{where}: labels.{key} must list one label per value of grid.{key} ({len(values)}), got {labels!r}"
            )
        for label in labels:
            if not isinstance(label, str) or not label.strip() or _FORBIDDEN.search(label) or SEP in label:
                raise ConfigError(
                    f"{where}: labels.{key}: {label!r} is not a label; use short one-line text "
                    f"without |, `, tabs or {SEP}"
                )
        if len(set(labels)) != len(labels):
            raise ConfigError(f"{where}: labels.{key} gives two values the same label: {labels}")


def grid_points(
    grid: Mapping[str, list], declared: Optional[Mapping[str, list]] = None, where: str = "ablate config"
) -> dict[str, dict[str, Any]]:
    """Every combination of grid values, by name (module docstring): name → {key: value}."""
    declared = {
        k: [_scalar(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in vs]
        if isinstance(vs, list)
        else vs
        for k, vs in (declared or {}).items()
    }  # `labels: [1, 2]` is text
    check_declared(grid, declared, where)
    keys = list(grid)
    names = _key_names(keys)
    combos = list(itertools.product(*(range(len(grid[k])) for k in keys)))
    clash = ""
    for spelled in (False, True):
        points: dict[str, dict[str, Any]] = {}
        clash = ""
        for combo in combos:
            parts = [
                declared[k][i] if k in declared else _part(n, grid[k][i], spelled)
                for k, n, i in zip(keys, names, combo)
            ]
            name = SEP.join(parts)
            clash = clash if clash or name not in points else name
            points[name] = {k: grid[k][i] for k, i in zip(keys, combo)}
        if len(points) == len(combos):
            return points
    raise ConfigError(
        f"{where}: two grid points would both be named '{clash}'; declare labels for them "
        "(labels: {KEY: [one per value]}, docs/benchmarks.md#ablations)"
    )


def check_name(name: str, where: str) -> None:
    """A stack name every table and file can carry."""
    if not name.strip() or _FORBIDDEN.search(name):
        raise ConfigError(f"{where}: stack name {name!r} must be non-empty text on one line without | or `")


def ascii_name(name: str) -> str:
    """A name with the characters unsafe in a file name (or awkward to type) replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9._+()=,-]", "_", name).lstrip(".") or "_"


def resolve_name(typed: str, names: Sequence[str]) -> Optional[str]:
    """The stack of ``names`` that ``typed`` means: the same name; else, with backticks and spaces
    around it dropped, the same name or the same ``ascii_name`` (``eagle_margin(0.3)`` for
    ``eagle·margin(0.3)``), when exactly one stack matches."""
    if typed in names:
        return typed
    text = typed.strip().strip("`").strip()
    if text in names:
        return text
    matches = [n for n in names if ascii_name(n) == ascii_name(text)]
    return matches[0] if len(matches) == 1 else None
