"""``pacer demo``: the main job — plain decoding vs speculative decoding on the embedded target.

One process, one loaded target, real prompts; each prompt is decoded by every stack in turn
(interleaved, so machine drift hits all alike). Prints per prompt whether each stack's output is
identical to plain decoding and its speedup (tokens/s ratio), then the totals.
"""

from __future__ import annotations

import argparse
import sys

from .cli import Runner, command
from .config import load_config

DEMO_STACKS = {
    "prompt_lookup+fixed(4)": ["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 4}]"],
    # the shipped drafts: feature-level (plugins/feature_draft) and token-level (plugins/pacer_builtins)
    "draft(eagle)+fixed(1)": ["strategy.drafter={name: eagle}", "strategy.stop=[{name: fixed, gamma: 1}]"],
    "draft+ouroboros+fixed(4)": ["strategy.drafter={name: ouroboros, prompt_phrases: true, window_size: 4, "
                                 "guess_set_size: 4, level: 5, topk: 3}",
                                 "strategy.stop=[{name: fixed, gamma: 4}]", "strategy.verifier={name: greedy}"],
}


@command("demo", "the main job: plain decoding vs speculative decoding on the embedded target, real prompts")
def _setup_demo(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--prompts", type=int, default=3, help="how many code-editing prompts (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])

    def run(args: argparse.Namespace) -> int:
        from .config import check, draft_model_config
        from .engine import Engine
        from .errors import InputError, PacerError
        from .hf import load_draft, load_model
        from .prompts import load_prompts

        if args.prompts <= 0 or args.max_new_tokens <= 0:
            raise InputError("--prompts and --max-new-tokens must be positive")
        print(f"loading the embedded target (SmolLM2-135M-Instruct, {args.dtype}) ...", file=sys.stderr)
        target, tokenizer, _ = load_model(None, args.dtype, "cpu", None, "target")
        base = [f"generation.max_new_tokens={args.max_new_tokens}"]
        plain = Engine.build(target, tokenizer=tokenizer, cfg=load_config(
            overrides=base + ["strategy.drafter={name: autoregressive}", "strategy.stop=[]"]))
        stacks, drafts = {}, {}
        for name, overrides in DEMO_STACKS.items():
            try:
                cfg = load_config(overrides=base + [f"target.dtype={args.dtype}"] + overrides)
                drafter = check(cfg)[0].component
                draft = None
                if drafter.needs_draft_model:  # the shipped token-level draft, loaded once
                    d = draft_model_config(cfg, drafter)
                    if d.path not in drafts:
                        drafts[d.path] = load_draft(d.path, d.dtype, d.device, d.device_map, tokenizer)
                    draft = drafts[d.path]
                stacks[name] = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=cfg)
            except PacerError as exc:  # a plugin or its artifact is not installed: say so, go on
                print(f"skipping {name}: {exc}", file=sys.stderr)
        prompts = load_prompts("code_editing", args.prompts)
        plain.generate("Say hi.", max_new_tokens=4)  # warm-up
        totals = {name: [0, 0.0, 0, 0.0, 0] for name in stacks}  # plain tokens, s; stack tokens, s; identical
        print(f"{len(prompts)} code-editing prompts (HumanEval solutions), greedy, up to {args.max_new_tokens} new tokens")
        for prompt in prompts:
            reference = plain.generate(prompt.text)
            line = [f"{prompt.question_id}: {len(reference.tokens)} tokens, plain {reference.metrics['tokens_per_s']:.1f} tok/s"]
            for name, engine in stacks.items():
                result = engine.generate(prompt.text)
                same = result.tokens == reference.tokens
                speedup = result.metrics["tokens_per_s"] / reference.metrics["tokens_per_s"]
                t = totals[name]
                t[0] += len(reference.tokens)
                t[1] += reference.metrics["wall_s"]
                t[2] += len(result.tokens)
                t[3] += result.metrics["wall_s"]
                t[4] += int(same)
                line.append(f"{name} {speedup:.2f}x τ={result.metrics['mean_accepted_length']:.2f} "
                            f"{'identical' if same else 'DIFFERENT'}")
            print(" | ".join(line), flush=True)
        print()
        for name, (plain_n, plain_s, stack_n, stack_s, same) in totals.items():
            print(f"{name}: speedup {(stack_n / stack_s) / (plain_n / plain_s):.2f}x over plain decoding "
                  f"(tokens/s ratio); {same}/{len(prompts)} outputs identical to plain decoding")
        # greedy SD must equal plain decoding in fp32; bf16 may flip near-ties (docs/concepts.md)
        exact = all(t[4] == len(prompts) for t in totals.values())
        return 0 if exact or args.dtype != "float32" else 1

    return run
