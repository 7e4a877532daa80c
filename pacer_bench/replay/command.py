"""``pacer replay RUN --profile P``: a recorded bench run's speedups predicted under device cost
profiles (``predictions``), the run's own measured profile (``--profile run``, ``--save-profile``)
and tree calibrations (``--save-calibration``, ``--calibration``). The run is read and parsed once
(``RecordedRun``) and every profile prices the same parsed steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import attrs

from pacer_core.commands import command
from pacer_core.cost_profiles import Profile, load_profile
from pacer_core.errors import InputError

from .calibration import check_calibration, run_calibration
from .gate import gate_config, gate_markdown, replay_gate
from .predictions import markdown, predict
from .profiles import profile_from_run, with_host
from .recorded import RecordedRun

RUN_PROFILE = "run"  # --profile run: the machine's profile measured by the run itself


@command("replay", "predict a recorded bench run's speedups under device cost profiles (docs/costs.md)")
def _setup_replay(p):
    p.add_argument("folder", metavar="RUN", help="a bench folder (pacer bench --out RUN)")
    p.add_argument(
        "--profile",
        "-p",
        action="append",
        metavar="NAME|FILE",
        help="a cost profile: a shipped name, a file, or 'run' (the run's own probe and forward "
        "timings: this machine's measured profile) (repeatable; required unless only "
        "--save-calibration is asked)",
    )
    p.add_argument(
        "--host",
        metavar="FILE",
        help="price host time per step from this file's host_s instead "
        "(`pacer bench-host --json FILE`, or a profile): this engine's "
        "own host time in place of the profile's",
    )
    p.add_argument(
        "--gate",
        nargs="*",
        metavar="KEY=VALUE",
        help="also replay the draft gate (generation.skip_drafting) over each stack of a run made "
        "with it off: its speedup with and without, and the slowest prompt's; options as "
        "skip_drafting's (e.g. --gate window=16 confidence=1) (docs/costs.md#skipping-drafting)",
    )
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.add_argument(
        "--save-profile",
        metavar="FILE",
        help="also write the run's own measured profile (--profile run) as a profile file",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="on logged trees, also price nodes: auto valuing nodes "
        "through this tree calibration (as the engine would)",
    )
    p.add_argument(
        "--save-calibration",
        metavar="FILE",
        help="write a tree calibration fitted on every tree the "
        "run logged (tree_log), for tree.calibration or a draft "
        "folder's calibration.json (docs/trees.md)",
    )

    def run(args) -> int:
        from pacer_core import calibration as calibrations

        if not args.profile and not args.save_calibration:
            raise InputError("give a cost profile (--profile NAME|FILE|run), or --save-calibration FILE alone")
        # every profile and calibration checked before the run is read; None: the run's own measured profile
        named = [None if p == RUN_PROFILE else load_profile(p) for p in args.profile or ()]
        given = calibrations.load(args.calibration) if args.calibration else None
        recorded = RecordedRun.load(Path(args.folder))
        if given is not None:
            check_calibration(recorded, given, args.calibration)
        if args.save_calibration:
            fitted = run_calibration(recorded, f"pacer replay {args.folder} --save-calibration {args.save_calibration}")
            calibrations.save(args.save_calibration, fitted)
            if not named:
                return 0
        gate = None if args.gate is None else gate_config(args.gate)
        profiles = _profiles(args, recorded, named)
        predictions = [predict(recorded, profile, given) for profile in profiles]
        gated = [] if gate is None else [replay_gate(recorded, profile, gate) for profile in profiles]
        if args.json:
            json.dump(predictions + gated, sys.stdout, indent=1)
            print()
        else:
            print("\n".join([markdown(p) for p in predictions] + [gate_markdown(g) for g in gated]))
        return 0

    return run


def _profiles(args, recorded: RecordedRun, named: list[Optional[Profile]]) -> list[Profile]:
    """The profiles to price under: ``named``, the run's own measured profile (measured once) in
    place of each None, written to ``--save-profile`` under the file's name, and each given the
    ``--host`` file's host time."""
    measured = None
    if args.save_profile or any(p is None for p in named):
        measured = profile_from_run(
            recorded, RUN_PROFILE if any(p is None for p in named) else Path(args.save_profile).stem
        )
    profiles = [measured if p is None else p for p in named]
    if args.save_profile:
        from pacer_core.cost_profiles import write_profile

        write_profile(
            args.save_profile,
            attrs.evolve(measured, name=Path(args.save_profile).stem),
            header=f"measured by `pacer replay {args.folder} --profile run --save-profile {args.save_profile}`",
        )
    if args.host:
        profiles = [with_host(p, args.host) for p in profiles]
    return profiles
