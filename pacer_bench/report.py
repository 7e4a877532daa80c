"""The bench report: ``report.md``, ``results.json`` and PNG plots of a bench folder (``write_report``).

The numbers are ``results.summarize``'s, from ``answers.jsonl`` alone (pacer_bench/results.py says
how each is computed); this module shows them: the markdown tables and sections, ``ablation.md``,
the plots, and Spec-Bench's answer files and speed report rebuilt from the answer log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pacer_core.errors import InputError

from .answers import load_run, shown_path, write_json
from .results import ALL, summarize
from .specbench import answer_files, leaderboard_markdown, speed_markdown, speed_report, write_answer_files
from .stats import format_interval


# -- markdown ----------------------------------------------------------------------------------
def comparisons_markdown(results: dict) -> list[str]:
    """The ``comparisons`` as a table: tree vs chain per drafter, hybrid vs its better member."""
    found = results.get("comparisons") or {}
    rows = [
        (f"fastest `{model}` tree vs its fastest chain", per_set) for model, per_set in found.get("trees", {}).items()
    ]
    rows += [(f"`{name}` vs its better member", per_set) for name, per_set in found.get("hybrids", {}).items()]
    if not rows:
        return []
    sets = [*results["prompt_sets"], ALL]
    lines = [
        "## Trees vs chains, hybrids vs members",
        "",
        "Per prompt set, the ratio of speedups, with the two stacks compared (the faster of each kind "
        "chosen per set; a hybrid's members: the stacks whose drafter is a member entry, any stop).",
        "",
        "| comparison | " + " | ".join(sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for label, per_set in rows:
        cells = []
        for s in sets:
            r = per_set.get(s)
            cells.append(
                "—"
                if r is None
                else f"{r['ratio']:.2f}× ({r['stack']} {r['speedup']:.2f}× / "
                f"{r['against']} {r['against_speedup']:.2f}×)"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def slowest_prompts_markdown(results: dict) -> list[str]:
    """Per stack, its speedup on each prompt (over that prompt's repeats): how many prompts it ran
    slower than the baseline on, and the slowest three (docs/benchmarks.md#per-prompt-the-slowest)."""
    row = {name: c for name, c in results["table"][ALL].items() if name != results["baseline"] and c.get("prompts")}
    if not row or max(c["prompts"] for c in row.values()) < 2:
        return []
    lines = [
        "## Per prompt: the slowest",
        "",
        "Per prompt, a stack's speedup over that prompt's repeats (a ratio of totals, as above); the prompts "
        "it ran slower than the baseline on, and its slowest three. Timing noise alone spreads these "
        "around a stack's true speed: a second plain-decoding stack in the run measures how far.",
        "",
        "| stack | prompts | slower than the baseline | slowest prompts |",
        "|---|---|---|---|",
    ]
    for name, c in row.items():
        slowest = ", ".join(f"{speedup:.3f}× ({prompt})" for prompt, speedup in c["slowest_prompts"])
        lines.append(f"| {name} | {c['prompts']} | {c['prompts_below_one']} | {slowest} |")
    return lines + [""]


def _fmt(value: Any, kind: str = "f2") -> str:
    if value is None:
        return "—"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "x":
        return f"{value:.2f}×"
    if kind == "f1":
        return f"{value:.1f}"
    if kind == "int":
        return str(int(value))
    return f"{value:.2f}"


_COLUMNS = (
    "| stack | prompts | tok/s | speedup | τ | acceptance | mean draft | tree size | target fw/token "
    "| draft fw/token | draft time | verify time | stop time | host ms/step | identical "
    "| first divergence (min / median) |"
)


def _draft(c: dict) -> str:
    """Mean draft: main-path tokens per step; where side nodes reach deeper than the main path's tip
    (Ouroboros' candidate suffixes), the tree's depth follows in brackets, so suffixes are never read
    as draft length."""
    main, depth = c.get("mean_main_path"), c.get("mean_draft_length")
    if main is None or depth is None or abs(depth - main) < 0.005:
        return _fmt(depth)
    return f"{_fmt(main)} (depth {_fmt(depth)})"


def _stop(c: dict) -> str:
    """The stop time, with M_B's own share in brackets where a PACER stop ran."""
    stop = _fmt(c["stop_share"], "pct")
    return stop if c.get("mb_share") is None else f"{stop} (M_B {_fmt(c['mb_share'], 'pct')})"


def _row(name: str, c: dict) -> str:
    div = (
        "—" if c["first_divergence_min"] is None else f"{c['first_divergence_min']} / {c['first_divergence_median']:g}"
    )
    return (
        f"| {name} | {c['records']} | {_fmt(c['tokens_per_s'], 'f1')} | "
        f"{format_interval(c['speedup'], c.get('speedup_ci'), '.2f', '×')} | "
        f"{format_interval(c['tau'], c.get('tau_ci'))} | {_fmt(c['acceptance_rate'], 'pct')} | "
        f"{_draft(c)} | "
        f"{_fmt(c.get('mean_nodes_per_step'))} | "
        f"{_fmt(c['target_forwards_per_token'])} | {_fmt(c['draft_forwards_per_token'])} | "
        f"{_fmt(c['draft_share'], 'pct')} | {_fmt(c['verify_share'], 'pct')} | {_stop(c)} | "
        f"{_fmt(c.get('host_ms_per_step'))} | {c['identical']}/{c['paired']} | {div} |"
    )


def table_markdown(row: dict[str, dict]) -> str:
    lines = [_COLUMNS, "|" + "---|" * _COLUMNS.count(" | ") + "---|"]
    lines += [_row(name, c) for name, c in row.items()]
    return "\n".join(lines)


def _oracle_markdown(oracle: dict) -> list[str]:
    if oracle.get("skipped"):
        return ["## Oracle replay", "", f"Not replayed: log stack `{oracle['log_stack']}`: {oracle['skipped']}.", ""]
    lines = [
        "## Oracle replay",
        "",
        f"Long-draft log: stack `{oracle['log_stack']}` (drafter `{oracle['drafter']}`). Cost model: "
        f"verification {', '.join(f'{1000 * v:.1f}' for v in oracle['verify_s'])} ms "
        f"for k = 1..{len(oracle['verify_s'])} "
        f"tokens (measured medians made non-decreasing); draft {1000 * oracle['draft_token_s']:.3f} ms per "
        "token. Simulated speedups (method: docs/benchmarks.md).",
        "",
        "| prompt set | steps | best fixed γ | best fixed | oracle | oracle / best fixed | cost-optimal oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for set_name, r in oracle["sets"].items():
        lines.append(
            f"| {set_name} | {r['steps']} | {r['best_fixed_gamma']} | {_fmt(r['best_fixed_speedup'], 'x')} | "
            f"{_fmt(r['oracle_speedup'], 'x')} | {_fmt(r['oracle_over_best_fixed'], 'x')} | "
            f"{_fmt(r['optimal_oracle_speedup'], 'x')} |"
        )
    lines += [
        "",
        "Policies (each replayed on its own log; captured = share of the oracle's gain over the best fixed γ):",
        "",
        "| prompt set | stack | simulated | measured | captured |",
        "|---|---|---|---|---|",
    ]
    for set_name, r in oracle["sets"].items():
        for name, p in r["policies"].items():
            lines.append(
                f"| {set_name} | {name} | {_fmt(p['simulated_speedup'], 'x')} | "
                f"{_fmt(p['measured_speedup'], 'x')} | {_fmt(p['captured'], 'pct')} |"
            )
    if oracle.get("tree_stacks"):
        lines += [
            "",
            "Not replayed: " + ", ".join(f"`{n}`" for n in oracle["tree_stacks"]) + " (token trees: a "
            "fixed γ and the oracle are chains, which do not bound a tree; compare trees by measured speedup "
            "and the verification-cost section).",
        ]
    return lines + [""]


def sources_markdown(results: dict) -> list[str]:
    """Per hybrid stack and prompt set: each member's share of the accepted draft tokens."""
    rows = [
        (set_name, name, c["source_shares"])
        for set_name in [*results["prompt_sets"], ALL]
        for name, c in results["table"].get(set_name, {}).items()
        if c.get("source_shares")
    ]
    if not rows:
        return []
    lines = [
        "## Draft sources (hybrid stacks)",
        "",
        "Share of the accepted draft tokens each member proposed (`hybrid_accepted_<member>`; a node "
        "several members proposed counts for the one that put it in the tree first: the first (primary) "
        "member, then the others in their order).",
        "",
        "| prompt set | stack | accepted tokens by source |",
        "|---|---|---|",
    ]
    for set_name, name, shares in rows:
        lines.append(f"| {set_name} | {name} | " + ", ".join(f"{m} {v:.0%}" for m, v in shares.items()) + " |")
    return lines + [""]


def quality_markdown(results: dict, positions: int = 4) -> list[str]:
    """Per stack with the ``draft_quality`` observer and prompt set: top-k agreement at the first
    ``positions`` draft positions."""
    rows = [
        (set_name, name, c["draft_topk"])
        for set_name in [*results["prompt_sets"], ALL]
        for name, c in results["table"].get(set_name, {}).items()
        if c.get("draft_topk")
    ]
    if not rows:
        return []
    ks = rows[0][2]["k"]
    shown = min(positions, max(len(q["judged"]) for _, _, q in rows))
    lines = [
        "## Draft quality",
        "",
        "Share of steps whose target token is among the draft's top "
        + " / ".join(str(k) for k in ks)
        + " tokens, per draft position (`draft_quality` observer): at position j, of the steps whose positions "
        "1 … j − 1 were accepted; n = the steps judged there.",
        "",
        "| prompt set | stack | " + " | ".join(f"position {j + 1} (n)" for j in range(shown)) + " |",
        "|---|---|" + "---|" * shown,
    ]
    for set_name, name, q in rows:
        cells = []
        for j in range(shown):
            if j >= len(q["judged"]) or not q["judged"][j]:
                cells.append("—")
                continue
            cells.append(" / ".join(f"{a:.2f}" for a in q["agreement"][j]) + f" ({q['judged'][j]})")
        lines.append(f"| {set_name} | {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def render(results: dict, plots: list[str]) -> str:
    s = results["settings"]
    target = s.get("target") or {}
    draft = s.get("draft")
    lines = [
        "# Benchmark report",
        "",
        f"Target `{target.get('path') or 'embedded SmolLM2-135M-Instruct'}` ({target.get('dtype')}), "
        f"draft {('`' + shown_path(draft.get('path')) + '`') if draft else 'none'}, device {s.get('device')}, "
        f"max_new_tokens {s.get('max_new_tokens')}, sampling {s.get('sampling')}, "
        f"ignore_eos {s.get('ignore_eos')}.",
        f"Baseline: `{results['baseline']}` (the same engine, no draft). Speedup = tokens/s ratio of totals "
        "on the same prompts; identical = outputs equal to autoregressive token for token. τ = emitted tokens "
        "÷ steps, every step counted (the first, which verified the prefill's token, included); mean draft = "
        "main-path tokens per step (where side nodes reach deeper, the tree's depth in brackets). [low, high]: "
        "95% interval, paired bootstrap over prompts and repeats (docs/benchmarks.md#confidence-intervals).",
        "",
    ]
    if results["skipped"]:
        lines += ["Skipped: " + "; ".join(f"`{k}` ({v})" for k, v in results["skipped"].items()), ""]
    lines += ["## All prompt sets", "", table_markdown(results["table"][ALL]), ""]
    for set_name in results["prompt_sets"]:
        lines += [f"## {set_name}", "", table_markdown(results["table"][set_name]), ""]
    lines += slowest_prompts_markdown(results)
    lines += comparisons_markdown(results)
    lines += sources_markdown(results)
    lines += quality_markdown(results)
    if results.get("ablation"):
        lines += ["## Ablation", "", ablation_markdown(results["ablation"]), ""]
    if results.get("specbench"):
        lines += leaderboard_markdown(results["specbench"], results["prompt_sets"])
        lines += speed_markdown(results["specbench"])
    if results.get("verify_cost_ms"):
        lines += verify_cost_markdown(results)
    if results.get("oracle"):
        lines += _oracle_markdown(results["oracle"])
    if results.get("predicted"):
        from .replay.predictions import markdown as predicted_markdown

        lines += [
            "## Predicted under device cost profiles",
            "",
            "The run's recorded steps priced under each profile (`pacer replay`, docs/costs.md#replay).",
            "",
        ]
        lines += [predicted_markdown(p) for p in results["predicted"]]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def verify_cost_markdown(results: dict) -> list[str]:
    """The verification-cost section: causal forwards over k = 1..K tokens (chains), tree-masked
    forwards over the token counts trees use, and each drafting stack's verification bill."""
    costs = results["verify_cost_ms"]
    lines = [
        "## Verification cost",
        "",
        "One target forward over k new tokens after the first prompt (median, ms; plain decoding is k = 1; "
        "a chain of γ draft tokens verifies k = γ + 1):",
        "",
        "| k | " + " | ".join(str(k) for k in range(1, len(costs) + 1)) + " |",
        "|---|" + "---|" * len(costs),
        "| ms | " + " | ".join(f"{c:.1f}" for c in costs) + " |",
        "| ÷ k = 1 | " + " | ".join(f"{c / costs[0]:.2f}" for c in costs) + " |",
        "",
    ]
    tree = results.get("tree_verify_cost_ms")
    if tree:
        lines += [
            "Token trees: one forward with a tree's positions and ancestor mask over k tokens (a tree of "
            "N nodes verifies k = N + 1), ÷ the plain step above:",
            "",
            "| k | " + " | ".join(str(k) for k in tree["k"]) + " |",
            "|---|" + "---|" * len(tree["k"]),
            "| ms | " + " | ".join(f"{c:.1f}" for c in tree["ms"]) + " |",
            "| ÷ k = 1 | " + " | ".join(f"{c / costs[0]:.2f}" for c in tree["ms"]) + " |",
            "",
        ]
    bounds = results.get("verify_bound")
    if bounds:
        lines += [
            "What each drafting stack's verification costs (all prompt sets; the measured costs made "
            "non-decreasing in k, interpolated between measured token counts): the mean verification "
            "forward ÷ a plain step, and τ ÷ that, the speedup if drafting cost nothing. A tree pays "
            "when its τ grows faster than its verification cost.",
            "",
            "| stack | draft | tokens verified / step | verify cost ÷ k = 1 | τ | free-draft speedup |",
            "|---|---|---|---|---|---|",
        ]
        for name, b in bounds.items():
            lines.append(
                f"| {name} | {'tree' if b['tree'] else 'chain'} | {b['verified_tokens_per_step']:.2f} | "
                f"{b['verify_cost_ratio']:.2f} | {b['tau']:.2f} | {_fmt(b['free_draft_speedup'], 'x')} |"
            )
        lines.append("")
    return lines


def ablation_markdown(ablation: dict) -> str:
    """One row per grid point: its stack name (as ``pacer report --compare`` takes it), its grid
    values (compact JSON, as the grid file may write them) and its numbers."""
    keys = ablation["keys"]
    head = (
        "| stack | " + " | ".join(keys) + " | prompts | speedup | τ | acceptance | mean draft | tree size | identical |"
    )
    lines = [head, "|" + "---|" * (len(keys) + 8)]
    for r in ablation["rows"]:
        values = " | ".join(json.dumps(r[k], separators=(",", ":"), ensure_ascii=False) for k in keys)
        lines.append(
            f"| {r['stack']} | {values} | {r['records']} | "
            f"{format_interval(r['speedup'], r.get('speedup_ci'), '.2f', '×')} | "
            f"{format_interval(r['tau'], r.get('tau_ci'))} | "
            f"{_fmt(r['acceptance_rate'], 'pct')} | {_draft(r)} | "
            f"{_fmt(r.get('mean_nodes_per_step'))} | {r['identical']}/{r['paired']} |"
        )
    return "\n".join(lines)


# -- plots -------------------------------------------------------------------------------------
# Each figure keeps its text off its data: legends stand outside the axes (to the right, the figure
# growing to hold them: saved with bbox_inches="tight"), long stack names are wrapped, subplot titles
# are wrapped to their column's width, and the layout is constrained so no two texts overlap.
_WRAP = 32  # characters of a stack name per legend or title line


def _wrapped(name: str, width: int = _WRAP) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(name, width, break_on_hyphens=False, break_long_words=True)) or name


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend_outside(ax: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(
            handles,
            [_wrapped(label) for label in labels],
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            frameon=False,
        )


def speedup_figure(results: dict) -> Any:
    """Speedup per prompt set, one bar per stack, its 95% interval as an error bar."""
    plt = _pyplot()
    baseline = results["baseline"]
    names = [u["name"] for u in results["units"] if u["name"] != baseline]
    sets = results["prompt_sets"] + [ALL]
    table = results["table"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(sets) * max(1, len(names)) + 1.5), 4), layout="constrained")
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        cells = [table[s].get(name) or {} for s in sets]
        values = [c.get("speedup") or 0.0 for c in cells]
        low = [v - c["speedup_ci"][0] if c.get("speedup_ci") else 0.0 for v, c in zip(values, cells)]
        high = [c["speedup_ci"][1] - v if c.get("speedup_ci") else 0.0 for v, c in zip(values, cells)]
        ax.bar(
            [j + i * width for j in range(len(sets))],
            values,
            width,
            label=name,
            yerr=[low, high],
            capsize=2,
            error_kw={"elinewidth": 0.8},
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(sets))], sets)
    ax.set_ylabel(f"speedup over {baseline} (tokens/s)")
    ax.set_title("Speedup per prompt set (bars: 95% interval)")
    _legend_outside(ax)
    return fig


def _drafting(results: dict) -> list[str]:
    baseline = results["baseline"]
    return [
        u["name"]
        for u in results["units"]
        if u["name"] != baseline and (results["table"][ALL].get(u["name"]) or {}).get("drafted")
    ]


def draft_lengths_figure(results: dict) -> Any:
    """One histogram of draft lengths per drafting stack, titled with its (wrapped) name."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    drafting = _drafting(results)
    cols = max(1, min(3, len(drafting)))
    rows = max(1, -(-len(drafting) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.0 * rows), squeeze=False, layout="constrained")
    for ax, name in zip(axes.flat, drafting):
        hist = results["table"][ALL][name]["draft_length_histogram"]
        total = sum(hist.values()) or 1
        ax.bar([int(k) for k in hist], [v / total for v in hist.values()])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(_wrapped(name, 40), fontsize=8)
        ax.set_xlabel("draft length (a tree: its depth)", fontsize=8)
        ax.set_ylabel("share of steps", fontsize=8)
    for ax in list(axes.flat)[len(drafting) :]:
        ax.axis("off")
    return fig


def acceptance_figure(results: dict) -> Any:
    """Acceptance per depth, one line per drafting stack."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for name in _drafting(results):
        acc = results["table"][ALL][name]["per_position_acceptance"]
        ax.plot(range(1, len(acc) + 1), acc, marker=".", label=name)
    ax.set_xlabel("depth (a chain: draft position)")
    ax.set_ylabel("acceptance (accepted / drafted at depth)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance per depth (all prompt sets)")
    _legend_outside(ax)
    return fig


def oracle_figure(oracle_all: dict) -> Any:
    plt = _pyplot()
    r = oracle_all
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.plot([int(g) for g in r["fixed"]], list(r["fixed"].values()), marker="o", label="fixed γ (replayed)")
    ax.axhline(r["oracle_speedup"], color="green", linestyle="--", label="oracle")
    for i, (name, p) in enumerate(r["policies"].items()):
        ax.axhline(
            p["simulated_speedup"], linestyle=":", linewidth=1.2, label=f"{name} (simulated)", color=f"C{(i + 2) % 10}"
        )
    ax.set_xlabel("γ")
    ax.set_ylabel("simulated speedup")
    ax.set_title("Oracle replay (all prompt sets)")
    _legend_outside(ax)
    return fig


def make_plots(results: dict, out: Path) -> list[str]:
    """speedup_per_set.png, draft_lengths.png, per_position_acceptance.png (acceptance per depth) and,
    with an oracle, oracle.png."""
    plt = _pyplot()
    figures = {
        "speedup_per_set.png": speedup_figure(results),
        "draft_lengths.png": draft_lengths_figure(results),
        "per_position_acceptance.png": acceptance_figure(results),
    }
    oracle = results.get("oracle")
    if oracle and ALL in oracle.get("sets", {}):
        figures["oracle.png"] = oracle_figure(oracle["sets"][ALL])
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
    return list(figures)


def write_report(out: Path, plots: bool = True) -> dict[str, Any]:
    """Compute the report of a bench folder; write results.json, report.md, the plots and the
    Spec-Bench answer files (``specbench/<stack>.jsonl``, rebuilt from the answer log)."""
    out = Path(out)
    meta, records, cost = load_run(out)
    if not records:
        raise InputError(f"'{out}' has no finished records yet: run or resume the bench first")
    results = summarize(meta, records, cost)
    files = answer_files(records)
    results["specbench"] = {"files": write_answer_files(out, files), "speed": speed_report(files)}
    files = make_plots(results, out) if plots else []
    results["plots"] = files
    write_json(out / "results.json", results)
    text = render(results, files)
    (out / "report.md").write_text(text)
    if results.get("ablation"):
        (out / "ablation.md").write_text(ablation_markdown(results["ablation"]) + "\n")
    results["markdown_table"] = (
        ablation_markdown(results["ablation"]) if results.get("ablation") else table_markdown(results["table"][ALL])
    )
    return results
