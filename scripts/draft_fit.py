"""Held-out agreement and training fit of feature-level drafts on one `pacer distill` run's corpus.

For each draft, the top-1 agreement with the target's greedy token at draft positions 1 and 2 (as
`pacer distill` measures it at its checkpoints) on the run's held-out sequences (the first
--heldout) and on --train of its training sequences (drawn with seed 0): how well a draft fits
what it was trained on against what it was not, e.g. whether a larger draft fits better.

    python scripts/draft_fit.py runs/cont-1l plugins/eagle/default runs/cont-1l/draft runs/cont-2l/draft

Reads the run's corpus.pt and features.f16 (a run whose features stage finished); the target loads
in float32. Prints one line per draft and writes RUN/draft_fit.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a `pacer distill` run folder (out=) whose features stage finished")
    p.add_argument("drafts", nargs="+", help="feature-level draft folders `pacer distill` wrote")
    p.add_argument(
        "--heldout", type=int, default=24, help="the run's held-out sequences (its corpus.heldout_sequences)"
    )
    p.add_argument("--train", type=int, default=96, help="training sequences to measure the fit on")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    run = Path(args.run)
    for needed in ("corpus.pt", "features.f16", "features.done"):
        if not (run / needed).is_file():
            print(
                f"draft_fit: '{run / needed}' is missing: give a `pacer distill` run folder whose features stage "
                "finished",
                file=sys.stderr,
            )
            return 2
    for name in args.drafts:
        if not (Path(name) / "manifest.json").is_file():
            print(
                f"draft_fit: '{name}' is not a draft folder `pacer distill` wrote (no manifest.json)", file=sys.stderr
            )
            return 2
    from pacer_core.config import ModelConfig
    from pacer_core.hf import load_section
    from pacer_plugins.eagle.model import load_draft
    from pacer_plugins.eagle.students import evaluate

    torch.set_num_threads(args.threads)
    tokens = torch.load(run / "corpus.pt", weights_only=True)["tokens"]
    count, length = tokens.shape
    if int((run / "features.done").read_text().strip() or 0) < count or count < args.heldout + args.train:
        print(
            f"draft_fit: '{run}' has not finished its features, or holds fewer than --heldout + --train "
            f"({args.heldout + args.train}) sequences",
            file=sys.stderr,
        )
        return 2
    target, _, _ = load_section(ModelConfig(dtype="float32"), "target")
    embed, head = (w.float() for w in target.embedding_weights())
    features = np.memmap(run / "features.f16", dtype=np.float16, mode="r", shape=(count, length, target.hidden_size))
    rows = {
        "heldout": np.arange(args.heldout),
        "train": np.sort(np.random.default_rng(0).choice(np.arange(args.heldout, count), args.train, replace=False)),
    }
    results = {}
    for name in args.drafts:
        net = load_draft(Path(name))
        results[name] = {}
        for label, ids in rows.items():
            feats = torch.from_numpy(np.asarray(features[ids], dtype=np.float32))
            with torch.no_grad():
                results[name][label] = evaluate(net, embed, head, net.subset, tokens[ids], feats)
        shown = "; ".join(
            f"{label}: first {r['heldout_top1_first']:.4f}, second {r['heldout_top1_second']:.4f}"
            for label, r in results[name].items()
        )
        print(f"{name}: {shown}", flush=True)
    (run / "draft_fit.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
