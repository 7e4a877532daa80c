"""``pacer replay``: a recorded bench run replayed under a device's cost profile.

A bench run records, for every generation, what each step did: the draft's depth
(``drafted_per_step``), the tokens the target verified (``nodes_per_step``), the accepted tokens
(``accepted_per_step``) and the draft forwards (``draft_forwards_per_step``), plus the prompt's length
and PACER's M_B consultations (``pacer_checks``). Greedy verification makes what a stack emits
independent of the device, so the same steps can be priced under any cost profile
(``pacer_core.costs.Profile``): a step costs

    host(step kind, nodes) + Σ draft forwards (one over the prompt first) + verify(pending + sent)

with ``pending`` the prompt on the first step and 1 after it, ``sent`` the draft's nodes (a tree:
the tree-masked curve), and a generation adds its M_B consultations. Plain decoding is priced the
same way from the baseline's records (one one-token forward and ``host_s.plain`` per token, the
prompt's forward first). A stack's **predicted speedup** is its predicted tokens per second over
plain decoding's, paired over the same prompts as the bench's measured speedup.

Under a profile measured on the machine that ran the bench, the prediction can be set beside the
measured speedup (the validation in docs/costs.md); under any other profile it is a prediction,
and every table says which profile made it. The oracle (each step drafting exactly what was
accepted) and the best fixed chain γ are replayed the same way when the bench logged a long window
(``oracle.log_stack``), and so are chains, tree shapes, node budgets and ``nodes: auto`` on the trees a
stack logged with the ``tree_log`` observer (``replay_trees``). Pure: no models, no clocks.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from pacer_core.calibration import Calibration
from pacer_core.commands import command
from pacer_core.costs import DRAFTER_KINDS, Profile, load_profile
from pacer_core.errors import ConfigError, InputError

from .answers import pair_key
from .config import BASELINE
from .oracle import analyse, is_tree_log, steps_from_metrics
from .replay_trees import fit_calibration, logged_trees, replay_shapes
from .replay_trees import markdown as tree_markdown

ALL = "all"
RUN_PROFILE = "run"  # --profile run: the machine's profile measured by the run itself
def unit_drafter(unit: dict) -> dict:
    """A bench unit's drafter entry (``{}`` for a baseline or a unit without one)."""
    try:
        drafter = unit["config"]["strategy"]["drafter"]
    except (KeyError, TypeError):
        return {}
    return drafter if isinstance(drafter, dict) else {}


def drafter_kind(unit: dict) -> Optional[str]:
    """The profile's drafter kind a bench unit's drafter is priced as (``Component.cost_kind``:
    ``feature``, ``token``, ``block``; None without a draft forward: lookups, plain decoding), as the
    bench recorded it; a run recorded before the bench wrote it has its stack resolved again."""
    if "cost_kind" in unit:
        if unit["cost_kind"] is not None and unit["cost_kind"] not in DRAFTER_KINDS:
            raise InputError(f"unit '{unit.get('name')}' of the run has cost_kind {unit['cost_kind']!r}, not one of "
                             f"{', '.join(DRAFTER_KINDS)}: the run's bench.json is damaged, rerun the bench")
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


def has_steps(record: dict) -> bool:
    return "accepted_per_step" in record.get("metrics", {})


def generation_seconds(record: dict, profile: Profile, kind: Optional[str]) -> float:
    """The seconds ``profile`` predicts for one recorded generation (see the module)."""
    m = record["metrics"]
    prompt = max(1, int(record.get("prompt_tokens") or 1))
    steps = steps_from_metrics(m)
    if not steps:  # a baseline without per-step records (transformers' generate): plain decoding
        tokens = len(record.get("tokens") or ())
        return profile.verify(prompt) + max(0, tokens - 1) * profile.plain_step() + profile.host_plain
    forwards = m.get("draft_forwards_per_step")
    if forwards is None or len(forwards) != len(steps):  # older runs: the total spread over the drafted steps
        total, drafted = int(m.get("draft_forwards", 0) or 0), sum(s.drafted for s in steps)
        forwards = [round(total * s.drafted / drafted) if drafted else 0 for s in steps]
    tree_verify = profile.tree_verify or profile.verify
    seconds, prefilled = 0.0, False
    for i, (step, n_forwards) in enumerate(zip(steps, forwards)):
        pending = prompt if i == 0 else 1
        sent = step.drafted if step.nodes is None else step.nodes
        if step.is_tree:
            seconds += tree_verify(pending + sent)
            seconds += profile.host_tree(sent) if profile.host_tree is not None else profile.host_chain
        else:
            seconds += profile.verify(pending + sent)
            seconds += profile.host_plain if kind is None and sent == 0 and not step.drafted else profile.host_chain
        if kind is not None and n_forwards:
            width = max(1, round(sent / n_forwards)) if step.is_tree else 1
            first = prompt if not prefilled else width  # the drafter reads the prompt once, on its first forward
            prefilled = True
            seconds += profile.draft_forward(kind, first) + (n_forwards - 1) * profile.draft_forward(kind, width)
    return seconds + int(m.get("pacer_checks", 0) or 0) * profile.preverify_s


def predict(meta: dict, records: list[dict], profile: Profile, calibration: Optional[Calibration] = None
            ) -> dict[str, Any]:
    """Per prompt set (and ``all``) and stack: τ, the measured speedup and the predicted one; on
    logged trees, ``nodes: auto`` through ``calibration`` too when one is given."""
    units = {u["name"]: u for u in meta["units"]}
    baseline = [r for r in records if r["model_id"] == BASELINE]
    if not baseline:
        raise InputError(f"the run has no '{BASELINE}' records to compare with: bench plain decoding too")
    if not any(has_steps(r) for r in records if r["model_id"] != BASELINE):
        raise InputError("the run's records hold no recorded steps (accepted_per_step): rerun the bench with "
                         "this version")
    reference = {pair_key(r): r for r in baseline}
    base_seconds = {k: generation_seconds(r, profile, None) for k, r in reference.items()}
    sets = list(meta.get("prompt_sets") or sorted({r["prompt_set"] for r in records})) + [ALL]
    out: dict[str, Any] = {"profile": profile.name, "kind": profile.kind, "device": profile.device, "sets": {}}
    for set_name in sets:
        rows = {}
        chosen = [r for r in records if set_name == ALL or r["prompt_set"] == set_name]
        for name in units:
            mine = [r for r in chosen if r["model_id"] == name and pair_key(r) in reference]
            if not mine or units[name].get("kind", "stack") != "stack" or not all(map(has_steps, mine)):
                continue  # baselines other than plain decoding (transformers' generate) are not the engine's
            kind = drafter_kind(units[name])
            ref = [reference[pair_key(r)] for r in mine]
            tokens, ref_tokens = sum(len(r["tokens"]) for r in mine), sum(len(r["tokens"]) for r in ref)
            predicted = sum(generation_seconds(r, profile, kind) for r in mine)
            base = sum(base_seconds[pair_key(r)] for r in mine)
            wall, ref_wall = sum(r["metrics"]["wall_s"] for r in mine), sum(r["metrics"]["wall_s"] for r in ref)
            steps = sum(len(steps_from_metrics(r["metrics"])) for r in mine)
            rows[name] = {
                "records": len(mine),
                "tau": tokens / steps if steps else None,
                "measured_speedup": _speedup(tokens, wall, ref_tokens, ref_wall),
                "predicted_speedup": _speedup(tokens, predicted, ref_tokens, base),
                "tree": any(is_tree_log(steps_from_metrics(r["metrics"])) for r in mine),
            }
            m, p = rows[name]["measured_speedup"], rows[name]["predicted_speedup"]
            rows[name]["predicted_over_measured"] = p / m if m and p else None
        out["sets"][set_name] = rows
    out["oracle"] = _oracle(meta, records, profile)
    out["trees"] = {}
    for name, unit in units.items():  # stacks that logged their trees (the tree_log observer)
        logged = logged_trees(records, name)
        if logged:
            out["trees"][name] = replay_shapes(logged, profile, drafter_kind(unit) or "feature",
                                               calibration=calibration)
    return out


def _speedup(tokens: int, seconds: float, ref_tokens: int, ref_seconds: float) -> Optional[float]:
    """Tokens per second over the reference's, or None when either rate is not a positive number
    (no tokens, no time): a table shows "—" rather than a division by zero or a silent 0."""
    if not (tokens > 0 and ref_tokens > 0 and 0 < seconds < math.inf and 0 < ref_seconds < math.inf):
        return None
    return (tokens / seconds) / (ref_tokens / ref_seconds)


def _oracle(meta: dict, records: list[dict], profile: Profile) -> Optional[dict]:
    """The oracle and best fixed chain on the bench's long-window log under ``profile`` (None
    without one; a tree log cannot be cut to chains)."""
    log_stack = (meta.get("oracle") or {}).get("log_stack")
    units = {u["name"]: u for u in meta["units"]}
    if not log_stack or log_stack not in units:
        return None
    log = [s for r in records if r["model_id"] == log_stack for s in steps_from_metrics(r["metrics"])]
    if not log or is_tree_log(log):
        return None
    cost = profile.cost_model(drafter_kind(units[log_stack]))
    longest = max(s.drafted for s in log)
    result = analyse(log, cost, range(1, longest + 1))
    return {"log_stack": log_stack, "best_fixed_gamma": result["best_fixed_gamma"],
            "best_fixed_speedup": result["best_fixed_speedup"], "oracle_speedup": result["oracle_speedup"]}


def _fmt(value: Optional[float], unit: str = "×") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def markdown(prediction: dict) -> str:
    """The prediction as a table, labelled with its profile."""
    label = f"*predicted under {prediction['kind']} profile '{prediction['profile']}' ({prediction['device']})*"
    lines = [label, "", "| prompt set | stack | τ | measured here | predicted | predicted ÷ measured |",
             "|---|---|---|---|---|---|"]
    for set_name, rows in prediction["sets"].items():
        for name, row in rows.items():
            if name == BASELINE:
                continue
            lines.append(f"| {set_name} | {name}{' (tree)' if row['tree'] else ''} | {_fmt(row['tau'], '')} | "
                         f"{_fmt(row['measured_speedup'])} | {_fmt(row['predicted_speedup'])} | "
                         f"{_fmt(row['predicted_over_measured'], '')} |")
    oracle = prediction.get("oracle")
    if oracle:
        lines += ["", f"On the long-window log of {oracle['log_stack']}: best fixed γ = {oracle['best_fixed_gamma']} "
                      f"{_fmt(oracle['best_fixed_speedup'])}, oracle {_fmt(oracle['oracle_speedup'])} ({label})."]
    for name, result in prediction.get("trees", {}).items():
        lines += ["", f"Tree shapes on the trees {name} logged:", "", tree_markdown(result).rstrip()]
    return "\n".join(lines) + "\n"


@command("replay", "predict a recorded bench run's speedups under device cost profiles (docs/costs.md)")
def _setup_replay(p):
    p.add_argument("folder", metavar="RUN", help="a bench folder (pacer bench --out RUN)")
    p.add_argument("--profile", "-p", action="append", metavar="NAME|FILE",
                   help="a cost profile: a shipped name, a file, or 'run' (the run's own probe and forward "
                        "timings: this machine's measured profile) (repeatable; required unless only "
                        "--save-calibration is asked)")
    p.add_argument("--host", metavar="FILE", help="price host time per step from this file's host_s instead "
                                                  "(`pacer bench-host --json FILE`, or a profile): this engine's "
                                                  "own host time in place of the profile's")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.add_argument("--save-profile", metavar="FILE", help="also write the run's own measured profile (--profile run) "
                                                          "as a profile file")
    p.add_argument("--calibration", metavar="FILE", help="on logged trees, also price nodes: auto valuing nodes "
                                                         "through this tree calibration (as the engine would)")
    p.add_argument("--save-calibration", metavar="FILE", help="write a tree calibration fitted on every tree the "
                                                              "run logged (tree_log), for tree.calibration or a draft "
                                                              "folder's calibration.json (docs/trees.md)")

    def run(args) -> int:
        from pacer_core import calibration as calibrations

        from .answers import load_run

        if not args.profile and not args.save_calibration:
            raise InputError("give a cost profile (--profile NAME|FILE|run), or --save-calibration FILE alone")
        # every profile and calibration checked before the run is read; RUN: the run's own measured profile
        profiles = [None if p == RUN_PROFILE else load_profile(p) for p in args.profile or ()]
        given = calibrations.load(args.calibration) if args.calibration else None
        meta, records, cost_file = load_run(Path(args.folder))
        if given is not None:
            check_calibration(meta, records, given, args.calibration)
        if args.save_calibration:
            fitted = run_calibration(meta, records, f"pacer replay {args.folder} --save-calibration "
                                                    f"{args.save_calibration}")
            calibrations.save(args.save_calibration, fitted)
            if not profiles:
                return 0
        profiles = [profile_from_run(meta, records, cost_file) if p is None else p for p in profiles]
        if args.save_profile:
            from pacer_core.costs import write_profile

            measured = profile_from_run(meta, records, cost_file, name=Path(args.save_profile).stem)
            write_profile(args.save_profile, measured, header=f"measured by `pacer replay {args.folder} --profile run "
                                                              f"--save-profile {args.save_profile}`")
        if args.host:
            profiles = [with_host(p, args.host) for p in profiles]
        predictions = [predict(meta, records, profile, given) for profile in profiles]
        if args.json:
            json.dump(predictions, sys.stdout, indent=1)
            print()
        else:
            print("\n".join(markdown(p) for p in predictions))
        return 0

    return run


def run_calibration(meta: dict, records: list[dict], source: str) -> Calibration:
    """A tree calibration fitted on every tree the run's stacks logged (``tree_log``), naming the
    draft they grew them with (the draft folder the stacks' eagle drafter read, as it is now).
    ``InputError`` without logged trees, or when they come from several drafts or a drafter other
    than an eagle draft ``pacer distill`` wrote."""
    units = {u["name"]: u for u in meta["units"]}
    logged = {name: logged_trees(records, name) for name in units}
    logged = {name: steps for name, steps in logged.items() if steps}
    if not logged:
        raise InputError("the run holds no logged trees: bench a tree stack with the tree_log observer "
                         "(observers: [{name: metrics}, {name: tree_log}], as docs/results/replay/trees.yaml does)")
    identities = {unit_draft_identity(units[name]) for name in logged}
    if len(identities) > 1:
        raise InputError(f"the run's trees come from several drafts ({', '.join(sorted(identities))}): a calibration "
                         "fits one; bench one draft's tree stacks")
    return fit_calibration([s for steps in logged.values() for s in steps], draft=identities.pop(), source=source)


def check_calibration(meta: dict, records: list[dict], calibration: Calibration, where: str) -> None:
    """Refuse ``calibration`` (``--calibration``) unless it was fitted on the draft every stack that
    logged trees grew them with, as the engine refuses a ``tree.calibration`` fitted on another
    draft (``pacer_core.calibration.check_draft``): priced through another draft's acceptance rates,
    ``nodes: auto`` would predict what no run of this stack does. ``InputError`` in one line."""
    from pacer_core.calibration import check_draft

    units = {u["name"]: u for u in meta["units"]}
    for name in units:
        if not logged_trees(records, name):
            continue
        drafter = unit_drafter(units[name])
        main = drafter.get("name") == "eagle" or (drafter.get("name") == "hybrid" and any(
            isinstance(m, dict) and m.get("name") == "eagle" for m in drafter.get("members") or []))
        identity = unit_draft_identity(units[name]) if main else None
        try:
            check_draft(calibration, identity, where)
        except InputError:
            mine = f"draft {identity}" if identity else f"a {drafter.get('name') or 'non-model'} drafter, which " \
                                                      "names no draft"
            raise InputError(f"--calibration '{where}' was fitted on the trees of draft {calibration.draft}, but "
                             f"stack '{name}' logged its trees with {mine}: give a calibration fitted on this run's "
                             "draft (`pacer replay RUN --save-calibration FILE`), or leave --calibration out") from None


def unit_draft_identity(unit: dict) -> str:
    """The identity of the eagle draft a bench unit's drafter (or a hybrid's main member) reads."""
    drafter = unit_drafter(unit)
    if drafter.get("name") == "hybrid":
        models = [m for m in drafter.get("members") or [] if isinstance(m, dict) and m.get("name") in DRAFTER_KINDS]
        drafter = models[0] if models else {}
    if drafter.get("name") != "eagle":
        raise InputError(f"stack '{unit.get('name')}' logged trees with a "
                         f"{drafter.get('name') or 'non-model'} drafter: "
                         "a tree calibration names an eagle draft; log an eagle tree stack")
    from pacer_plugins.feature_draft.drafter import draft_folder, draft_identity
    from pacer_plugins.feature_draft.model import MANIFEST

    folder = draft_folder(drafter.get("path"))
    if not (folder / MANIFEST).exists():
        raise InputError(f"stack '{unit.get('name')}' read the published checkpoint '{folder}': a tree calibration "
                         "names a draft `pacer distill` wrote; log such a draft's trees")
    return draft_identity(folder)


def _is_fixed_chain(unit: dict) -> bool:
    stops = ((unit.get("config") or {}).get("strategy") or {}).get("stop") or []
    return (unit_drafter(unit).get("tree") is None and len(stops) == 1 and isinstance(stops[0], dict)
            and stops[0].get("name") == "fixed")


def profile_from_run(meta: dict, records: list[dict], cost_file: Optional[dict], name: str = "run") -> Profile:
    """The measured profile of the machine a bench ran on, from the run itself: the verification
    curves of its cost probe (``verify_cost: true``; beyond the chain's largest k the tree-masked
    curve, a dense forward's cost hardly depending on the mask there), scaled so that a one-token
    forward costs what plain decoding's forwards cost in the run, one draft forward per drafter
    kind from its fixed-chain stacks (their forward seconds less the probe's target forwards, per
    draft forward), M_B's seconds per consultation, and the host time per step outside the forwards
    (``forward_s``: plain decoding's, the fixed chains', a tree's by nodes sent). ``InputError``
    without a probe or forward timings."""
    from pacer_core.costs import Curve, monotone

    if not cost_file or not cost_file.get("verify_s"):
        raise InputError("the run has no verification-cost probe (cost_model.json): bench it with verify_cost: true")
    timed = [r for r in records if r["metrics"].get("forward_s") is not None and has_steps(r)]
    if not timed:
        raise InputError("the run's records hold no forward timings (forward_s): rerun the bench with this version")
    chain = list(monotone(cost_file["verify_s"]))
    tree_k, tree_s = list(cost_file.get("tree_k") or ()), list(monotone(cost_file.get("tree_verify_s") or ()))
    points = {k: t for k, t in zip(range(1, len(chain) + 1), chain)}
    top = len(chain)
    for k, t in zip(tree_k, tree_s):
        if k > top:
            points[k] = max(t, points[max(points)])
    verify = Curve.of(points)
    tree = Curve.of(dict(zip(tree_k, tree_s))) if tree_k else None
    units = {u["name"]: u for u in meta["units"]}
    # the probe's level rests on a few forwards at one context; plain decoding's own forwards (one a
    # token, at every context the run reached) set it: the curves are scaled so that verify(1) is
    # their mean, the probe keeping the shape (the prompts' forwards priced on the probe's curve)
    plain = [r for r in timed if r["model_id"] == BASELINE]
    tokens = sum(len(steps_from_metrics(r["metrics"])) - 1 for r in plain)
    if tokens > 0:
        prefill = sum(verify(max(1, int(r.get("prompt_tokens") or 1))) for r in plain)
        scale = (sum(r["metrics"]["forward_s"] for r in plain) - prefill) / (tokens * verify(1))
        if scale > 0:
            verify = Curve(verify.ks, [t * scale for t in verify.seconds])
            tree = None if tree is None else Curve(tree.ks, [t * scale for t in tree.seconds])

    def target_seconds(r: dict) -> float:
        prompt = max(1, int(r.get("prompt_tokens") or 1))
        out = 0.0
        for i, step in enumerate(steps_from_metrics(r["metrics"])):
            sent = step.drafted if step.nodes is None else step.nodes
            curve = (tree or verify) if step.is_tree else verify
            out += curve((prompt if i == 0 else 1) + sent)
        return out

    draft: dict[str, Curve] = {}
    host: dict[str, float] = {}
    for kind in DRAFTER_KINDS:  # a block drafter's chains give its one forward a block
        mine = [r for r in timed if units.get(r["model_id"]) and _is_fixed_chain(units[r["model_id"]])
                and drafter_kind(units[r["model_id"]]) == kind]
        forwards = sum(int(r["metrics"].get("draft_forwards", 0)) for r in mine)
        if forwards:
            seconds = sum(r["metrics"]["forward_s"] - target_seconds(r) for r in mine)
            draft[kind] = Curve([1], [max(seconds / forwards, 1e-6)])
    for label, chosen in (("plain", [r for r in timed if r["model_id"] == BASELINE]),
                          ("chain",
                           [r for r in timed if units.get(r["model_id"]) and _is_fixed_chain(units[r["model_id"]])])):
        steps = sum(len(steps_from_metrics(r["metrics"])) for r in chosen)
        if steps:
            host[label] = max(sum(r["metrics"]["wall_s"] - r["metrics"]["forward_s"] for r in chosen) / steps, 1e-6)
    if "plain" not in host:
        raise InputError(f"the run has no timed '{BASELINE}' records: bench plain decoding too")
    host.setdefault("chain", host["plain"])
    by_nodes: dict[int, list[float]] = {}
    for r in timed:  # tree stacks: host per step against their mean nodes sent
        steps = steps_from_metrics(r["metrics"])
        if is_tree_log(steps):
            nodes = round(sum(s.nodes or 0 for s in steps) / len(steps))
            host_s = (r["metrics"]["wall_s"] - r["metrics"]["forward_s"]) / len(steps)
            by_nodes.setdefault(max(1, nodes), []).append(host_s)
    tree_host = Curve.of({n: sum(v) / len(v) for n, v in by_nodes.items()}) if by_nodes else None
    if tree_host is not None:  # host time never falls with more nodes: smooth the noise
        tree_host = Curve(tree_host.ks, [max(t, 1e-6) for t in monotone(tree_host.seconds)])
    checks = sum(int(r["metrics"].get("pacer_checks", 0) or 0) for r in timed)
    mb = sum(float(r["metrics"].get("pacer_mb_s", 0.0) or 0.0) for r in timed)
    device = f"the machine that ran this bench ({meta.get('device', '?')})"
    sources = {"verify_s": "the bench's verification-cost probe (cost_model.json)",
               "draft_s": "the run's fixed-chain stacks: forward seconds less the probe's target forwards",
               "host_s": "the run's wall less forward seconds per step (forward_s)"}
    return _checked(Profile(name=name, kind="measured", device=device, verify=verify, tree_verify=tree, draft=draft,
                            host_plain=host["plain"], host_chain=host["chain"], host_tree=tree_host,
                            preverify_s=mb / checks if checks else 0.0, dtype=meta.get("dtype"),
                            context=cost_file.get("context_tokens"), sources=sources))


def _checked(profile: Profile) -> Profile:
    """``profile`` (made from a run's records) validated as a profile file is, so that its times are
    in the range every replay can price (``pacer_core.costs``); ``InputError`` in one line."""
    from pacer_core.costs import profile_from_dict, profile_to_dict

    profile_from_dict(profile_to_dict(profile), f"measured from the run ({profile.name})")
    return profile


def with_host(profile: Profile, path: str) -> Profile:
    """``profile`` with the host time per step of ``path`` (a ``pacer bench-host --json`` file or a
    cost profile: its ``host_s``), named so that every table says so."""
    import attrs

    from pacer_core.costs import profile_from_dict, profile_to_dict
    from pacer_core.schema import load_yaml_file

    file = Path(path).expanduser()
    data = load_yaml_file(file, "--host", "give a `pacer bench-host --json` file or a cost profile",
                          InputError)  # JSON is YAML
    host = data.get("host_s") if isinstance(data, dict) else None
    if not isinstance(host, dict):
        raise InputError(f"--host '{path}' has no host_s: give a `pacer bench-host --json` file or a cost profile")
    tree = host.get("tree")
    if isinstance(tree, dict):  # JSON keys are strings
        host = {**host, "tree": {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in tree.items()}}
    merged = profile_to_dict(profile)
    merged["host_s"] = host
    merged["sources"] = {**merged["sources"], "host_s": f"this engine's host time per step from {path}"}
    replaced = profile_from_dict(merged, f"{profile.name} with --host {path}")
    return attrs.evolve(replaced, name=f"{profile.name} + host time of {file.name}")


def predicted_columns(meta: dict, records: list[dict], names: Sequence[str]) -> list[dict]:
    """The bench report's ``predict: [...]`` section: one prediction per named profile."""
    return [predict(meta, records, load_profile(name)) for name in names]
