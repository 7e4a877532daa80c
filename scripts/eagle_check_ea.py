"""The EAGLE side of the EAGLE check (scripts/eagle_check.py, docs/eagle-checkpoints.md#eagle-check):
SafeAILab/EAGLE's own code decodes the prompts greedily with an exported draft and target.

Runs with the check's own environment's Python (transformers 4.53, the CPU build of torch), never the
project's: it imports EAGLE's ``eagle.model.ea_model`` from the checkout ``--eagle`` names and nothing of
this project. For each prompt (token ids) it runs ``EaModel.eagenerate`` (EAGLE-2's dynamic tree over
the EAGLE-1 network, ``use_eagle3=False``, temperature 0) and ``EaModel.naivegenerate`` (the target
alone, one token a step, with EAGLE's KV cache), and writes one JSON object: the first
``max_new_tokens`` new tokens of each, and eagenerate's tokens and target forwards.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eagle", required=True, help="a SafeAILab/EAGLE checkout (holding eagle/model/ea_model.py)")
    p.add_argument("--target", required=True, help="the folder `pacer export-target` wrote")
    p.add_argument("--draft", required=True, help="the folder `pacer export DRAFT OUT --engine eagle` wrote")
    p.add_argument("--prompts", required=True, help="a JSON list of token-id lists")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--total-token", type=int, default=60, help="EAGLE-2's tree: tokens verified per step")
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args()

    import torch
    import transformers

    sys.path.insert(0, str(Path(args.eagle).resolve()))
    from eagle.model.ea_model import EaModel

    torch.set_num_threads(args.threads)
    start = time.process_time()
    model = EaModel.from_pretrained(
        use_eagle3=False,
        base_model_path=args.target,
        ea_model_path=args.draft,
        total_token=args.total_token,
        depth=args.depth,
        top_k=args.top_k,
        torch_dtype=torch.float32,
    )
    model.eval()
    result = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "rope_theta": getattr(model.base_model.config, "rope_theta", None),
        "tree": {"total_token": args.total_token, "depth": args.depth, "top_k": args.top_k},
        "eagle": [],
        "naive": [],
        "steps": [],
        "eagle_new_tokens": [],
    }
    for ids in json.loads(Path(args.prompts).read_text()):
        prompt = torch.tensor([ids], dtype=torch.long)
        output, new_tokens, steps = model.eagenerate(
            prompt, temperature=0.0, max_new_tokens=args.max_new_tokens, log=True
        )
        result["eagle"].append(output[0, len(ids) : len(ids) + args.max_new_tokens].tolist())
        result["eagle_new_tokens"].append(int(new_tokens))
        result["steps"].append(int(steps) + 1)  # target forwards after the prefill
        output = model.naivegenerate(prompt, temperature=0.0, max_new_tokens=args.max_new_tokens)
        result["naive"].append(output[0, len(ids) : len(ids) + args.max_new_tokens].tolist())
    result["cpu_seconds"] = time.process_time() - start
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
