"""Context priors for a drafter's logits (``eagle``, ``dflash``, ``pard``): pure functions of the text read so far.

The target repeats itself and its prompt: words it has used, and the continuations of phrases it has
already written. A one-layer draft predicts both less often than the target does them, so the
drafter adds to its logits (docs/draft.md, "The context vocabulary and the priors"):

- ``context_bias`` to every token of the committed text (a copy prior);
- ``lookup_bias[n-1]`` to every token that followed an earlier occurrence of the last n tokens of
  the draft's path (the committed text and the tokens drafted before it), n = 1..len(lookup_bias):
  prompt lookup's evidence, graded by the length of the match, as a prior on the draft's choice;
- ``corpus_bias`` times each token's share of the successors of the path's longest frequent n-gram
  in a corpus of the target's own answers (``CorpusSuccessors``): its habits across prompts.

Context successors are looked up in the committed text only; the suffix they are looked up for may end in
draft tokens. The draft's distribution stays what it is told to be, so verification is unaffected.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

LOOKUP_BIAS = (2.0, 4.0, 4.0)  # chosen on the target's answers to the benchmark prompts (docs/draft.md)


def lookup_bias_for(default_on: bool, lookup_bias: Optional[Sequence[float]]) -> tuple[float, ...]:
    """The ``lookup_bias`` a drafter uses: as set, else LOOKUP_BIAS where ``default_on`` (drafts `pacer distill`
    makes with the target's head over their own subset: ``feature``, ``dflash``, ``pard``), none for the others
    (``eagle3`` drafts, published checkpoints)."""
    return tuple(float(b) for b in ((LOOKUP_BIAS if default_on else ()) if lookup_bias is None else lookup_bias))


class SuccessorIndex:
    """For n = 1..``longest``: every n-gram of the text read so far → the tokens that followed it."""

    def __init__(self, longest: int):
        self.longest = longest
        self.text: list[int] = []
        self.table: dict[tuple[int, ...], set[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Read ``tokens`` after the text so far."""
        for token in tokens:
            p = len(self.text)
            for n in range(1, min(self.longest, p) + 1):
                self.table.setdefault(tuple(self.text[p - n : p]), set()).add(int(token))
            self.text.append(int(token))

    def successors(self, suffix: Sequence[int]) -> list[set[int]]:
        """[n-1] → the tokens that followed the last n tokens of ``suffix`` in the text read, for n =
        1..min(longest, len(suffix))."""
        return [
            self.table.get(tuple(suffix[len(suffix) - n :]), set())
            for n in range(1, min(self.longest, len(suffix)) + 1)
        ]


def lookup_bonus(index: SuccessorIndex, suffix: Sequence[int], biases: Sequence[float]) -> dict[int, float]:
    """token → Σ biases[n-1] over the n whose match of ``suffix``'s last n tokens it followed."""
    bonus: dict[int, float] = {}
    for bias, followers in zip(biases, index.successors(suffix)):
        for token in followers:
            bonus[token] = bonus.get(token, 0.0) + bias
    return bonus


class CorpusSuccessors:
    """For n = 1..``longest``: every n-gram of a corpus's documents → its ``keep`` most frequent
    successors and their shares of all its occurrences (numpy; built once, read per draft token).

    The target's own answers (the self-distillation corpus) repeat its habits across prompts: the
    openings, connectives and formatting it favours. ``lookup`` answers for the longest n whose
    n-gram occurred at least ``min_count`` times. An n-gram of token ids < ``vocab_size`` is one
    integer (base ``vocab_size``), so n is capped where vocab_size^n would pass 2^63.
    """

    def __init__(
        self, documents: Iterable[Sequence[int]], vocab_size: int, longest: int = 4, keep: int = 32, min_count: int = 5
    ):
        self.base = int(vocab_size)
        self.longest = max(n for n in range(1, longest + 1) if self.base**n < 2**63)
        self.min_count = min_count
        docs = [np.asarray(d, dtype=np.int64) for d in documents if len(d) > 1]
        self.tables = [self._table(docs, n, keep) for n in range(1, self.longest + 1)]

    def _key(self, ngram: Sequence[int]) -> int:
        key = 0
        for token in ngram:
            key = key * self.base + int(token)
        return key

    def _table(self, docs: list[np.ndarray], n: int, keep: int) -> tuple[np.ndarray, ...]:
        """(keys [C] sorted, totals [C], starts [C + 1], tokens [S], counts [S]): successors of context
        c are tokens[starts[c]:starts[c + 1]], most frequent first (ties: lower id)."""
        keys, nexts = [], []
        for d in docs:
            if len(d) <= n:
                continue
            key = np.zeros(len(d) - n, dtype=np.int64)  # [P]: the n-gram before positions n..len-1
            for i in range(n):
                key = key * self.base + d[i : len(d) - n + i]
            keys.append(key)
            nexts.append(d[n:])
        if not keys:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, np.zeros(1, dtype=np.int64), empty, empty
        key, nxt = np.concatenate(keys), np.concatenate(nexts)
        order = np.lexsort((nxt, key))
        key, nxt = key[order], nxt[order]
        new = np.ones(len(key), dtype=bool)
        new[1:] = (key[1:] != key[:-1]) | (nxt[1:] != nxt[:-1])
        starts = np.flatnonzero(new)
        pair_key, pair_next = key[starts], nxt[starts]
        pair_count = np.diff(np.append(starts, len(key)))
        order = np.lexsort((pair_next, -pair_count, pair_key))  # per context: most frequent first
        pair_key, pair_next, pair_count = pair_key[order], pair_next[order], pair_count[order]
        first = np.ones(len(pair_key), dtype=bool)
        first[1:] = pair_key[1:] != pair_key[:-1]
        group = np.cumsum(first) - 1  # [S] context index of each pair
        group_start = np.flatnonzero(first)
        totals = np.add.reduceat(pair_count, group_start)
        kept = np.arange(len(pair_key)) - group_start[group] < keep
        counts_kept = np.bincount(group[kept], minlength=len(group_start))
        return (
            pair_key[group_start],
            totals,
            np.concatenate([[0], np.cumsum(counts_kept)]),
            pair_next[kept],
            pair_count[kept],
        )

    def lookup(self, suffix: Sequence[int]) -> tuple[list[int], list[float]]:
        """The successors of the longest n-gram ending ``suffix`` seen ``min_count`` times or more,
        with their shares of its occurrences; ([], []) when none."""
        for n in range(min(self.longest, len(suffix)), 0, -1):
            keys, totals, starts, tokens, counts = self.tables[n - 1]
            key = self._key(suffix[len(suffix) - n :])
            c = int(np.searchsorted(keys, key))
            if c < len(keys) and keys[c] == key and totals[c] >= self.min_count:
                a, b = starts[c], starts[c + 1]
                return tokens[a:b].tolist(), (counts[a:b] / totals[c]).tolist()
        return [], []


def corpus_bonus(corpus: CorpusSuccessors, suffix: Sequence[int], bias: float) -> dict[int, float]:
    """token → ``bias`` × its share of the successors of ``suffix``'s longest frequent n-gram in the corpus."""
    tokens, shares = corpus.lookup(suffix)
    return {token: bias * share for token, share in zip(tokens, shares)}


def path_bonus(
    index: SuccessorIndex,
    lookup_bias: Sequence[float],
    corpus: Optional[CorpusSuccessors],
    corpus_bias: float,
    suffix: Sequence[int],
) -> dict[int, float]:
    """token → the lookup bonus plus, with a ``corpus``, the corpus bonus of the path ending ``suffix``."""
    bonus = lookup_bonus(index, suffix, lookup_bias)
    if corpus is not None and corpus_bias:
        for token, value in corpus_bonus(corpus, suffix, corpus_bias).items():
            bonus[token] = bonus.get(token, 0.0) + value
    return bonus
