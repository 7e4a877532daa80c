"""The bench report's numbers: ``results.json``, computed from ``answers.jsonl`` alone (``summarize``).

Every number is a ratio of totals over records (never a mean of per-prompt ratios): speedup is a
stack's tokens/s over autoregressive decoding's on the same (prompt, repeat, turn) keys; τ is emitted
tokens / steps; acceptance rate is accepted / drafted; shares of time are summed stage times over
summed wall time. On a token tree a step's drafted count is the tree's depth, its accepted count
the accepted path's length, and its tree size the nodes the target verified (records written
before token trees, chains and transformers' baselines: the draft length). Every speedup and τ
carries a 95% interval (``speedup_ci``, ``tau_ci``: pacer_bench/stats.py). Field meanings:
docs/benchmarks.md. How they are shown (report.md, the plots): pacer_bench/report.py.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from pacer_core.cost_profiles import CostModel, cost_model
from pacer_core.metrics import step_metrics

from .answers import pair_key as _key  # a stack's record and the baseline's of the same prompt
from .replay.chains import analyse
from .replay.recorded import RecordedRun
from .replay.recorded import unit_drafter as _strategy_drafter
from .replay.steplog import Generation, LoggedStep
from .stats import cell_intervals, prompt_speedups

ALL = "all"  # the row over every prompt set
SLOWEST = 3  # per stack, the prompts with the lowest speedups that results.json keeps


def _sum(records: list[dict], field: str) -> float:
    return float(sum(r["metrics"].get(field, 0) or 0 for r in records))


def _ratio(a: float, b: float) -> Optional[float]:
    return a / b if b else None


def _steps(records: list[dict], field: str) -> list[int]:
    return [x for r in records for x in r["metrics"].get(field, [])]


SOURCE_PREFIX = "hybrid_accepted_"  # the hybrid drafter's metrics: accepted tokens each member proposed


def source_shares(records: list[dict]) -> dict[str, float]:
    """Each hybrid member's share of the accepted draft tokens over ``records`` (empty for a stack
    without members; a member that never won a token has share 0)."""
    counts: dict[str, float] = {}
    for r in records:
        for field, value in r["metrics"].items():
            if field.startswith(SOURCE_PREFIX):
                name = field[len(SOURCE_PREFIX) :]
                counts[name] = counts.get(name, 0.0) + float(value or 0)
    total = sum(counts.values())
    return {name: (n / total if total else 0.0) for name, n in counts.items()}


def mb_share(records: list[dict], wall: float) -> Optional[float]:
    """PACER's pre-verification layer's own time (``pacer_mb_s``, part of the stop time) over the
    wall time; None for a stack without it."""
    if not any("pacer_mb_s" in r["metrics"] for r in records):
        return None
    return _ratio(_sum(records, "pacer_mb_s"), wall)


def draft_topk(records: list[dict]) -> Optional[dict[str, Any]]:
    """The ``draft_quality`` observer's tallies summed over ``records``: per draft position, the steps
    judged and the share whose target token was in the draft's top k (None without the observer)."""
    tallies = [r["metrics"]["draft_topk"] for r in records if r["metrics"].get("draft_topk")]
    if not tallies:
        return None
    ks = tallies[0]["k"]
    depth = max(len(t["counts"]) for t in tallies)
    totals = [[0] * (1 + len(ks)) for _ in range(depth)]
    for t in tallies:
        if t["k"] != ks:
            raise ValueError(f"draft_topk tallies with different ks ({t['k']} vs {ks}) in one cell")
        for position, row in enumerate(t["counts"]):
            totals[position] = [a + b for a, b in zip(totals[position], row)]
    return {
        "k": ks,
        "judged": [row[0] for row in totals],
        "agreement": [[(hit / row[0] if row[0] else None) for hit in row[1:]] for row in totals],
    }


def _nodes(record: dict) -> float:
    """Nodes the target verified over a record's steps: ``nodes_per_step`` where recorded, else its
    drafted tokens (a chain verifies its draft; logs from before token trees)."""
    nodes = record["metrics"].get("nodes_per_step")
    return float(sum(nodes)) if nodes is not None else float(record["metrics"].get("drafted", 0) or 0)


def host_ms_per_step(records: list[dict]) -> Optional[float]:
    """Milliseconds per step outside the model forwards: (wall − forward_s) / steps over the records
    whose forwards were timed (CPU runs, docs/host-time.md); None when none were."""
    timed = [r for r in records if r["metrics"].get("forward_s") is not None]
    host = _sum(timed, "wall_s") - _sum(timed, "forward_s")
    ratio = _ratio(host, _sum(timed, "steps"))
    return None if ratio is None else 1000 * ratio


def main_path(records: list[dict], steps: float) -> Optional[float]:
    """Main-path tokens per step (what the stop policies asked for), or None where a record predates
    ``main_path_per_step``. Below the depth (``mean_draft_length``) where side nodes reach deeper
    than the main path's tip, as Ouroboros' candidate suffixes do."""
    if not records or any("main_path_per_step" not in r["metrics"] for r in records):
        return None
    return _ratio(sum(sum(r["metrics"]["main_path_per_step"]) for r in records), steps)


def cell(records: list[dict], reference: dict[tuple, dict]) -> dict[str, Any]:
    """One stack's numbers over ``records``; ``reference`` maps keys to autoregressive records."""
    new = float(sum(len(r["tokens"]) for r in records))
    wall = _sum(records, "wall_s")
    paired = [r for r in records if _key(r) in reference]
    ref = [reference[_key(r)] for r in paired]
    stack_rate = _ratio(sum(len(r["tokens"]) for r in paired), _sum(paired, "wall_s"))
    ref_rate = _ratio(sum(len(r["tokens"]) for r in ref), _sum(ref, "wall_s"))
    steps, drafted, accepted = _sum(records, "steps"), _sum(records, "drafted"), _sum(records, "accepted")
    per_step = step_metrics(
        _steps(records, "accept_lengths"), _steps(records, "drafted_per_step"), _steps(records, "accepted_per_step")
    )  # all their steps, concatenated
    emitted = float(per_step["emitted"])
    divergences = [r["first_divergence"] for r in paired if r.get("first_divergence") is not None]
    by_prompt = sorted(prompt_speedups(paired, reference).items(), key=lambda item: item[1])
    return {
        "records": len(records),
        "new_tokens": int(new),
        "wall_s": wall,
        "tokens_per_s": _ratio(new, wall),
        "speedup": _ratio(stack_rate, ref_rate) if stack_rate is not None and ref_rate else None,
        "paired": len(paired),
        "steps": int(steps),
        "drafted": int(drafted),
        "accepted": int(accepted),
        "tau": _ratio(emitted, steps),
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_draft_length": _ratio(drafted, steps),
        "mean_main_path": main_path(records, steps),
        "mean_nodes_per_step": _ratio(sum(_nodes(r) for r in records), steps),
        "target_forwards_per_token": _ratio(_sum(records, "target_forwards"), new),
        "draft_forwards_per_token": _ratio(_sum(records, "draft_forwards"), new),
        "draft_share": _ratio(_sum(records, "draft_s"), wall),
        "verify_share": _ratio(_sum(records, "verify_s"), wall),
        "stop_share": _ratio(_sum(records, "stop_s"), wall),
        "host_ms_per_step": host_ms_per_step(records),
        "mb_share": mb_share(records, wall),
        "identical": sum(bool(r.get("identical_to_autoregressive")) for r in paired),
        "first_divergence_min": min(divergences) if divergences else None,
        "first_divergence_median": statistics.median(divergences) if divergences else None,
        "per_position_acceptance": per_step["per_position_acceptance"],
        "draft_length_histogram": {str(d): n for d, n in per_step["draft_length_histogram"].items()},
        "source_shares": source_shares(records),
        "draft_topk": draft_topk(records),
        "prompts": len(by_prompt),
        "prompts_below_one": sum(speedup < 1.0 for _, speedup in by_prompt),
        "slowest_prompts": [[name, speedup] for name, speedup in by_prompt[:SLOWEST]],
    }


def _drafter(unit: dict) -> Optional[str]:
    return _strategy_drafter(unit).get("name")


def _is_tree_stack(unit: dict, generations: list[Generation]) -> bool:
    """A stack drafting token trees: its drafter has a ``tree`` section, or a logged step verified
    more nodes than its depth (side nodes)."""
    declared = _strategy_drafter(unit).get("tree") is not None
    return declared or any(g.is_tree for g in generations)


def comparisons(units: list[dict], table: dict[str, dict[str, dict]]) -> dict[str, Any]:
    """The goals' ratios, per prompt set (and ``all``), from the speedups in ``table``:

    - ``trees``: for each model drafter with tree and chain stacks, the fastest tree stack over the
      fastest chain stack of the same drafter (chosen per set, as a reader with hindsight would);
    - ``hybrids``: each hybrid stack over the better of its members, a member's stacks being the
      non-hybrid stacks whose drafter is that member entry (the same name, and the same ``tree`` for
      a model member) under any stop.
    Units are bench.json's (``name`` and ``config``); a set without the stacks it needs is left out.
    """
    drafters = {u["name"]: _strategy_drafter(u) for u in units if u.get("kind", "stack") == "stack"}
    out: dict[str, Any] = {"trees": {}, "hybrids": {}}

    def best(names: list[str], row: dict) -> Optional[tuple[str, float]]:
        timed = [(n, row[n]["speedup"]) for n in names if n in row and row[n].get("speedup") is not None]
        return max(timed, key=lambda x: x[1]) if timed else None

    def ratio(top: Optional[tuple[str, float]], bar: Optional[tuple[str, float]]) -> Optional[dict]:
        if top is None or bar is None or not bar[1]:
            return None
        return {
            "stack": top[0],
            "speedup": top[1],
            "against": bar[0],
            "against_speedup": bar[1],
            "ratio": top[1] / bar[1],
        }

    for model in sorted({d.get("name") for d in drafters.values() if d.get("tree") is not None} - {None}):
        trees = [n for n, d in drafters.items() if d.get("name") == model and d.get("tree") is not None]
        chains = [n for n, d in drafters.items() if d.get("name") == model and d.get("tree") is None]
        if not chains:
            continue
        per_set = {s: ratio(best(trees, row), best(chains, row)) for s, row in table.items()}
        out["trees"][model] = {s: r for s, r in per_set.items() if r is not None}
    for name, d in drafters.items():
        if d.get("name") != "hybrid":
            continue
        members = [m for m in d.get("members") or [] if isinstance(m, dict) and m.get("name")]
        groups = [
            [n for n, o in drafters.items() if o.get("name") == m["name"] and o.get("tree") == m.get("tree")]
            for m in members
        ]
        if not members or not all(groups):
            continue  # a member without a stack of its own: nothing to compare with
        pool = [n for g in groups for n in g]
        per_set = {s: ratio(best([name], row), best(pool, row)) for s, row in table.items()}
        out["hybrids"][name] = {s: r for s, r in per_set.items() if r is not None}
    return out


def oracle_summary(run: RecordedRun, table: dict[str, dict[str, dict]]) -> Optional[dict]:
    """Oracle replay of the log stack per prompt set and overall (None without a log or a cost model).

    The replay models chains: a log stack drafting trees is not replayed (``skipped`` says why) and
    tree stacks are left out of the policies (listed under ``tree_stacks``)."""
    meta, cost_file = run.meta, run.cost_file
    log_stack = (meta.get("oracle") or {}).get("log_stack")
    if not log_stack or not cost_file:
        return None
    log_generations = run.of(log_stack)
    if not log_generations:
        return None
    drafter = _drafter(run.units.get(log_stack, {}))
    if _is_tree_stack(run.units.get(log_stack, {}), log_generations):
        return {
            "log_stack": log_stack,
            "drafter": drafter,
            "sets": {},
            "skipped": "it drafts token trees; the oracle replays a chain log (a fixed long window)",
        }
    drafted = sum(g.metrics.get("drafted", 0) for g in log_generations)
    draft_token_s = sum(g.metrics.get("draft_s", 0.0) for g in log_generations) / drafted if drafted else 0.0
    cost = cost_model(cost_file, draft_token_s)
    candidates = [
        u["name"]
        for u in meta["units"]
        if u["kind"] == "stack" and u["name"] != meta["baseline"] and _drafter(u) == drafter
    ]
    trees = [name for name in candidates if _is_tree_stack(run.units[name], run.of(name))]
    policies = [name for name in candidates if name not in trees]
    longest = max((d for g in log_generations for d in g.metrics.get("drafted_per_step", [])), default=0)
    gammas = list(range(1, longest + 1))
    out = {
        "log_stack": log_stack,
        "drafter": drafter,
        "verify_s": list(cost.verify_s),
        "measured_verify_s": list(cost_file["verify_s"]),
        "draft_token_s": draft_token_s,
        "gammas": gammas,
        "tree_stacks": trees,
        "sets": {},
    }

    def steps_of(name: str, set_name: str) -> list[LoggedStep]:
        return [s for g in run.of(name) if set_name == ALL or g.prompt_set == set_name for s in g.steps]

    for set_name in list(meta["prompt_sets"]) + [ALL]:
        log = steps_of(log_stack, set_name)
        if not log:
            continue
        result = analyse(log, cost, gammas, {name: steps_of(name, set_name) for name in policies})
        for name, info in result["policies"].items():
            info["measured_speedup"] = table.get(set_name, {}).get(name, {}).get("speedup")
        result["fixed"] = {str(g): v for g, v in result["fixed"].items()}
        out["sets"][set_name] = result
    return out


def verify_bound(generations: list[Generation], cost: CostModel) -> Optional[dict]:
    """What a stack's verification alone costs over all its steps, from the cost model: the mean
    verification forward ÷ a plain decoding step (k = 1), and the speedup if drafting cost nothing
    (τ ÷ that ratio). A tree step costs a tree-masked forward over its nodes + 1 tokens, a chain
    step a causal one over its draft + 1. None without drafted steps."""
    steps = [s for g in generations for s in g.steps]
    if not any(s.drafted for s in steps):
        return None
    free = CostModel(cost.verify_s, 0.0, cost.tree_k, cost.tree_verify_s)
    seconds = sum(free.step(s.drafted, s.nodes) for s in steps)
    emitted = float(sum(_steps([g.record for g in generations], "accept_lengths")))
    tokens = sum(s.sent + 1 for s in steps)
    return {
        "steps": len(steps),
        "verified_tokens_per_step": tokens / len(steps),
        "verify_cost_ratio": seconds / len(steps) / free.verify(1),
        "tau": emitted / len(steps),
        "free_draft_speedup": emitted / seconds * free.verify(1),
        "tree": any(g.is_tree for g in generations),
    }


def summarize(meta: dict, records: list[dict], cost_file: Optional[dict] = None) -> dict[str, Any]:
    """Everything results.json holds (without the rendered markdown)."""
    run = RecordedRun.parse(meta, records, cost_file)  # every record's steps parsed once
    baseline = meta["baseline"]
    unit_names = [u["name"] for u in meta["units"]]
    present = {r["model_id"] for r in records}
    unit_names += sorted(present - set(unit_names))
    sets = [s for s in meta["prompt_sets"] if any(r["prompt_set"] == s for r in records)]
    sets += sorted({r["prompt_set"] for r in records} - set(sets))
    reference = {_key(r): r for r in records if r["model_id"] == baseline}
    table: dict[str, dict[str, dict]] = {}
    for set_name in sets + [ALL]:
        chosen = [r for r in records if set_name == ALL or r["prompt_set"] == set_name]
        row = {}
        for name in unit_names:
            mine = [r for r in chosen if r["model_id"] == name]
            if mine:
                row[name] = {**cell(mine, reference), **cell_intervals(mine, reference)}
        table[set_name] = row
    results = {
        "baseline": baseline,
        "settings": meta.get("settings", {}),
        "prompt_sets": sets,
        "units": [
            {"name": n, "kind": next((u["kind"] for u in meta["units"] if u["name"] == n), "stack")} for n in unit_names
        ],
        "skipped": meta.get("skipped", {}),
        "table": table,
        "oracle": oracle_summary(run, table),
        "verify_cost_ms": [1000 * v for v in cost_file["verify_s"]] if cost_file else None,
        "tree_verify_cost_ms": (
            {"k": list(cost_file["tree_k"]), "ms": [1000 * v for v in cost_file["tree_verify_s"]]}
            if cost_file and cost_file.get("tree_k")
            else None
        ),
        "verify_bound": None,
        "comparisons": comparisons(meta["units"], table),
    }
    if cost_file:
        cost = cost_model(cost_file)
        bounds = {name: verify_bound(run.of(name), cost) for name in unit_names if name != baseline}
        results["verify_bound"] = {name: b for name, b in bounds.items() if b is not None}
    if meta.get("predict"):
        from .replay.predictions import predicted_columns

        results["predicted"] = predicted_columns(run, meta["predict"])
    ablation = meta.get("ablation")
    if ablation:
        rows = []
        for name, point in ablation["points"].items():
            numbers = table[ALL].get(name)
            if numbers is not None:
                rows.append(
                    {
                        "stack": name,
                        **point,
                        **{
                            k: numbers.get(k)
                            for k in (
                                "records",
                                "speedup",
                                "speedup_ci",
                                "tau",
                                "tau_ci",
                                "acceptance_rate",
                                "mean_draft_length",
                                "mean_main_path",
                                "mean_nodes_per_step",
                                "identical",
                                "paired",
                            )
                        },
                    }
                )
        results["ablation"] = {"keys": ablation["keys"], "rows": rows}
    return results
