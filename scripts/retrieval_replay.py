"""How far model-free sources would draft the target's own greedy text: a noise-free replay.

The target answers each prompt greedily once (batched; the answers are cached in --out, so a rerun
only replays). Then, at every position of every answer, each source proposes its continuations of
the prompt and the answer so far, and the replay counts how many tokens of the true continuation
the best of them matches (at most --max-phrase): what that source would get accepted there as a
tree of its phrases, with no model drafting beside it and no cost counted. Sources: prompt lookup
(the context itself), the datastore over a corpus alone (--branches phrases) and the two together.

    python scripts/retrieval_replay.py --corpus shipped --skip 4 --limit 16 --out runs/retrieval-replay.json

It prints, per prompt set and source, the mean tokens matched per position and the share of
positions where at least one token matches.
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
    p.add_argument("--corpus", default="shipped", help="the datastore's corpus (docs/config.md#datastore-drafter)")
    p.add_argument("--sets", nargs="+", default=["humaneval", "gsm8k", "mtbench", "summarization"])
    p.add_argument("--skip", type=int, default=4, help="prompts left out at the start of each set (the bench's)")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-phrase", type=int, default=8)
    p.add_argument("--branches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default="runs/retrieval-replay.json", help="the target's answers, cached")
    a = p.parse_args()

    from pacer_bench.prompts import load_prompts, turn_ids
    from pacer_core import Resources, SamplingParams
    from pacer_core.hf import greedy_batch
    from pacer_core.hf.loading import load_model
    from pacer_plugins.datastore.plugin import Datastore, DatastoreConfig
    from pacer_plugins.pacer_builtins.drafters import lookup_continuation

    target, tokenizer, digest = load_model(None, a.dtype, "cpu", None, "target")
    out = Path(a.out)
    cached = json.loads(out.read_text()) if out.exists() else {}
    key = f"{digest}/{a.dtype}/{a.skip}/{a.limit}/{a.max_new_tokens}"
    answers = cached.get(key, {})
    for name in a.sets:
        if name not in answers:
            prompts = [turn_ids(tokenizer, q, [], True) for q in load_prompts(name, limit=a.limit, skip=a.skip)]
            print(f"answering {len(prompts)} {name} prompts ...", file=sys.stderr, flush=True)
            answers[name] = [[q, r] for q, r in zip(prompts, greedy_batch(target, prompts, a.max_new_tokens, rows=8))]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({**cached, key: answers}))

    resources = Resources(target=target, draft=None, sampling=SamplingParams(), tokenizer=tokenizer)
    # one datastore per branch count, its earlier-generations store empty: the corpus alone
    stores = {b: Datastore(DatastoreConfig(corpus=a.corpus, max_tokens=0, branches=b), resources) for b in a.branches}
    eos = frozenset(int(t) for t in target.eos_token_ids)

    def matched(phrases: list[list[int]], truth: list[int]) -> int:
        best = 0
        for phrase in phrases:
            k = 0
            while k < min(len(phrase), len(truth)) and phrase[k] == truth[k]:
                k += 1
            best = max(best, k)
        return best

    sources = ["prompt lookup"] + [f"corpus b{b}" for b in a.branches] + [f"lookup + corpus b{b}" for b in a.branches]
    print("| set | positions | " + " | ".join(sources) + " |")
    print("|---|---|" + "---|" * len(sources))
    for name in a.sets:
        got = {s: [] for s in sources}
        for prompt, answer in answers[name]:
            for t in range(len(answer)):
                context, truth = prompt + answer[:t], answer[t : t + a.max_phrase]
                lookup = lookup_continuation(torch.tensor(context), 3, 1, a.max_phrase).tolist()
                got["prompt lookup"].append(matched([lookup], truth))
                for b in a.branches:
                    found = stores[b].phrases(context, a.max_phrase, eos, search_context=False)
                    got[f"corpus b{b}"].append(matched(found, truth))
                    got[f"lookup + corpus b{b}"].append(matched([lookup] + found, truth))
        cells = [f"{np.mean(v):.2f} ({np.mean(np.array(v) >= 1):.0%})" for v in got.values()]
        print(f"| {name} | {len(got['prompt lookup'])} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
