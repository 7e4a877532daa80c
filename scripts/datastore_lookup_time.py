"""Lookup time of the ``datastore`` drafter's index against its size (no models; CPU only).

For each size, a store of that many Zipf-distributed token ids (a 49,152-token vocabulary, the
embedded target's) in generations of 256 tokens is built the way a long run builds it, one
generation at a time (``TokenIndex.add``, with its run merges); then ``--lookups`` contexts are
drawn from the store itself (so most suffixes match) and ``Datastore.phrases``' matching is timed:
longest suffix from 4 tokens down to 2, up to 64 matches counted, 4 branches of 8 tokens.

    python scripts/datastore_lookup_time.py --sizes 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pacer_plugins.datastore.index import TokenIndex, context_matches, rank_continuations


def build(size: int, rng: np.random.Generator, vocab: int = 49152, doc: int = 256) -> tuple[TokenIndex, float]:
    index, added = TokenIndex(4), 0.0
    ids = np.minimum(rng.zipf(1.2, size), vocab) - 1  # [size] frequent ids small, as in text
    for start in range(0, size, doc):
        begin = time.perf_counter()
        index.add(ids[start : start + doc])
        added += time.perf_counter() - begin
    return index, added / max(1, size // doc)


def lookup(index: TokenIndex, context: np.ndarray, num_tokens: int = 8) -> list[list[int]]:
    """What ``Datastore.phrases`` does for one store (max_ngram 4, min_ngram 2, 64 matches, 4 branches)."""
    for n in range(4, 1, -1):
        found = [context[p + n : p + n + num_tokens].tolist() for p in context_matches(context, n)[:64]]
        suffix = context[len(context) - n :].tolist()
        found += [index.continuation(p + n, num_tokens) for p in index.find(suffix)[: 64 - len(found)]]
        found = [f for f in found if f]
        if found:
            return rank_continuations(found, 4)
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--context", type=int, default=512, help="tokens of the current context")
    args = parser.parse_args()
    print(f"{'tokens':>10} {'runs':>5} {'us/lookup':>10} {'hit rate':>9} {'ms/added generation':>20}")
    for size in args.sizes:
        rng = np.random.default_rng(0)
        index, add_s = build(size, rng)
        starts = rng.integers(0, len(index.tokens) - args.context, args.lookups)
        contexts = [index.tokens[s : s + args.context] for s in starts]
        contexts = [c[c >= 0] for c in contexts]  # separators out: a context is plain tokens
        hits, begin = 0, time.perf_counter()
        for context in contexts:
            hits += bool(lookup(index, context))
        per = (time.perf_counter() - begin) / len(contexts)
        print(f"{index.size:>10} {index.runs:>5} {per * 1e6:>10.1f} {hits / len(contexts):>9.2f} {add_s * 1e3:>20.2f}")


if __name__ == "__main__":
    main()
