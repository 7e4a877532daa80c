"""A recorded bench run's speedups predicted under a device's cost profile (``pacer replay``).

A bench run records, for every generation, what each step did: the draft's depth
(``drafted_per_step``), the tokens the target verified (``nodes_per_step``), the accepted tokens
(``accepted_per_step``) and the draft forwards (``draft_forwards_per_step``), plus the prompt's length
and PACER's M_B consultations (``pacer_checks``). Greedy verification makes what a stack emits
independent of the device, so the same steps can be priced under any cost profile
(``pacer_core.cost_profiles.Profile``): a step costs

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
stack logged with the ``tree_log`` observer (``trees``). Pure: no models, no clocks.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from pacer_core.calibration import Calibration
from pacer_core.cost_profiles import Profile, load_profile
from pacer_core.errors import InputError

from ..answers import pair_key
from ..config import BASELINE
from .chains import analyse
from .recorded import RecordedRun, drafter_kind
from .steplog import Generation, is_tree_log
from .trees import markdown as tree_markdown
from .trees import replay_shapes

ALL = "all"


def generation_seconds(g: Generation, profile: Profile, kind: Optional[str]) -> float:
    """The seconds ``profile`` predicts for one recorded generation (see the module)."""
    prompt = g.prompt_tokens
    if not g.steps:  # a baseline without per-step records (transformers' generate): plain decoding
        tokens = len(g.record.get("tokens") or ())
        return profile.verify(prompt) + max(0, tokens - 1) * profile.plain_step() + profile.host_plain
    return sum(step_seconds(g, profile, kind)) + int(g.metrics.get("pacer_checks", 0) or 0) * profile.preverify_s


def step_seconds(g: Generation, profile: Profile, kind: Optional[str]) -> list[float]:
    """The seconds ``profile`` predicts for each recorded step of a generation (the first verifies
    the prompt; PACER's M_B consultations are the generation's, not a step's)."""
    prompt = g.prompt_tokens
    tree_verify = profile.tree_verify or profile.verify
    prices, prefilled = [], False
    for i, (step, n_forwards) in enumerate(zip(g.steps, g.draft_forwards)):
        pending = prompt if i == 0 else 1
        sent = step.sent
        if step.is_tree:
            seconds = tree_verify(pending + sent)
            seconds += profile.host_tree(sent) if profile.host_tree is not None else profile.host_chain
        else:
            seconds = profile.verify(pending + sent)
            seconds += profile.host_plain if kind is None and sent == 0 and not step.drafted else profile.host_chain
        if kind is not None and n_forwards:
            width = max(1, round(sent / n_forwards)) if step.is_tree else 1
            first = prompt if not prefilled else width  # the drafter reads the prompt once, on its first forward
            prefilled = True
            seconds += profile.draft_forward(kind, first) + (n_forwards - 1) * profile.draft_forward(kind, width)
        prices.append(seconds)
    return prices


def predict(run: RecordedRun, profile: Profile, calibration: Optional[Calibration] = None) -> dict[str, Any]:
    """Per prompt set (and ``all``) and stack: τ, the measured speedup and the predicted one; on
    logged trees, ``nodes: auto`` through ``calibration`` too when one is given."""
    baseline = run.of(BASELINE)
    if not baseline:
        raise InputError(f"the run has no '{BASELINE}' records to compare with: bench plain decoding too")
    if not any(g.has_steps for g in run.generations if g.stack != BASELINE):
        raise InputError(
            "the run's records hold no recorded steps (accepted_per_step): rerun the bench with this version"
        )
    reference = {pair_key(g.record): g for g in baseline}
    base_seconds = {k: generation_seconds(g, profile, None) for k, g in reference.items()}
    sets = list(run.meta.get("prompt_sets") or sorted({g.prompt_set for g in run.generations})) + [ALL]
    out: dict[str, Any] = {"profile": profile.name, "kind": profile.kind, "device": profile.device, "sets": {}}
    for set_name in sets:
        rows = {}
        for name, unit in run.units.items():
            mine = [
                g
                for g in run.of(name)
                if (set_name == ALL or g.prompt_set == set_name) and pair_key(g.record) in reference
            ]
            if not mine or unit.get("kind", "stack") != "stack" or not all(g.has_steps for g in mine):
                continue  # baselines other than plain decoding (transformers' generate) are not the engine's
            rows[name] = _stack_row(mine, reference, base_seconds, profile, drafter_kind(unit))
        out["sets"][set_name] = rows
    out["oracle"] = _oracle(run, profile)
    out["trees"] = {}
    for name, unit in run.units.items():  # stacks that logged their trees (the tree_log observer)
        logged = run.logged_trees(name)
        if logged:
            out["trees"][name] = replay_shapes(
                logged, profile, drafter_kind(unit) or "feature", calibration=calibration
            )
    return out


def _stack_row(
    mine: Sequence[Generation],
    reference: dict[tuple, Generation],
    base_seconds: dict[tuple, float],
    profile: Profile,
    kind: Optional[str],
) -> dict[str, Any]:
    """One stack's row over its generations ``mine``, paired with plain decoding's (``reference``)."""
    ref = [reference[pair_key(g.record)] for g in mine]
    tokens, ref_tokens = sum(len(g.record["tokens"]) for g in mine), sum(len(g.record["tokens"]) for g in ref)
    predicted = sum(generation_seconds(g, profile, kind) for g in mine)
    base = sum(base_seconds[pair_key(g.record)] for g in mine)
    wall, ref_wall = sum(g.metrics["wall_s"] for g in mine), sum(g.metrics["wall_s"] for g in ref)
    steps = sum(len(g.steps) for g in mine)
    row = {
        "records": len(mine),
        "tau": tokens / steps if steps else None,
        "measured_speedup": _speedup(tokens, wall, ref_tokens, ref_wall),
        "predicted_speedup": _speedup(tokens, predicted, ref_tokens, base),
        "tree": any(g.is_tree for g in mine),
    }
    m, p = row["measured_speedup"], row["predicted_speedup"]
    row["predicted_over_measured"] = p / m if m and p else None
    return row


def _speedup(tokens: int, seconds: float, ref_tokens: int, ref_seconds: float) -> Optional[float]:
    """Tokens per second over the reference's, or None when either rate is not a positive number
    (no tokens, no time): a table shows "—" rather than a division by zero or a silent 0."""
    if not (tokens > 0 and ref_tokens > 0 and 0 < seconds < math.inf and 0 < ref_seconds < math.inf):
        return None
    return (tokens / seconds) / (ref_tokens / ref_seconds)


def _oracle(run: RecordedRun, profile: Profile) -> Optional[dict]:
    """The oracle and best fixed chain on the bench's long-window log under ``profile`` (None
    without one; a tree log cannot be cut to chains)."""
    log_stack = (run.meta.get("oracle") or {}).get("log_stack")
    if not log_stack or log_stack not in run.units:
        return None
    log = [s for g in run.of(log_stack) for s in g.steps]
    if not log or is_tree_log(log):
        return None
    cost = profile.cost_model(drafter_kind(run.units[log_stack]))
    longest = max(s.drafted for s in log)
    result = analyse(log, cost, range(1, longest + 1))
    return {
        "log_stack": log_stack,
        "best_fixed_gamma": result["best_fixed_gamma"],
        "best_fixed_speedup": result["best_fixed_speedup"],
        "oracle_speedup": result["oracle_speedup"],
    }


def predicted_columns(run: RecordedRun, names: Sequence[str]) -> list[dict]:
    """The bench report's ``predict: [...]`` section: one prediction per named profile."""
    return [predict(run, load_profile(name)) for name in names]


def _fmt(value: Optional[float], unit: str = "×") -> str:
    return "—" if value is None else f"{value:.2f}{unit}"


def markdown(prediction: dict) -> str:
    """The prediction as a table, labelled with its profile."""
    label = f"*predicted under {prediction['kind']} profile '{prediction['profile']}' ({prediction['device']})*"
    lines = [
        label,
        "",
        "| prompt set | stack | τ | measured here | predicted | predicted ÷ measured |",
        "|---|---|---|---|---|---|",
    ]
    for set_name, rows in prediction["sets"].items():
        for name, row in rows.items():
            if name == BASELINE:
                continue
            lines.append(
                f"| {set_name} | {name}{' (tree)' if row['tree'] else ''} | {_fmt(row['tau'], '')} | "
                f"{_fmt(row['measured_speedup'])} | {_fmt(row['predicted_speedup'])} | "
                f"{_fmt(row['predicted_over_measured'], '')} |"
            )
    oracle = prediction.get("oracle")
    if oracle:
        lines += [
            "",
            f"On the long-window log of {oracle['log_stack']}: best fixed γ = {oracle['best_fixed_gamma']} "
            f"{_fmt(oracle['best_fixed_speedup'])}, oracle {_fmt(oracle['oracle_speedup'])} ({label}).",
        ]
    for name, result in prediction.get("trees", {}).items():
        lines += ["", f"Tree shapes on the trees {name} logged:", "", tree_markdown(result).rstrip()]
    return "\n".join(lines) + "\n"
