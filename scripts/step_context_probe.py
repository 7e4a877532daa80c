"""Does the target's own context say more about the next draft's acceptance than the draft does?

PACER's M_B reads the draft (its hidden states and confidence). Before a step drafts, the engine
also knows the target's distribution of the token it just committed (the last verified row) and
how the previous step went. This probe asks whether those signals rank the draft's tokens better
than the draft's cumulative confidence alone, per draft position and in a replay of the throughput
rule:

    python scripts/step_context_probe.py record runs/step-context.json --first 20 --limit 8
    python scripts/step_context_probe.py analyse runs/step-context.json

``record`` decodes prompts `--first` .. `--first + --limit` of each benchmark set (beyond what the
bench and `pacer draft-eval` use) with eagle + fixed(8), greedy, fp32, and keeps per step: the
draft's log q(x_i), entropy and top probability at each position, the accepted count, and the step
context: the target's top probability and entropy at the row that produced the last committed
token, the previous step's accepted and drafted counts and whether it ended with a bonus token. It
saves after every prompt and a rerun skips the prompts already recorded.

``analyse`` fits logistic models per draft token (4-fold cross-validation over prompts): the
draft's features (cumulative log q, log q, entropy, log top probability, position) with and
without the step context, and prints per draft position the AUC of the cumulative confidence and
of both models; then replays the throughput rule (Dinkelbach: each step drafts the n that
maximises 1 + Σ_{i≤n} p_i − λ · cost(n), λ the running throughput, iterated to its fixed point)
with each predictor (and, as an optimistic bound for any rule over the draft's confidence, that
confidence calibrated per position on the very steps replayed), beside the best fixed window and
the oracle, on the cost model
`--verify-ms` (target forward over 1, 2, … tokens) and `--draft-ms` (a draft token).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

import torch

SETS = ("humaneval", "gsm8k", "mtbench", "summarization")
DEPTH = 8
BF16_AMX_VERIFY_MS = "54.7,60.8,61.5,62.0,62.5,63.0,63.5,64.0,64.3"  # the v5 goals run's probe, k = 1..9


def record(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import attrs

    from pacer_bench.prompts import load_prompts
    from pacer_core import Component, Engine, hookimpl, load_plan
    from pacer_plugins.entropy_stop.rules import entropy

    out = Path(args.out)
    rows = json.loads(out.read_text()) if out.exists() else []
    done = {r["prompt"] for r in rows}

    @attrs.define
    class ProbeConfig:
        pass

    class Probe:
        def __init__(self, config, resources):
            self.prompt, self.previous = None, None

        @hookimpl
        def pacer_start(self, state) -> None:
            self.previous = None

        @hookimpl
        def pacer_observe_step(self, state, step) -> None:
            draft = step.draft
            if len(draft) and draft.draft_probs is not None and self.previous is not None:
                q = draft.draft_probs.float()  # [n, vocab]
                chosen = q.gather(1, draft.tokens[:, None])[:, 0].clamp_min(1e-12)
                rows.append(
                    {
                        "prompt": self.prompt,
                        "n": len(draft),
                        "accepted": step.verdict.accepted,
                        "log_q": chosen.log().tolist(),
                        "entropy": entropy(q).tolist(),
                        "log_top": q.max(-1).values.clamp_min(1e-12).log().tolist(),
                        "context": self.previous,
                    }
                )
            p = torch.softmax(step.target_logits[step.verdict.accepted].float(), -1)
            self.previous = {
                "target_top": float(p.max()),
                "target_entropy": float(entropy(p)),
                "accepted": step.verdict.accepted,
                "drafted": len(draft),
                "bonus": step.verdict.next_kind == "bonus",
            }

    probe = Probe(None, None)

    class Plugin:
        @hookimpl
        def pacer_components(self):
            return [Component("observer", "step_context_probe", ProbeConfig, lambda config, resources: probe)]

    plugin = Plugin()
    plan = load_plan(
        None,
        overrides=[
            "target.dtype=float32",
            "sampling.temperature=0",
            "strategy.drafter={name: eagle}",
            f"strategy.stop=[{{name: fixed, gamma: {DEPTH}}}]",
            "strategy.verifier={name: greedy}",
            "strategy.observers=[{name: step_context_probe}]",
        ],
        extra_plugins=[plugin],
    )
    engine = Engine.from_plan(plan)
    for name in SETS:
        prompts = load_prompts(name, limit=args.first + args.limit)[args.first :]
        for i, prompt in enumerate(prompts, start=args.first):
            probe.prompt = f"{name}/{i}"
            if probe.prompt in done:
                continue
            engine.generate(prompt.turns[0] if hasattr(prompt, "turns") else prompt.text, max_new_tokens=128)
            out.write_text(json.dumps(rows))
            print(f"{probe.prompt}: {len(rows)} steps recorded", flush=True)
    return 0


def features(row, i: int, context: bool) -> list[float]:
    f = [sum(row["log_q"][: i + 1]), row["log_q"][i], row["entropy"][i], row["log_top"][i], 1.0]
    f += [1.0 if j == i else 0.0 for j in range(DEPTH)]
    if context:
        c = row["context"]
        f += [
            math.log(max(c["target_top"], 1e-12)),
            c["target_entropy"],
            min(c["accepted"], DEPTH) / DEPTH,
            float(c["accepted"] == c["drafted"]),
            float(c["bonus"]),
        ]
    return f


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float = 1e-2):
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    w = torch.zeros(z.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=200)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + l2 * (w**2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return lambda x2: torch.sigmoid(((x2 - mean) / std) @ w.detach() + b.detach())


def cross_validated(rows, context: bool, folds: int = 4) -> list[list[float]]:
    """Per step, the predicted P(the first i + 1 draft tokens accepted) at each position, from a
    model fitted on the other folds' prompts."""
    prompts = sorted({r["prompt"] for r in rows})
    random.Random(0).shuffle(prompts)
    predictions: list = [None] * len(rows)
    for k in range(folds):
        held = set(prompts[k::folds])
        x, y = [], []
        for r in rows:
            if r["prompt"] not in held:
                for i in range(min(r["n"], DEPTH)):
                    x.append(features(r, i, context))
                    y.append(float(r["accepted"] > i))
        model = fit_logistic(torch.tensor(x), torch.tensor(y))
        for s, r in enumerate(rows):
            if r["prompt"] in held:
                predictions[s] = model(
                    torch.tensor([features(r, i, context) for i in range(min(r["n"], DEPTH))])
                ).tolist()
    return predictions


def hindsight_calibrated(rows, bins: int = 20) -> list[list[float]]:
    """An optimistic bound for any rule over the draft's cumulative confidence: per draft position,
    the steps split into ``bins`` equal-count bins of Π q, each predicted by its own bin's accepted
    rate, measured on these very steps."""
    out = [[0.0] * min(r["n"], DEPTH) for r in rows]
    for i in range(DEPTH):
        ids = sorted((s for s, r in enumerate(rows) if r["n"] > i), key=lambda s: sum(rows[s]["log_q"][: i + 1]))
        for b in range(bins):
            chunk = ids[b * len(ids) // bins : (b + 1) * len(ids) // bins]
            rate = sum(rows[s]["accepted"] > i for s in chunk) / max(1, len(chunk))
            for s in chunk:
                out[s][i] = rate
    return out


def throughput(rows, choose, cost, plain: float) -> float:
    """Simulated speedup over plain decoding of a rule choose(step, row, λ) → tokens to send."""
    rate = 1 / plain
    for _ in range(30):
        gained = spent = 0.0
        for s, r in enumerate(rows):
            n = choose(s, r, rate)
            gained += 1 + min(r["accepted"], n)
            spent += cost(n)
        rate = gained / spent
    return rate * plain


def analyse(args) -> int:
    from pacer_plugins.pacer_stop.metrics import roc_auc

    rows = json.loads(Path(args.path).read_text())
    verify = [float(v) for v in args.verify_ms.split(",")]
    if len(verify) < DEPTH + 1:
        raise SystemExit(f"--verify-ms needs {DEPTH + 1} costs (1 .. {DEPTH + 1} tokens), got {len(verify)}")
    cost = lambda n: verify[n] + n * args.draft_ms  # noqa: E731  (n drafted, n + 1 verified)
    base, with_context = cross_validated(rows, False), cross_validated(rows, True)
    print(f"{len(rows)} steps of {len(set(r['prompt'] for r in rows))} prompts")
    print("| position | steps | accepted | AUC: cumulative confidence | draft features | + step context |")
    print("|---|---|---|---|---|---|")
    for i in range(4):
        ids = [s for s, r in enumerate(rows) if r["n"] > i]
        y = torch.tensor([float(rows[s]["accepted"] > i) for s in ids])
        confidence = torch.tensor([sum(rows[s]["log_q"][: i + 1]) for s in ids])
        first, second = torch.tensor([base[s][i] for s in ids]), torch.tensor([with_context[s][i] for s in ids])
        print(
            f"| {i + 1} | {len(ids)} | {float(y.mean()):.3f} | {roc_auc(confidence, y):.3f} | "
            f"{roc_auc(first, y):.3f} | {roc_auc(second, y):.3f} |"
        )

    y = torch.tensor([float(r["accepted"] > 0) for r in rows])
    alone = {
        "target's top probability": lambda c: c["target_top"],
        "target's entropy (negated)": lambda c: -c["target_entropy"],
        "previous step's accepted count": lambda c: c["accepted"],
    }
    print(
        "\nAUC at draft position 1 of each step-context signal alone: "
        + ", ".join(
            f"{name} {roc_auc(torch.tensor([float(signal(r['context'])) for r in rows]), y):.3f}"
            for name, signal in alone.items()
        )
    )

    def rule(probabilities):
        def choose(s, r, rate):
            p = probabilities(s, r)
            values = [1 + sum(p[:n]) - rate * cost(n) for n in range(len(p) + 1)]
            return max(range(len(values)), key=values.__getitem__)

        return choose

    plain = verify[0]
    fixed = max((throughput(rows, lambda s, r, rate, g=g: min(g, r["n"]), cost, plain), g) for g in range(DEPTH + 1))
    oracle = throughput(rows, lambda s, r, rate: min(r["accepted"], DEPTH), cost, plain)
    print(f"\nbest fixed window {fixed[1]}: {fixed[0]:.3f}x; oracle {oracle:.3f}x")
    hindsight = hindsight_calibrated(rows)
    rules = {
        "cumulative confidence": lambda s, r: [math.exp(sum(r["log_q"][: i + 1])) for i in range(min(r["n"], DEPTH))],
        "cumulative confidence, calibrated with hindsight": lambda s, r: hindsight[s],
        "draft features": lambda s, r: base[s],
        "+ step context": lambda s, r: with_context[s],
    }
    for name, probabilities in rules.items():
        speedup = throughput(rows, rule(probabilities), cost, plain)
        print(
            f"throughput rule over {name}: {speedup:.3f}x, {(speedup - fixed[0]) / (oracle - fixed[0]):.0%} of the "
            "oracle's gain"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="decode prompts and keep each step's draft and context features")
    r.add_argument("out", help="the JSON file (resumed when it exists)")
    r.add_argument("--first", type=int, default=20, help="the first prompt of each set")
    r.add_argument("--limit", type=int, default=8, help="prompts of each set")
    a = sub.add_parser("analyse", help="per-position AUC and the throughput rule's replay")
    a.add_argument("path")
    a.add_argument("--verify-ms", default=BF16_AMX_VERIFY_MS, help="target forward over 1, 2, ... 9 tokens, ms")
    a.add_argument("--draft-ms", type=float, default=3.7, help="one draft token, ms")
    args = p.parse_args()
    return record(args) if args.command == "record" else analyse(args)


if __name__ == "__main__":
    sys.exit(main())
