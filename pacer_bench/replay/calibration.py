"""Tree calibrations and a recorded run (``pacer replay --save-calibration`` and ``--calibration``):
one fitted on every tree the run's stacks logged (``tree_log``), naming the draft that grew them,
and a given one refused unless it was fitted on that draft."""

from __future__ import annotations

import json

from pacer_core.calibration import Calibration
from pacer_core.errors import InputError

from .recorded import RecordedRun, unit_drafter, unit_main_drafter
from .trees import fit_calibration


def run_calibration(run: RecordedRun, source: str) -> Calibration:
    """A tree calibration fitted on every tree the run's stacks logged (``tree_log``), naming the
    draft they grew them with (the identity of the draft the stacks' eagle drafter read, as the run
    recorded it: ``unit_draft_identity``). ``InputError`` without logged trees, or when they come
    from several drafts or a drafter other than eagle."""
    logged = {name: run.logged_trees(name) for name in run.units}
    logged = {name: steps for name, steps in logged.items() if steps}
    if not logged:
        raise InputError(
            "the run holds no logged trees: bench a tree stack with the tree_log observer "
            "(observers: [{name: metrics}, {name: tree_log}], as docs/results/replay/trees.yaml does)"
        )
    identities = {unit_draft_identity(run.units[name]) for name in logged}
    if len(identities) > 1:
        raise InputError(
            f"the run's trees come from several drafts ({', '.join(sorted(identities))}): a calibration "
            "fits one; bench one draft's tree stacks"
        )
    return fit_calibration([s for steps in logged.values() for s in steps], draft=identities.pop(), source=source)


def check_calibration(run: RecordedRun, calibration: Calibration, where: str) -> None:
    """Refuse ``calibration`` (``--calibration``) unless it was fitted on the draft every stack that
    logged trees grew them with, as the engine refuses a ``tree.calibration`` fitted on another
    draft (``pacer_core.calibration.check_draft``): priced through another draft's acceptance rates,
    ``nodes: auto`` would predict what no run of this stack does. ``InputError`` in one line."""
    from pacer_core.calibration import check_draft

    for name, unit in run.units.items():
        if not run.logged_trees(name):
            continue
        drafter = unit_drafter(unit)
        identity = unit_draft_identity(unit) if unit_main_drafter(unit).get("name") == "eagle" else None
        try:
            check_draft(calibration, identity, where)
        except InputError:
            mine = (
                f"draft {identity}"
                if identity
                else f"a {drafter.get('name') or 'non-model'} drafter, which names no draft"
            )
            raise InputError(
                f"--calibration '{where}' was fitted on the trees of draft {calibration.draft}, but "
                f"stack '{name}' logged its trees with {mine}: give a calibration fitted on this run's "
                "draft (`pacer replay RUN --save-calibration FILE`), or leave --calibration out"
            ) from None


def unit_draft_identity(unit: dict) -> str:
    """The identity of the eagle draft a bench unit's drafter (or a hybrid's main member) read, as the
    bench recorded it (the unit's ``draft`` entry, ``Engine.draft_source``): the draft's folder may
    have changed since. A run recorded before the bench wrote it has it derived again
    (``identity_of_unrecorded_draft``)."""
    drafter = unit_main_drafter(unit)
    if drafter.get("name") != "eagle":
        raise InputError(
            f"stack '{unit.get('name')}' logged trees with a "
            f"{drafter.get('name') or 'non-model'} drafter: "
            "a tree calibration names an eagle draft; log an eagle tree stack"
        )
    if "draft" not in unit:
        return identity_of_unrecorded_draft(unit, drafter)
    draft = unit["draft"]
    identity = draft.get("identity") if isinstance(draft, dict) else None
    if not isinstance(identity, str) or not identity:
        raise InputError(
            f"unit '{unit.get('name')}' of the run records no identity of the draft it read "
            f"({json.dumps(draft)[:80]}): the run's bench.json is damaged, rerun the bench"
        )
    return identity


def identity_of_unrecorded_draft(unit: dict, drafter: dict) -> str:
    """For runs recorded before bench.json recorded each unit's draft (``draft``; the committed runs
    of docs/results among them) only: the identity of the eagle draft folder ``drafter``'s path
    names, read from the folder as it is now, which may have changed since the run (a published
    checkpoint is refused: only loading it on its target names it). A newer run's identity is the
    one the engine read (``unit_draft_identity``)."""
    from pacer_core.draft_folders import MANIFEST
    from pacer_plugins.eagle.drafter import draft_folder, draft_identity

    folder = draft_folder(drafter.get("path"))
    if not (folder / MANIFEST).exists():
        raise InputError(
            f"stack '{unit.get('name')}' read the published checkpoint '{folder}': a tree calibration "
            "names a draft `pacer distill` wrote; log such a draft's trees"
        )
    return draft_identity(folder)
