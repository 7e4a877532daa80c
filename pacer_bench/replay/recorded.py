"""A recorded bench run as every replay reads it: bench.json's units, each record's step log parsed
once (``RecordedRun.parse``), and the verification-cost probe (cost_model.json) where measured.

Also what a replay reads off a unit of bench.json: its drafter entry (``unit_drafter``) and the entry
of its main path (``unit_main_drafter``: a hybrid's main member), the drafter kind a cost profile
prices its forwards as (``drafter_kind``), and whether it is a fixed chain.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

import attrs

from pacer_core.cost_profiles import DRAFTER_KINDS
from pacer_core.errors import ConfigError, InputError

from .steplog import Generation, LoggedTree


@attrs.frozen
class RecordedRun:
    """A bench run with its records' step logs parsed: replays take this, never the raw records."""

    meta: dict  # bench.json
    generations: tuple[Generation, ...]  # the records in the answer log's order
    cost_file: Optional[dict] = None  # cost_model.json (None: the bench probed no verification cost)
    units: dict[str, dict] = attrs.field(factory=dict)  # bench.json's units by name
    by_stack: dict[str, list[Generation]] = attrs.field(factory=dict)  # the generations of each model_id

    @classmethod
    def parse(cls, meta: dict, records: list[dict], cost_file: Optional[dict] = None) -> "RecordedRun":
        generations = tuple(Generation.parse(r) for r in records)
        by_stack: dict[str, list[Generation]] = {}
        for g in generations:
            by_stack.setdefault(g.stack, []).append(g)
        return cls(meta, generations, cost_file, {u["name"]: u for u in meta["units"]}, by_stack)

    @classmethod
    def load(cls, folder: Path) -> "RecordedRun":
        """A bench folder (``pacer bench --out``) read and checked (``answers.load_run``), then parsed."""
        from ..answers import load_run

        return cls.parse(*load_run(Path(folder)))

    def of(self, stack: str) -> list[Generation]:
        """The generations of one stack or baseline (``model_id``), in the log's order."""
        return self.by_stack.get(stack, [])

    def logged_trees(self, stack: str) -> list[LoggedTree]:
        """The tree steps ``tree_log`` recorded for ``stack``."""
        return [t for g in self.of(stack) for t in g.trees]


def unit_drafter(unit: dict) -> dict:
    """A bench unit's drafter entry (``{}`` for a baseline or a unit without one)."""
    try:
        drafter = unit["config"]["strategy"]["drafter"]
    except (KeyError, TypeError):
        return {}
    return drafter if isinstance(drafter, dict) else {}


def unit_main_drafter(unit: dict) -> dict:
    """The drafter entry whose tokens form a bench unit's main path: its drafter entry, or a composite's
    (``hybrid``'s) main member, as the engine picks it (``pacer_core.registry.main_member``)."""
    drafter = unit_drafter(unit)
    members = drafter.get("members")
    if not isinstance(members, list) or not members:
        return drafter
    main = _main_member_index(json.dumps(drafter, sort_keys=True))
    return members[main] if isinstance(members[main], dict) else {}


@functools.lru_cache(maxsize=None)
def _main_member_index(drafter: str) -> int:
    from pacer_core.config import load_plan

    try:
        resolved = load_plan(None, [f"strategy.drafter={drafter}"], require_models=False).stack.drafter
    except ConfigError as exc:
        raise InputError(f"a stack of the run no longer resolves ({exc}): rerun the bench with this version") from None
    main = resolved.main_member
    return 0 if main is None else resolved.members.index(main)


def drafter_kind(unit: dict) -> Optional[str]:
    """The profile's drafter kind a bench unit's drafter is priced as (``Component.cost_kind``:
    ``feature``, ``token``, ``block``; None without a draft forward: lookups, plain decoding), as the
    bench recorded it; a run recorded before the bench wrote it has its stack resolved again."""
    if "cost_kind" in unit:
        if unit["cost_kind"] is not None and unit["cost_kind"] not in DRAFTER_KINDS:
            raise InputError(
                f"unit '{unit.get('name')}' of the run has cost_kind {unit['cost_kind']!r}, not one of "
                f"{', '.join(DRAFTER_KINDS)}: the run's bench.json is damaged, rerun the bench"
            )
        return unit["cost_kind"]
    strategy = (unit.get("config") or {}).get("strategy")
    if not unit_drafter(unit) or not isinstance(strategy, dict):
        return None
    return _resolved_cost_kind(json.dumps(strategy, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _resolved_cost_kind(strategy: str) -> Optional[str]:
    from pacer_core.config import load_plan

    try:
        return load_plan(None, [f"strategy={strategy}"], require_models=False).stack.drafter.cost_kind
    except ConfigError as exc:
        raise InputError(f"a stack of the run no longer resolves ({exc}): rerun the bench with this version") from None


def is_fixed_chain(unit: dict) -> bool:
    """A stack drafting a chain with the fixed stop alone (what the run's own profile fits draft costs on)."""
    stops = ((unit.get("config") or {}).get("strategy") or {}).get("stop") or []
    return (
        unit_drafter(unit).get("tree") is None
        and len(stops) == 1
        and isinstance(stops[0], dict)
        and stops[0].get("name") == "fixed"
    )
