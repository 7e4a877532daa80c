"""Is the draft's vocabulary what holds it back? One feature draft's weights scored against other heads.

A `feature` draft's head is the target's output layer restricted to a subset of the vocabulary, so
the same predicted features can be scored against any set of the target's rows without training.
This probe takes the target's answers that `pacer draft-eval` cached (``answers.json``) and, for
each head, reports like draft-eval the top-1 agreement at draft position 1, τ at γ = 4, and, for
sampling at temperature 1, the expected acceptance of the first draft token, Σ min(p, q):

    python scripts/head_vocab_probe.py runs/draft-eval-ctx/answers.json --draft shipped \
        --heads subset,context,corpus:16384,full --bias 0,0.5,1 --lookup 0,2:4:4 --out runs/head-vocab.json

Heads: ``subset`` (the draft's own), ``context`` (the subset and the tokens of the sequence up to
the row, as the `eagle` drafter's ``context_vocab``), ``corpus:N`` (the N most frequent tokens of the
committed self-distillation corpora), ``full`` (the whole vocabulary). For the ``context`` head,
``--bias`` adds a bonus to the logits of the tokens already in the sequence (the drafter's
``context_bias``; 0 = none) and ``--lookup`` the n-gram successor priors (``lookup_bias`` b_1:b_2:…,
0 = none; `pacer draft-eval`'s ``add_lookup_bonus``), every combination of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

SETS_ALL = "all"
DEPTH = 4
CORPORA = ("plugins/eagle/corpus", "plugins/eagle/corpus-open")


@torch.no_grad()
def score_sequence(
    net,
    embed,
    head_full,
    tokens,
    feats,
    first: int,
    heads: dict[str, Optional[torch.Tensor]],
    biases: Sequence[float],
    lookups: Sequence[tuple[float, ...]] = ((),),
) -> dict[tuple[str, float, tuple[float, ...]], tuple[torch.Tensor, torch.Tensor]]:
    """For each (head, bias, lookup): (chain_hits [rows, DEPTH] of the answer rows, Σ min(p, q) at
    position 1 [rows]). ``heads``: name → [vocab] bool of the ids the head holds, None for ``context``
    (the draft's subset and the tokens seen; the only head the priors apply to). feats [L, d]: the
    target's last-layer states."""
    from pacer_plugins.eagle.agreement import add_lookup_bonus, chain_hits, context_columns
    from pacer_plugins.eagle.features import target_greedy
    from pacer_plugins.eagle.model import draft_logits
    from pacer_plugins.eagle.students import unrolled_features

    vocab = head_full.shape[0]
    target_next = target_greedy(feats[None], head_full)[0]
    steps = unrolled_features(net, embed, tokens[None], feats[None, :-1], DEPTH)
    logits = [draft_logits(net, step[0], head_full) for step in steps]  # [L-1, vocab] per position
    seen = context_columns(torch.arange(vocab), tokens, False)[2]  # [L-1, vocab]: row t has read x_0..x_{t+1}
    own = torch.zeros(vocab, dtype=torch.bool)
    own[net.subset] = True
    rows = len(tokens) - 1
    target_p = torch.softmax(feats[first + 1 : rows] @ head_full.T, -1)  # the target's p for rows first..rows-2
    out = {}
    for name, holds in heads.items():
        allowed = own[None] | seen if holds is None else holds[None].expand(rows, vocab)
        for bias in biases if holds is None else [0.0]:
            for lookup in lookups if holds is None else [()]:
                biased = [step + bias * seen for step in logits]
                if lookup:
                    add_lookup_bonus(biased, torch.arange(vocab), tokens.tolist(), first, lookup)
                masked = [step.masked_fill(~allowed, float("-inf")) for step in biased]
                hits = chain_hits(masked, torch.arange(vocab), target_next, first, (1,))
                q = torch.softmax(masked[0][first : rows - 1], -1)
                out[(name, bias, tuple(lookup))] = (hits[hits[:, 0] >= 0], torch.minimum(target_p, q).sum(-1))
    return out


def corpus_frequent(size: int, vocab: int) -> torch.Tensor:
    from safetensors.torch import load_file

    counts = torch.zeros(vocab, dtype=torch.long)
    for folder in CORPORA:
        for shard in sorted(Path(folder).glob("shard-*.safetensors")):
            counts += torch.bincount(load_file(str(shard))["tokens"].to(torch.long), minlength=vocab)
    holds = torch.zeros(vocab, dtype=torch.bool)
    holds[torch.argsort(counts, descending=True, stable=True)[:size]] = True
    return holds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "answers",
        help="answers.json that `pacer draft-eval` cached, or a `pacer train-preverify` "
        "run folder (its simulated items' prompts and answers)",
    )
    parser.add_argument("--every", type=int, default=1, help="of a run folder's items, every N-th")
    parser.add_argument("--draft", default="shipped", help="a `feature` draft folder; shipped = the default")
    parser.add_argument("--heads", default="subset,context,full")
    parser.add_argument("--bias", default="0", help="comma-separated copy biases for the context head")
    parser.add_argument(
        "--lookup", default="0", help="comma-separated lookup priors b_1:b_2:... for the context head; 0 = none"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the table as JSON here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pacer_core.hf import load_section
    from pacer_plugins.eagle.agreement import DraftEvalConfig, draft_folder, summarize
    from pacer_plugins.eagle.model import Eagle3Draft, load_draft
    from pacer_train.students import target_states

    answers = Path(args.answers)
    if answers.is_dir() and (answers / "samples").is_dir():
        records = [
            {"set": item["source"], "prompt": list(item["prompt"]), "answer": list(item["generated"])}
            for item in (
                torch.load(f, weights_only=True) for f in sorted((answers / "samples").glob("item_*.pt"))[:: args.every]
            )
        ]
    elif answers.is_file():
        records = json.loads(answers.read_text())["records"]
    else:
        print(
            f"error: {answers} is neither answers.json (run `pacer draft-eval` first, it caches one) nor a "
            "`pacer train-preverify` run folder",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    target, _, _ = load_section(DraftEvalConfig().target, "target")
    embed, head_full = (w.float() for w in target.embedding_weights())
    net = load_draft(draft_folder(args.draft))
    if isinstance(net, Eagle3Draft):
        print("error: an eagle3 draft has its own head: this probe scores `feature` drafts", file=sys.stderr)
        return 2
    vocab = head_full.shape[0]
    heads: dict[str, Optional[torch.Tensor]] = {}
    for name in args.heads.split(","):
        if name == "subset":
            heads[name] = torch.zeros(vocab, dtype=torch.bool)
            heads[name][net.subset] = True
            heads[name][list(target.eos_token_ids)] = True
        elif name == "context":
            heads[name] = None
        elif name == "full":
            heads[name] = torch.ones(vocab, dtype=torch.bool)
        elif name.startswith("corpus:") and name[7:].isdigit():
            heads[name] = corpus_frequent(int(name[7:]), vocab)
        else:
            print(f"error: unknown head '{name}': use subset, context, corpus:N or full", file=sys.stderr)
            return 2
    biases = [float(b) for b in args.bias.split(",")]
    lookups = [
        () if item.strip() == "0" else tuple(float(b) for b in item.split(":")) for item in args.lookup.split(",")
    ]
    tallies: dict[tuple, list] = {}
    for number, r in enumerate(records, start=1):
        tokens = torch.tensor(r["prompt"] + r["answer"], dtype=torch.long)
        feats = target_states(target, tokens[None], [None])[0][0].float()
        for key, (hits, accept) in score_sequence(
            net, embed, head_full, tokens, feats, len(r["prompt"]) - 1, heads, biases, lookups
        ).items():
            tallies.setdefault((*key, r["set"]), []).append((hits, accept))
        print(f"\rsequences: {number}/{len(records)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    sets = list(dict.fromkeys(r["set"] for r in records))
    table = []
    for name, bias, lookup in dict.fromkeys(k[:3] for k in tallies):
        row = {"head": name, "bias": bias, "lookup": list(lookup)}
        for s in sets + [SETS_ALL]:
            parts = [x for ss in (sets if s == SETS_ALL else [s]) for x in tallies[(name, bias, lookup, ss)]]
            summary = summarize(torch.cat([h for h, _ in parts]), (1,))
            row[s] = {
                "top1": summary["positions"][0]["top1"],
                "tau": summary["tau"],
                "accept_t1": float(torch.cat([a for _, a in parts]).mean()),
            }
        table.append(row)
    print("| head | bias | lookup | " + " | ".join(sets + [SETS_ALL]) + " |")
    print("|---|---|---|" + "---|" * (len(sets) + 1))
    for row in table:
        lookup = ":".join(f"{b:g}" for b in row["lookup"]) or "0"
        print(
            f"| {row['head']} | {row['bias']:g} | {lookup} | "
            + " | ".join(
                f"{row[s]['top1']:.3f} / {row[s]['tau']:.3f} / {row[s]['accept_t1']:.3f}" for s in sets + [SETS_ALL]
            )
            + " |"
        )
    print("(position 1 top-1 / τ at γ = 4 / Σ min(p, q) at position 1, temperature 1)")
    if args.out:
        Path(args.out).write_text(json.dumps({"answers": str(answers), "draft": args.draft, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
