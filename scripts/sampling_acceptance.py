"""Acceptance of ``sample_match`` against ``speculative_sampling`` on the embedded pair, sampled
(τ and acceptance only, no timing), and whether each ``sample_match`` output is plain sampling's.

    python scripts/sampling_acceptance.py -c configs/pacer.yaml --per-set 2 --max-new-tokens 64

prints one JSON line per (temperature, verifier) and a table (docs/results.md quotes it).
"""

from __future__ import annotations

import argparse
import json

import torch

from pacer_bench.prompts import PROMPT_SETS
from pacer_core import Engine, load_config, load_plan
from pacer_core.hf import load_section


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", "-c", default="configs/pacer.yaml")
    p.add_argument("--sets", nargs="+", default=["humaneval", "gsm8k", "mtbench", "summarization"])
    p.add_argument("--per-set", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.7, 1.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides)
    target, tokenizer, _ = load_section(cfg.target, "target")
    prompts = [q.text for name in args.sets for q in PROMPT_SETS[name]()[: args.per_set]]
    rows = []
    for temperature in args.temperatures:
        sampled = [f"sampling.temperature={temperature}", "sampling.top_k=0", "sampling.top_p=1.0"]
        plain = Engine.build(
            target,
            tokenizer=tokenizer,
            plan=load_plan(
                None, sampled + ["strategy.drafter={name: autoregressive}", "strategy.stop=[]", "strategy.observers=[]"]
            ),
        )
        references = [plain.generate(text, args.max_new_tokens, seed=args.seed).tokens for text in prompts]
        for verifier in ("speculative_sampling", "sample_match"):
            plan = load_plan(args.config, args.overrides + sampled + [f"strategy.verifier={{name: {verifier}}}"])
            engine = Engine.build(target, tokenizer=tokenizer, plan=plan)
            drafted = accepted = emitted = steps = identical = 0
            for text, reference in zip(prompts, references):
                result = engine.generate(text, args.max_new_tokens, seed=args.seed)
                m = result.metrics
                drafted, accepted = drafted + m["drafted"], accepted + m["accepted"]  # the metrics observer's
                emitted, steps = emitted + len(result.tokens), steps + m["steps"]
                identical += result.tokens == reference
            row = {
                "temperature": temperature,
                "verifier": verifier,
                "prompts": len(prompts),
                "tau": round(emitted / steps, 3),
                "acceptance": round(accepted / max(drafted, 1), 3),
                "identical_to_plain": f"{identical}/{len(prompts)}",
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| T | verifier | prompts | τ | acceptance | identical to plain sampling |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['temperature']} | {r['verifier']} | {r['prompts']} | {r['tau']:.2f} | {r['acceptance']:.1%} "
            f"| {r['identical_to_plain']} |"
        )


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
