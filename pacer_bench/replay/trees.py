"""Tree shapes replayed under a cost profile: which chain, which tree and which node budget pay on a device.

A bench stack with the ``tree_log`` observer records every step's wide draft tree (each node's
parent and draft probability, the main path, the accepted path: ``steplog.LoggedTree``), sending
every node. Under greedy verification a smaller shape's accepted path is the logged one's longest
prefix among the nodes it sends, so from one recording (noise-free, no clock):

- a **chain** of γ is the main path's first γ nodes;
- a **tree shape** of ``topk`` nodes a level and ``depth`` levels is read off the wider tree (each
  level's main-path child, then the best others by cumulative draft probability, as
  ``pacer_core.trees.grow_level`` keeps them), sending every node or its best ``n``
  (``pacer_core.trees.best_nodes``' rule);
- **auto** sends what ``nodes: auto`` sends (``pacer_core.trees.NodeBudget`` itself, its rate carried
  along the steps), valuing nodes by their raw cumulative draft probability, by a calibration
  (``pacer_core.calibration``) fitted on the other half of the prompts' logged trees, or by a given
  calibration file (what the engine would use);
- the **oracles** draft exactly the accepted chain (γ ≤ the logged depth) or path.

A step costs ``host + levels × one draft forward (over the previous level's width) + verify(1 + sent)``
under the profile (``verify_tree`` for a tree); speedups are over plain decoding's
``verify(1) + host_s.plain`` per token. The prompt's prefill is left out (the same for every shape).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from pacer_core import calibration as calibrations
from pacer_core.calibration import Calibration
from pacer_core.cost_profiles import Profile
from pacer_core.draft_values import TokenTree
from pacer_core.trees import NodeBudget, TreeConfig, node_values

from .steplog import LoggedTree


def accepted(step: LoggedTree, sent: set[int]) -> int:
    """Greedy: the logged accepted path's longest prefix among the nodes sent."""
    n = 0
    for node in step.path:
        if node not in sent:
            break
        n += 1
    return n


def shape(step: LoggedTree, topk: int, depth: int) -> list[int]:
    """The nodes a tree of ``topk`` nodes a level and ``depth`` levels grows, read off the logged tree."""
    depths, cp, main = step.depths, step.cumulative, set(step.main)
    kept: set[int] = set()
    for level in range(1, depth + 1):
        nodes = [i for i, d in enumerate(depths) if d == level and (step.parents[i] < 0 or step.parents[i] in kept)]
        ranked = [i for i in nodes if i in main] + sorted(
            (i for i in nodes if i not in main), key=lambda i: (-cp[i], i)
        )
        kept |= set(ranked[:topk])
    return sorted(kept)


def best(step: LoggedTree, nodes: Sequence[int], n: int) -> set[int]:
    cp = step.cumulative
    return set(sorted(nodes, key=lambda i: (-cp[i], i))[:n])


LOGGED_ZERO = 1e-12  # what a q logged as 0 stands for (tree_log keeps 6 decimals)


def _subtree(step: LoggedTree, nodes: Sequence[int]) -> TokenTree:
    """``nodes`` of the logged tree as a ``TokenTree`` whose draft probabilities give each node its
    logged q (what ``NodeBudget`` reads)."""
    index = {old: new for new, old in enumerate(nodes)}
    parents = torch.tensor([index.get(step.parents[i], -1) for i in nodes], dtype=torch.long)
    # a q the log rounded to 0 (below 5e-7) is a draft node all but never accepted, not a point mass
    probs = torch.tensor([[step.q[i] or LOGGED_ZERO] for i in nodes], dtype=torch.float64)  # [N, 1]: every token is 0
    return TokenTree(
        torch.zeros(len(nodes), dtype=torch.long), parents, probs, torch.zeros(len(nodes), dtype=torch.bool)
    )


class Pricer:
    """Seconds of a replayed step under ``profile`` for a ``kind`` drafter."""

    def __init__(self, profile: Profile, kind: str):
        self.profile, self.kind = profile, kind
        self.tree_verify = profile.tree_verify or profile.verify
        self.plain = profile.plain_step()

    def chain(self, gamma: int) -> float:
        p = self.profile
        return p.host_chain + gamma * p.draft_forward(self.kind, 1) + p.verify(gamma + 1)

    def tree(self, levels: int, width: int, sent: int) -> float:
        p = self.profile
        host = p.host_tree(sent) if p.host_tree is not None else p.host_chain
        draft = p.draft_forward(self.kind, 1) + max(0, levels - 1) * p.draft_forward(self.kind, width)
        return host + draft + self.tree_verify(sent + 1)


Policy = Callable[[LoggedTree], tuple[int, float]]  # a step -> (emitted tokens, seconds)


def chain_policy(pricer: Pricer, gamma: int) -> Policy:
    return lambda s: (accepted(s, set(s.main[:gamma])) + 1, pricer.chain(min(gamma, len(s.main))))


def tree_policy(pricer: Pricer, topk: int, depth: int, n: Optional[int] = None) -> Policy:
    def step(s: LoggedTree) -> tuple[int, float]:
        grown = shape(s, topk, depth)
        sent = set(grown) if n is None else best(s, grown, n)
        levels = min(depth, max(s.depths))
        return accepted(s, sent) + 1, pricer.tree(levels, topk, len(sent))

    return step


def auto_policy(
    pricer: Pricer,
    topk: int,
    depth: int,
    calibration_of: Optional[Callable[[LoggedTree], Optional[Calibration]]] = None,
) -> Policy:
    """What ``tree: {topk, depth, nodes: auto}`` sends under the profile (``NodeBudget``, its rate
    carried from step to step as in a generation), valuing each step's nodes through
    ``calibration_of(step)`` (``pacer_core.trees.node_values``; None: raw probabilities)."""
    budget = NodeBudget(
        TreeConfig(topk=topk, depth=depth, nodes="auto"), "replay", pricer.profile.cost_model(pricer.kind)
    )

    def step(s: LoggedTree) -> tuple[int, float]:
        grown = shape(s, topk, depth)
        tree = _subtree(s, grown)
        table = calibration_of(s) if calibration_of is not None else None
        chosen = budget.select(tree, None if table is None else node_values(tree, calibration=table))
        sent = set(grown) if chosen is None else {grown[i] for i in chosen}
        levels = min(depth, max(s.depths))
        return accepted(s, sent) + 1, pricer.tree(levels, topk, len(sent))

    return step


def fit_calibration(
    steps: Sequence[LoggedTree], bins: int = 12, max_depth: int = 6, draft: Optional[str] = None, source: str = ""
) -> Calibration:
    """P(a node is accepted | its depth, its cumulative draft probability), read off logged trees
    (``pacer_core.calibration.fit``: per depth, ``max_depth`` and deeper together, equal groups by
    probability, each group's acceptance rate made non-decreasing)."""

    def samples():
        for s in steps:
            path = set(s.path)
            for i, (d, c) in enumerate(zip(s.depths, s.cumulative)):
                yield d, c, i in path

    return calibrations.fit(samples(), bins=bins, max_depth=max_depth, draft=draft, source=source)


def calibrated_auto_policy(pricer: Pricer, topk: int, depth: int, steps: Sequence[LoggedTree]) -> Policy:
    """``auto`` valuing nodes by calibrated acceptance instead of the raw cumulative probability,
    each step's calibration fitted on the other prompts' steps (two folds by prompt)."""
    prompts = sorted({s.prompt for s in steps})
    fold = {p: i % 2 for i, p in enumerate(prompts)}
    tables = {f: fit_calibration([s for s in steps if fold[s.prompt] != f]) for f in (0, 1)}
    return auto_policy(pricer, topk, depth, lambda s: tables[fold[s.prompt]])


def oracle_chain(pricer: Pricer, longest: int) -> Policy:
    def step(s: LoggedTree) -> tuple[int, float]:
        a = accepted(s, set(s.main[:longest]))
        return a + 1, pricer.chain(a)

    return step


def oracle_tree(pricer: Pricer, topk: int) -> Policy:
    def step(s: LoggedTree) -> tuple[int, float]:
        a = len(s.path)
        return a + 1, pricer.tree(min(a + 1, max(s.depths)), topk, a)

    return step


def run(policy: Policy, steps: Sequence[LoggedTree], plain: float) -> dict[str, float]:
    emitted = seconds = 0.0
    for s in steps:
        e, t = policy(s)
        emitted, seconds = emitted + e, seconds + t
    return {"tau": emitted / len(steps), "speedup": emitted / seconds * plain if seconds > 0 else 0.0}


AUTO_FILE = "auto with the calibration"  # the family priced with a given calibration file


def replay_shapes(
    steps: Sequence[LoggedTree],
    profile: Profile,
    kind: str = "feature",
    budgets: Sequence[int] = (8, 10, 16, 24, 32, 48, 64),
    calibration: Optional[Calibration] = None,
) -> dict[str, Any]:
    """Every chain, tree shape and budget, auto and the oracles on the logged steps under
    ``profile``, per prompt set and ``all``: {policy: {set: {tau, speedup}}} and the best of each
    family; with ``calibration``, ``auto`` valuing nodes through it too (as the engine would)."""
    if not steps:
        raise ValueError("no logged tree steps")
    log_topk = max(sum(1 for d in s.depths if d == 1) for s in steps)
    log_depth = max(max(s.depths) for s in steps)
    pricer = Pricer(profile, kind)
    policies: dict[str, tuple[str, Optional[Policy]]] = {}
    shapes: dict[str, tuple[int, int]] = {}  # an auto row's (topk, depth): built per group, it carries a rate
    for gamma in range(1, log_depth + 1):
        policies[f"chain γ={gamma}"] = ("chain", chain_policy(pricer, gamma))
    topks = sorted({k for k in (2, 4, 6, 8, 10, log_topk) if 2 <= k <= log_topk})
    depths = sorted({d for d in (2, 3, 4, 6, 8, log_depth) if 2 <= d <= log_depth})
    for topk in topks:
        for depth in depths:
            policies[f"tree k{topk} d{depth} all"] = ("tree", tree_policy(pricer, topk, depth))
            for n in budgets:
                if n < topk * depth:
                    policies[f"tree k{topk} d{depth} best {n}"] = ("tree", tree_policy(pricer, topk, depth, n))
    autos = (
        ["auto"]
        + (["auto calibrated"] if len({s.prompt for s in steps}) >= 2 else [])
        + ([AUTO_FILE] if calibration is not None else [])
    )
    for family in autos:
        for topk in topks:
            for depth in depths:
                name = f"{family} k{topk} d{depth}"
                policies[name], shapes[name] = (family, None), (topk, depth)
    policies[f"oracle chain (γ ≤ {log_depth})"] = ("oracle", oracle_chain(pricer, log_depth))
    policies["oracle tree"] = ("oracle", oracle_tree(pricer, log_topk))
    groups = sorted({s.group for s in steps}) + ["all"]
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, (family, policy) in policies.items():
        table[name] = {}
        for group in groups:
            chosen = [s for s in steps if group == "all" or s.group == group]
            if family == "auto":
                policy = auto_policy(pricer, *shapes[name])
            elif family == "auto calibrated":
                policy = calibrated_auto_policy(pricer, *shapes[name], chosen)
            elif family == AUTO_FILE:
                policy = auto_policy(pricer, *shapes[name], lambda s: calibration)
            table[name][group] = run(policy, chosen, pricer.plain)
    families = {name: family for name, (family, _) in policies.items()}
    best_of = {
        family: max((n for n in table if families[n] == family), key=lambda n: table[n]["all"]["speedup"])
        for family in ("chain", "tree", *autos)
    }
    return {
        "profile": profile.name,
        "kind": profile.kind,
        "steps": len(steps),
        "logged_topk": log_topk,
        "logged_depth": log_depth,
        "table": table,
        "families": families,
        "best": best_of,
    }


def markdown(result: dict[str, Any], rows: Optional[Sequence[str]] = None) -> str:
    """The best chain, tree and auto rows (and ``rows``), per prompt set, labelled with the profile."""
    table = result["table"]
    groups = list(next(iter(table.values())))
    best = result["best"]
    names = list(
        dict.fromkeys(
            [
                best["chain"],
                best["tree"],
                best["auto"],
                *(v for k, v in best.items() if k not in ("chain", "tree", "auto")),
                *(rows or ()),
                *(n for n in table if n.startswith("oracle")),
            ]
        )
    )
    lines = [
        f"*predicted under {result['kind']} profile '{result['profile']}'* — {result['steps']} logged tree "
        f"steps (k{result['logged_topk']}, {result['logged_depth']} levels)",
        "",
        "| policy | τ | " + " | ".join(groups) + " |",
        "|---|---|" + "---|" * len(groups),
    ]
    for name in names:
        lines.append(
            f"| {name} | {table[name]['all']['tau']:.2f} | "
            + " | ".join(f"{table[name][g]['speedup']:.2f}×" for g in groups)
            + " |"
        )
    chain, tree, auto = (table[best[f]]["all"]["speedup"] for f in ("chain", "tree", "auto"))
    lines += [
        "",
        f"best tree ÷ best chain: {tree / chain:.3f}; auto ÷ best fixed tree budget: {auto / tree:.3f}; "
        f"auto ÷ best chain: {auto / chain:.3f}",
    ]
    if "auto calibrated" in best:
        cal = table[best["auto calibrated"]]["all"]["speedup"]
        lines[-1] += f"; auto calibrated (fitted on the other prompts) ÷ best fixed tree budget: {cal / tree:.3f}"
    if AUTO_FILE in best:
        given = table[best[AUTO_FILE]]["all"]["speedup"]
        lines[-1] += f"; {AUTO_FILE} ÷ best fixed tree budget: {given / tree:.3f}"
    return "\n".join(lines) + "\n"
