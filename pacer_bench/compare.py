"""``pacer report DIR --compare A B``: do two stacks of one bench differ beyond the noise?

Per prompt set and over all: A's tokens/s over B's on the (prompt, repeat, turn) keys both ran (a
ratio of totals; both share the baseline, so it is also the ratio of their speedups), with the 95%
interval of a paired bootstrap over prompts and repeats (pacer_bench/stats.py); and each stack's τ
with its interval. The verdict: A faster (the interval lies above 1), B faster (below 1), or no
difference beyond the noise (it contains 1) — or, on fewer than ``MIN_PROMPTS`` prompts, too few
prompts to tell: a bootstrap over so few prompts understates how much the ratio varies from prompt
to prompt (with 2 prompts it can only mix those two), so no verdict is drawn from it.
Meaning and use: docs/benchmarks.md#confidence-intervals.

Stacks are named as the report names them; a name copied with its backticks, or typed in the ASCII
form of Spec-Bench's file names (``eagle_margin(0.3)`` for ``eagle·margin(0.3)``), is found too
(``labels.resolve_name``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from pacer_core.errors import InputError

from .answers import load_run
from .labels import resolve_name
from .stats import SEED, format_interval, interval, rate_columns, ratio_of_rates, tau_interval

ALL = "all"
MIN_PROMPTS = 8  # fewer prompts in a cell: "too few prompts to tell", whatever its interval says


def _key(r: dict) -> tuple:
    return (str(r["prompt_set"]), str(r["question_id"]), int(r.get("repeat", 0)), int(r.get("turn", 0)))


def verdict(ci: Optional[Sequence[float]], a: str, b: str, prompts: Optional[int] = None) -> str:
    if prompts is not None and prompts < MIN_PROMPTS:
        return f"too few prompts to tell ({prompts} < {MIN_PROMPTS})"
    if ci is None:
        return "no interval (no paired records)"
    if ci[0] > 1.0:
        return f"{a} faster"
    if ci[1] < 1.0:
        return f"{b} faster"
    return "no difference beyond the noise"


def compare(records: Sequence[dict], a: str, b: str, sets: Sequence[str], seed: int = SEED) -> dict[str, dict]:
    """Per prompt set of ``sets`` and ``all``: the paired ratio of A's rate over B's and its interval,
    each stack's τ and interval, and the verdict (a set where the two share no key is left out)."""
    out: dict[str, dict[str, Any]] = {}
    for set_name in [*sets, ALL]:
        mine = [r for r in records if r["model_id"] == a and (set_name == ALL or r["prompt_set"] == set_name)]
        theirs = {
            _key(r): r for r in records if r["model_id"] == b and (set_name == ALL or r["prompt_set"] == set_name)
        }
        columns, clusters = rate_columns(mine, theirs)
        if not len(clusters):
            continue
        totals = columns.sum(axis=0)
        rate_ratio = (
            (totals[0] / totals[1]) / (totals[2] / totals[3]) if totals[1] and totals[2] and totals[3] else None
        )
        ci = interval(ratio_of_rates, columns, clusters, np.random.default_rng(seed))
        paired = [r for r in mine if _key(r) in theirs]
        partners = [theirs[_key(r)] for r in paired]
        taus = {}
        for name, chosen in ((a, paired), (b, partners)):
            steps = sum(r["metrics"].get("steps", 0) or 0 for r in chosen)
            emitted = sum(sum(r["metrics"].get("accept_lengths", [])) for r in chosen)
            tau_ci = tau_interval(chosen, seed)
            taus[name] = {"tau": emitted / steps if steps else None, "tau_ci": list(tau_ci) if tau_ci else None}
        out[set_name] = {
            "prompts": len(set(clusters)),
            "pairs": len(paired),
            "ratio": rate_ratio,
            "ci": list(ci) if ci else None,
            "verdict": verdict(ci, a, b, len(set(clusters))),
            "tau": taus,
        }
    return out


def compare_run(out: Path, a: str, b: str) -> tuple[dict, str]:
    """The comparison of stacks ``a`` and ``b`` in bench folder ``out`` and its markdown table."""
    meta, records, _ = load_run(Path(out))
    names = list(dict.fromkeys(r["model_id"] for r in records))
    found_names = []
    for name in (a, b):
        stack = resolve_name(name, names)
        if stack is None:
            raise InputError(
                f"--compare: '{name}' has no record in '{out}'; stacks there: {', '.join(names) or 'none'}"
            )
        found_names.append(stack)
    a, b = found_names
    if a == b:
        raise InputError(f"--compare names '{a}' twice: give two different stacks")
    sets = [s for s in meta["prompt_sets"] if any(r["prompt_set"] == s for r in records)]
    found = compare(records, a, b, sets)
    if not found:
        raise InputError(f"--compare: '{a}' and '{b}' ran no prompt in common in '{out}': run both on the same prompts")
    return found, markdown(found, a, b)


def markdown(found: dict[str, dict], a: str, b: str) -> str:
    lines = [
        f"`{a}` vs `{b}`: tokens/s ratio on the generations both ran, 95% interval from a paired bootstrap "
        "over prompts and repeats",
        "",
        f"| prompt set | prompts | generations | {a} ÷ {b} | τ {a} | τ {b} | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for set_name, c in found.items():
        lines.append(
            f"| {set_name} | {c['prompts']} | {c['pairs']} | "
            f"{format_interval(c['ratio'], c['ci'], '.3f', '×')} | "
            f"{format_interval(c['tau'][a]['tau'], c['tau'][a]['tau_ci'])} | "
            f"{format_interval(c['tau'][b]['tau'], c['tau'][b]['tau_ci'])} | {c['verdict']} |"
        )
    few = [set_name for set_name, c in found.items() if c["prompts"] < MIN_PROMPTS]
    if few:
        lines += [
            "",
            f"Too few prompts to tell in {', '.join(few)}: on fewer than {MIN_PROMPTS} prompts a "
            "bootstrap interval understates how much the ratio varies from prompt to prompt; run more "
            "prompts (--limit) before reading a difference there.",
        ]
    return "\n".join(lines)
