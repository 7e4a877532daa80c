"""Our first draft after each prefix of a decoded output, beside vLLM's (scripts/serve_probe_vllm.py).

For each prompt and each j below ``--contexts``: our engine prefills the prompt followed by the first j
tokens of the prompt's decoded output, with the exported dflash draft as the serving check runs it
(``pacer_bench.serveexports.served_stack``: no context prior, its draft length), and records how many
of its first draft's tokens were accepted and the gap between the two largest logits at each position
of that draft. With ``--vllm`` (serve_probe_vllm.py's JSON) it prints the prefixes whose accepted counts
differ, with our gaps there: a gap far above float rounding where the engines differ says the two
compute different draft distributions, not a near tie.

    .venv/bin/python scripts/serve_probe_ours.py --draft EXPORT --k 4 --prompts prompts.json \
        --tokens run.json --contexts 64 --vllm probe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", required=True, help="an exported dflash draft folder (pacer export)")
    parser.add_argument("--k", type=int, default=4, help="draft length (default 4)")
    parser.add_argument("--prompts", required=True, help="JSON: a list of prompts, each a list of token ids")
    parser.add_argument("--tokens", required=True, help="JSON with 'tokens': each prompt's decoded output")
    parser.add_argument("--contexts", type=int, default=64, help="prefixes per prompt (default 64)")
    parser.add_argument("--vllm", help="serve_probe_vllm.py's JSON, to compare with")
    args = parser.parse_args()

    from pacer_bench.serveexports import served_stack
    from pacer_core.config import load_plan
    from pacer_core.engine import Engine, load_stack_draft
    from pacer_core.hf.loading import load_model
    from pacer_plugins.block_draft.drafter import DFlashDrafter

    prompts = json.loads(Path(args.prompts).read_text())
    outputs = json.loads(Path(args.tokens).read_text())["tokens"]
    export = Path(args.draft)
    served = served_stack("dflash", json.loads((export / "config.json").read_text()), export, export.parent, args.k)
    assert served is not None  # the check compares every dflash export
    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    plan = load_plan(overrides=["target.dtype=float32", *served.stack])
    engine = Engine.build(target, draft=load_stack_draft(plan, tokenizer), tokenizer=tokenizer, plan=plan)
    gaps: list[list[float]] = []
    forward = DFlashDrafter._forward

    def watched(self, committed, known):  # the gap between each position's two largest logits
        logits, hidden = forward(self, committed, known)
        top = logits.double().topk(2, -1).values
        gaps.append([round(float(a - b), 3) for a, b in top.tolist()])
        return logits, hidden

    DFlashDrafter._forward = watched
    ours = []
    for prompt, output in zip(prompts, outputs):
        row = []
        for j in range(min(args.contexts, len(output))):
            gaps.clear()
            metrics = engine.generate(prompt + output[:j], max_new_tokens=2 + served.k).metrics
            accepted = metrics["accepted_per_step"][1] if len(metrics["accepted_per_step"]) > 1 else 0
            row.append((accepted, gaps[0] if gaps else []))
        ours.append(row)
    if args.vllm:
        theirs = json.loads(Path(args.vllm).read_text())
        differ = 0
        for p, (mine, other) in enumerate(zip(ours, theirs)):
            for j, ((accepted, gap), (_, vllm_accepted)) in enumerate(zip(mine, other)):
                if accepted != vllm_accepted:
                    differ += 1
                    print(f"prompt {p} prefix {j}: accepted ours {accepted}, vLLM {vllm_accepted}; top-2 gaps {gap}")
        print(f"{differ} of {sum(len(r) for r in ours)} prefixes differ")
    else:
        print(json.dumps([[a for a, _ in row] for row in ours]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
