"""``pacer demo``: the main job — plain decoding vs speculative decoding on the embedded target.

One process, one loaded target, real prompts; each prompt is decoded by every stack in turn
(interleaved, so machine drift hits all alike). Prints per prompt whether each stack's output is
identical to plain decoding and its speedup (tokens/s ratio), then the totals.
"""

from __future__ import annotations

import sys

from pacer_core.config import check, load_config
from pacer_core.engine import Engine, load_stack_draft
from pacer_core.errors import InputError, PacerError

from .prompts import load_prompts

DEMO_STACKS = {
    "prompt_lookup+fixed(4)": ["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 4}]"],
    # the shipped drafts: feature-level (plugins/feature_draft) and token-level (plugins/pacer_builtins)
    "draft(eagle)+fixed(2)": ["strategy.drafter={name: eagle}", "strategy.stop=[{name: fixed, gamma: 2}]"],
    "draft(eagle)+pacer": ["strategy.drafter={name: eagle}", "strategy.stop=[{name: pacer}]"],
    "draft(token)+fixed(2)": ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 2}]"],
}
# real prompts, taken in turn from these sets: an edit that copies its input, then held-out tasks
DEMO_SETS = ("code_editing", "gsm8k", "mtbench", "humaneval")


def demo_prompts(count: int) -> list:
    """``count`` prompts, the first of each of ``DEMO_SETS`` in turn, then the second of each, ..."""
    per_set = -(-count // len(DEMO_SETS))
    sets = [load_prompts(name, per_set) for name in DEMO_SETS]
    return [prompt for row in zip(*sets) for prompt in row][:count]


def run_demo(count: int = 4, max_new_tokens: int = 128, dtype: str = "float32") -> int:
    """Decode ``count`` real prompts with plain decoding and every demo stack; print per prompt and
    totals. Exit code 1 when a float32 stack's output differs from plain decoding."""
    from pacer_core.hf import load_model

    if count <= 0 or max_new_tokens <= 0:
        raise InputError("--prompts and --max-new-tokens must be positive")
    print(f"loading the embedded target (SmolLM2-135M-Instruct, {dtype}) ...", file=sys.stderr)
    target, tokenizer, _ = load_model(None, dtype, "cpu", None, "target")
    if target.packed_weights:
        print("weights packed once for CPU products (pacer_core/kernels.py)", file=sys.stderr)
    base = [f"generation.max_new_tokens={max_new_tokens}"]
    plain = Engine.build(target, tokenizer=tokenizer, cfg=load_config(
        overrides=base + ["strategy.drafter={name: autoregressive}", "strategy.stop=[]"]))
    stacks, drafts = {}, {}
    for name, overrides in DEMO_STACKS.items():
        try:
            cfg = load_config(overrides=base + [f"target.dtype={dtype}"] + overrides)
            draft = load_stack_draft(cfg, check(cfg), tokenizer, drafts)  # each draft loaded once
            stacks[name] = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=cfg)
        except PacerError as exc:  # a plugin or its artifact is not installed: say so, go on
            print(f"skipping {name}: {exc}", file=sys.stderr)
    prompts = demo_prompts(count)
    plain.generate("Say hi.", max_new_tokens=4)  # warm-up
    totals = {name: [0, 0.0, 0, 0.0, 0] for name in stacks}  # plain tokens, s; stack tokens, s; identical
    print(f"{len(prompts)} prompts ({', '.join(DEMO_SETS[:len(prompts)])}), greedy, {dtype}, "
          f"up to {max_new_tokens} new tokens")
    for prompt in prompts:
        reference = plain.generate(prompt.text)
        line = [f"{prompt.question_id}: {len(reference.tokens)} tokens, plain "
                f"{reference.metrics['tokens_per_s']:.1f} tok/s"]
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
    return 0 if exact or dtype != "float32" else 1

