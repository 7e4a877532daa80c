"""Which tree shape, and how many of its nodes, pays on this machine? A noise-free replay.

    python scripts/tree_replay.py record runs/tree-replay/steps.json
    python scripts/tree_replay.py costs runs/tree-replay/costs.json --base runs/tree-replay/base.json
    python scripts/tree_replay.py analyse runs/tree-replay/steps.json runs/tree-replay/costs.json

``record`` decodes held-out prompts (HumanEval, GSM8K and MT-Bench prompts 20–31, summarization
10–18: beyond the bench's and ``pacer draft-eval``'s) with the shipped ``eagle`` draft growing a
wide tree (``--topk`` 8, ``--depth`` 4 levels, every node sent), greedy, fp32, and keeps per step
each node's token, parent and draft probability q(token | parent), the main path and the accepted
path. It saves after every prompt; a rerun skips the prompts already recorded.

``costs`` measures, on an idle machine, the target's forward over 1..17 causal tokens and 2..33
tree-masked ones after ``--context`` cached tokens (median of ``--repeats``), beside the draft and
per-step costs of a ``pacer costs`` file (``--base``).

``analyse`` replays, on the same recorded steps, chains of γ = 1..4 (the main path), each tree
shape (``topk`` nodes a level from the recorded tree, ``depth`` levels) sending every node or its
best ``nodes`` by cumulative draft probability, a per-step cost rule (the n maximising
Σ P(accepted) − λ · cost(n), λ at its fixed point, P calibrated per depth on the other half of
the prompts), and the oracles. Greedy verification makes this exact: a shape's accepted path is
the recorded one's longest prefix among the nodes it sends. Speedups are over plain decoding
(one target forward per token) with the cost model's seconds; a tree level costs the recorded
median draft seconds per level.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SETS = {"humaneval": (20, 32), "gsm8k": (20, 32), "mtbench": (20, 32), "summarization": (10, 19)}


def record(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import attrs

    from pacer_bench.prompts import load_prompts
    from pacer_core import Component, Engine, hookimpl, load_config

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(out.read_text()) if out.exists() else []
    done = {r["prompt"] for r in rows}

    @attrs.define
    class NoConfig:
        pass

    class Recorder:
        prompt = None

        @hookimpl
        def pacer_observe_step(self, step) -> None:
            draft = step.draft
            if not draft.num_nodes:
                return
            tree = draft.tree
            q = tree.draft_probs.gather(1, tree.tokens[:, None])[:, 0]
            rows.append({"prompt": self.prompt, "tokens": tree.tokens.tolist(), "parents": tree.parents.tolist(),
                         "q": q.tolist(), "main": list(tree.main_path), "path": list(step.verdict.nodes(draft)),
                         "forwards": step.draft_forwards, "draft_s": step.draft_s - step.stop_s})

    recorder = Recorder()

    class Plugin:
        @hookimpl
        def pacer_components(self):
            return [Component("observer", "tree_replay", NoConfig, lambda config, resources: recorder)]

    plugin = Plugin()
    nodes = args.topk * args.depth
    cfg = load_config(None, overrides=[
        "target.dtype=float32", "sampling.temperature=0",
        f"strategy.drafter={{name: eagle, tree: {{topk: {args.topk}, depth: {args.depth}, nodes: {nodes}}}}}",
        f"strategy.stop=[{{name: fixed, gamma: {args.depth}}}]", "strategy.verifier={name: greedy}",
        "strategy.observers=[{name: tree_replay}]"], extra_plugins=[plugin])
    engine = Engine.from_config(cfg, extra_plugins=[plugin])
    for name, (first, end) in SETS.items():
        for i, prompt in enumerate(load_prompts(name, limit=end - first, skip=first), start=first):
            recorder.prompt = f"{name}/{i}"
            if recorder.prompt in done:
                continue
            engine.generate(prompt.text, max_new_tokens=128)
            out.write_text(json.dumps(rows))
            print(f"{recorder.prompt}: {len(rows)} steps recorded", flush=True)
    return 0


def costs(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pacer_bench.timing import device_of, make_clock, measure_verify_costs
    from pacer_core import Engine, load_config
    from pacer_stop.costs import PROBE_PROMPT

    base = json.loads(Path(args.base).read_text())
    cfg = load_config(None, overrides=["target.dtype=float32", "sampling.temperature=0",
                                       "strategy.drafter={name: eagle}", "strategy.stop=[{name: fixed, gamma: 3}]"])
    engine = Engine.from_config(cfg)
    clock = make_clock(device_of(engine.target))
    ks, tree_ks = list(range(1, 18)), list(range(2, 34))
    context = engine.encode(PROBE_PROMPT)
    context = (context * (args.context // len(context) + 1))[:args.context]  # a step's context, not a prompt's
    chain, tree = measure_verify_costs(engine.target, context, ks, args.repeats, clock, tree_ks)
    out = {"key": base.get("key"), "verify_s": chain, "tree_k": tree_ks, "tree_verify_s": tree,
           "draft_token_s": base["draft_token_s"], "step_s": base.get("step_s", 0.0)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("chain ms:", " ".join(f"{k}:{t * 1e3:.0f}" for k, t in zip(ks, chain)))
    print("tree ms: ", " ".join(f"{k}:{t * 1e3:.0f}" for k, t in zip(tree_ks, tree)))
    return 0


# -- analyse ---------------------------------------------------------------------------------------
def prepare(rows: list[dict]) -> None:
    for r in rows:
        n = len(r["tokens"])
        r["depth"], r["cp"] = [0] * n, [0.0] * n
        for i, p in enumerate(r["parents"]):
            r["depth"][i] = 1 if p < 0 else r["depth"][p] + 1
            r["cp"][i] = r["q"][i] * (1.0 if p < 0 else r["cp"][p])
        r["set"] = r["prompt"].split("/")[0]


def accepted(r: dict, sent: set) -> int:
    """Greedy: the recorded accepted path's longest prefix among the nodes sent."""
    a = 0
    for node in r["path"]:
        if node not in sent:
            break
        a += 1
    return a


def shape(r: dict, topk: int, depth: int) -> list[int]:
    """The nodes a tree of ``topk`` nodes a level and ``depth`` levels grows, read off the recorded
    wider tree: each level's main-path child, then the best others by cumulative probability."""
    kept: set[int] = set()
    main = set(r["main"])
    for level in range(1, depth + 1):
        nodes = [i for i in range(len(r["tokens"]))
                 if r["depth"][i] == level and (r["parents"][i] < 0 or r["parents"][i] in kept)]
        ranked = [i for i in nodes if i in main] + sorted((i for i in nodes if i not in main), key=lambda i: -r["cp"][i])
        kept |= set(ranked[:topk])
    return sorted(kept)


def best(r: dict, nodes: list[int], n: int, key: str = "cp") -> set:
    return set(sorted(nodes, key=lambda i: (-r[key][i], i))[:n])


def calibrate(rows: list[dict], bins: int = 12) -> None:
    """P(node on the accepted path | depth, cumulative probability): isotonic in bins, fitted on the
    other half of the prompts; never above the parent's."""
    from pacer_bench.oracle import monotone

    prompts = sorted({r["prompt"] for r in rows})
    half = {p: i % 2 for i, p in enumerate(prompts)}
    tables = {}
    for h in (0, 1):
        by = defaultdict(list)
        for r in rows:
            if half[r["prompt"]] != h:
                path = set(r["path"])
                for i in range(len(r["tokens"])):
                    by[min(r["depth"][i], 4)].append((r["cp"][i], i in path))
        table = {}
        for d, xs in by.items():
            xs.sort()
            size = max(1, len(xs) // bins)
            chunks = [xs[b:b + size] for b in range(0, len(xs), size)]
            values = monotone([sum(y for _, y in chunk) / len(chunk) for chunk in chunks])  # isotonic
            table[d] = [(chunk[-1][0], v) for chunk, v in zip(chunks, values)]
        tables[h] = table
    for r in rows:
        table = tables[half[r["prompt"]]]
        p = []
        for i, parent in enumerate(r["parents"]):
            edges = table[min(r["depth"][i], 4)]
            value = next((v for edge, v in edges if r["cp"][i] <= edge), edges[-1][1])
            p.append(min(value, p[parent]) if parent >= 0 else value)
        r["p"] = p


def analyse(args) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pacer_bench.oracle import cost_model

    rows = json.loads(Path(args.steps).read_text())
    cost = cost_model(json.loads(Path(args.costs).read_text()))
    prepare(rows)
    calibrate(rows)
    level_s = statistics.median(r["draft_s"] / max(r["forwards"], 1) for r in rows)
    plain = cost.step(0)

    def tree_step(r, sent, levels):
        return accepted(r, sent), cost.step_s + levels * level_s + cost.verify_tree(len(sent) + 1)

    def chain(g):
        return lambda r: (accepted(r, set(r["main"][:g])), cost.step_s + g * cost.draft_token_s + cost.verify(g + 1))

    def tree(topk, depth, n=None):
        def step(r):
            grown = shape(r, topk, depth)
            return tree_step(r, set(grown) if n is None else best(r, grown, n), min(depth, max(r["depth"])))
        return step

    def cost_rule(depth, lam):
        def step(r):
            grown = sorted(shape(r, 8, depth), key=lambda i: (-r["p"][i], i))
            levels = min(depth, max(r["depth"]))
            fixed = cost.step_s + levels * level_s
            value, chosen, gain = -lam * (fixed + cost.verify_tree(1)), 0, 0.0
            for n, node in enumerate(grown, start=1):
                gain += r["p"][node]
                v = gain - lam * (fixed + cost.verify_tree(n + 1))
                if v > value:
                    value, chosen = v, n
            return tree_step(r, set(grown[:chosen]), levels)
        return step

    def oracle_chain(r):
        a = accepted(r, set(r["main"][:4]))
        return a, cost.step_s + max(a, 1) * cost.draft_token_s + cost.verify(a + 1)

    def oracle_tree(r):
        a = len(r["path"])
        return a, cost.step_s + min(4, a + 1) * level_s + cost.verify_tree(a + 1)

    def replay(policy, only=None):
        emitted = seconds = 0.0
        for r in rows:
            if only is None or r["set"] == only:
                a, s = policy(r)
                emitted, seconds = emitted + a + 1, seconds + s
        return emitted / seconds * plain, emitted

    sets = list(SETS) + [None]
    print(f"{len(rows)} steps; plain {plain * 1e3:.1f} ms a token, chain draft token {cost.draft_token_s * 1e3:.2f} ms, "
          f"tree level {level_s * 1e3:.2f} ms")
    print(f"{'policy':36s} {'τ':>5s} " + " ".join(f"{(s or 'all')[:8]:>8s}" for s in sets))

    def line(name, policy):
        figures = [replay(policy, s) for s in sets]
        print(f"{name:36s} {figures[-1][1] / len(rows):5.2f} " + " ".join(f"{f[0]:7.3f}×" for f in figures))

    for g in (1, 2, 3, 4):
        line(f"chain γ={g}", chain(g))
    for topk, depth in ((4, 2), (4, 3), (6, 3), (8, 3), (6, 4), (8, 4)):
        line(f"topk {topk}, {depth} levels, all nodes", tree(topk, depth))
        for n in (6, 8, 10, 12, 16):
            if n < topk * depth:
                line(f"topk {topk}, {depth} levels, best {n}", tree(topk, depth, n))
    for depth in (2, 3, 4):
        lam = 1.0 / plain
        for _ in range(30):  # Dinkelbach: λ = the throughput the rule reaches with it
            lam = replay(cost_rule(depth, lam))[0] / plain
        line(f"cost rule, {depth} levels", cost_rule(depth, lam))
    line("oracle chain (γ ≤ 4)", oracle_chain)
    line("oracle tree (4 levels)", oracle_tree)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record", help="decode held-out prompts with a wide tree and keep every step")
    p.add_argument("out")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--depth", type=int, default=4)
    p.set_defaults(run=record)
    p = sub.add_parser("costs", help="measure chain and tree verification costs on an idle machine")
    p.add_argument("out")
    p.add_argument("--base", required=True, help="a `pacer costs` file for the draft and per-step costs")
    p.add_argument("--context", type=int, default=300, help="tokens already in the cache (300: a typical step's)")
    p.add_argument("--repeats", type=int, default=9, help="timings per token count; the median is kept (9)")
    p.set_defaults(run=costs)
    p = sub.add_parser("analyse", help="replay chains, tree shapes and node budgets on the recorded steps")
    p.add_argument("steps")
    p.add_argument("costs")
    p.set_defaults(run=analyse)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
