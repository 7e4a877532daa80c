"""How often a draft's tree nodes are accepted, per depth and cumulative draft probability: the values
``nodes: auto`` weighs against verification cost (``pacer_core.trees.NodeBudget``).

A tree drafter values a node by its cumulative draft probability, the product of ``q(token | parent)``
down its root path. A draft is rarely calibrated: deep nodes of a confident draft are accepted less
often than that product says. A **calibration** is read off logged trees (the ``tree_log``
observer, ``pacer replay RUN --save-calibration FILE``): per depth, the nodes sorted by cumulative
probability and cut in equal groups, each group's observed acceptance rate made non-decreasing in
the probability (pool-adjacent-violators). ``apply`` reads it: the rate of the first group whose
upper probability reaches the node's. Depths past the table's last share its last row.

The file (JSON, docs/trees.md#calibrated-values)::

    {"kind": "pacer-tree-calibration", "version": 1,
     "draft": "<the identity of the draft whose trees it was fitted on>",
     "source": "<the command that made it>",
     "depths": [{"upper": [...], "rate": [...], "nodes": [...]}, ...]}   # entry i: depth i + 1

Pure functions but ``load`` and ``save``; nothing here touches a model.
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import attrs

from .errors import InputError

KIND = "pacer-tree-calibration"
VERSION = 1
FILE = "calibration.json"  # a draft folder's own calibration, used when the config names none
RAW = "raw"  # ``tree.calibration: raw``: value nodes by the raw cumulative probability
FIT_HINT = "fit one with `pacer replay RUN --save-calibration FILE` on a run whose tree stack logs its trees (tree_log)"


@attrs.frozen
class Calibration:
    """Per depth (entry ``d - 1``; the last also serves deeper nodes): the upper cumulative draft
    probability of each group and its acceptance rate, both non-decreasing."""

    upper: tuple[tuple[float, ...], ...]
    rate: tuple[tuple[float, ...], ...]
    nodes: tuple[tuple[int, ...], ...] = ()  # the logged nodes in each group (for the reader)
    draft: Optional[str] = None  # the identity of the draft whose trees it was fitted on
    source: str = ""  # how it was made


def apply(calibration: Calibration, depth: int, cumulative: float) -> float:
    """The acceptance rate of a node at ``depth`` (1: the root's children) whose cumulative draft
    probability is ``cumulative``."""
    d = min(max(depth, 1), len(calibration.upper)) - 1
    upper = calibration.upper[d]
    return calibration.rate[d][min(bisect.bisect_left(upper, cumulative), len(upper) - 1)]


def fit(
    samples: Iterable[tuple[int, float, bool]],
    bins: int = 12,
    max_depth: int = 6,
    draft: Optional[str] = None,
    source: str = "",
) -> Calibration:
    """A calibration from ``(depth, cumulative draft probability, accepted)`` of logged nodes: per
    depth (``max_depth`` and deeper together) the nodes sorted by probability, cut in groups of
    ``len // bins`` (the remainder a last, smaller group), each group's acceptance rate made
    non-decreasing. A depth without nodes below the deepest one shares the deepest one's row.
    ``ValueError`` without samples."""
    from .cost_profiles import monotone

    by: dict[int, list[tuple[float, bool]]] = {}
    for depth, cumulative, accepted in samples:
        by.setdefault(min(max(int(depth), 1), max_depth), []).append((float(cumulative), bool(accepted)))
    if not by:
        raise ValueError("no logged tree nodes to fit a calibration on")
    rows: dict[int, tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]]] = {}
    for d, xs in by.items():
        xs.sort()
        size = max(1, len(xs) // bins)
        chunks = [xs[b : b + size] for b in range(0, len(xs), size)]
        rates = monotone([sum(y for _, y in chunk) / len(chunk) for chunk in chunks])
        rows[d] = (tuple(chunk[-1][0] for chunk in chunks), tuple(rates), tuple(len(chunk) for chunk in chunks))
    top = max(rows)
    table = [rows.get(d, rows[top]) for d in range(1, top + 1)]
    return Calibration(
        upper=tuple(r[0] for r in table),
        rate=tuple(r[1] for r in table),
        nodes=tuple(r[2] for r in table),
        draft=draft,
        source=source,
    )


def to_dict(calibration: Calibration) -> dict[str, Any]:
    depths = []
    for i, (upper, rate) in enumerate(zip(calibration.upper, calibration.rate)):
        entry: dict[str, Any] = {"upper": list(upper), "rate": list(rate)}
        if calibration.nodes:
            entry["nodes"] = list(calibration.nodes[i])
        depths.append(entry)
    return {
        "kind": KIND,
        "version": VERSION,
        "draft": calibration.draft,
        "source": calibration.source,
        "depths": depths,
    }


def _numbers(value: Any, where: str, name: str, low: float = 0.0, high: float = 1.0) -> tuple[float, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and low <= x <= high
            for x in value
        )
    ):
        raise InputError(
            f"tree calibration {where}: {name} must be a non-empty list of numbers in [{low:g}, {high:g}]: {FIT_HINT}"
        )
    return tuple(float(x) for x in value)


def from_dict(data: Any, where: str = "") -> Calibration:
    """A calibration from its file's contents, validated: ``InputError`` in one line naming the
    problem and the fix."""
    name = f"'{where}'" if where else "file"
    if not isinstance(data, dict) or data.get("kind") != KIND:
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise InputError(
            f"tree calibration {name} is not a tree calibration (kind {kind!r}, expected {KIND!r}): {FIT_HINT}"
        )
    if data.get("version") != VERSION:
        raise InputError(
            f"tree calibration {name} has version {data.get('version')!r}; this pacer-sd reads "
            f"version {VERSION}: {FIT_HINT}"
        )
    missing = [key for key in ("draft", "depths") if key not in data]
    if missing:
        raise InputError(f"tree calibration {name} lacks {', '.join(missing)}: {FIT_HINT}")
    draft, source = data["draft"], data.get("source", "")
    if not (draft is None or isinstance(draft, str)) or not isinstance(source, str):
        raise InputError(f"tree calibration {name}: draft and source must be strings: {FIT_HINT}")
    depths = data["depths"]
    if not isinstance(depths, list) or not depths or not all(isinstance(d, dict) for d in depths):
        raise InputError(f"tree calibration {name}: depths must be a non-empty list of {{upper, rate}}: {FIT_HINT}")
    upper, rate, nodes = [], [], []
    for i, entry in enumerate(depths, start=1):
        at = f"{name} depth {i}"
        if "upper" not in entry or "rate" not in entry:
            raise InputError(f"tree calibration {at} lacks {'upper' if 'upper' not in entry else 'rate'}: {FIT_HINT}")
        u, r = _numbers(entry["upper"], at, "upper"), _numbers(entry["rate"], at, "rate")
        if len(u) != len(r):
            raise InputError(f"tree calibration {at}: upper and rate differ in length ({len(u)}, {len(r)}): {FIT_HINT}")
        for values, label in ((u, "upper"), (r, "rate")):
            falls = next((j for j in range(1, len(values)) if values[j] < values[j - 1]), None)
            if falls is not None:
                raise InputError(
                    f"tree calibration {at}: {label} falls from {values[falls - 1]:g} to "
                    f"{values[falls]:g} (it must not decrease as the probability rises): {FIT_HINT}"
                )
        n = entry.get("nodes")
        if n is not None and (
            not isinstance(n, list)
            or len(n) != len(u)
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in n)
        ):
            raise InputError(f"tree calibration {at}: nodes must list a count per group: {FIT_HINT}")
        upper.append(u)
        rate.append(r)
        nodes.append(tuple(n) if n is not None else ())
    return Calibration(
        upper=tuple(upper), rate=tuple(rate), nodes=tuple(nodes) if all(nodes) else (), draft=draft, source=source
    )


def load(path: Union[str, Path]) -> Calibration:
    """The calibration file ``path``, validated (``InputError`` in one line)."""
    from .jsonfile import read_json

    return from_dict(read_json(Path(path).expanduser(), "tree calibration", FIT_HINT, expect=None), str(path))


def save(path: Union[str, Path], calibration: Calibration) -> Path:
    """Write ``calibration`` as JSON, published whole (``pacer_core.atomic``), readable by all."""
    from .atomic import atomic_write

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_dict(calibration), indent=1) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()), shared=True)


def check_draft(calibration: Calibration, draft: Optional[str], where: Union[str, Path]) -> None:
    """Refuse a calibration fitted on another draft's trees (or one whose drafter cannot name its draft)."""
    if calibration.draft is None or calibration.draft != draft:
        mine = (
            "a drafter that does not name its draft (only eagle and a hybrid led by eagle do)"
            if draft is None
            else f"draft {draft}"
        )
        raise InputError(
            f"tree calibration '{where}' was fitted on the trees of draft {calibration.draft}, but this "
            f"run uses {mine}: refit it for this draft (`pacer replay RUN --save-calibration FILE`), "
            f"remove it, or set tree.calibration: {RAW}"
        )
