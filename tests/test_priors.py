"""pacer_core.priors: the n-gram successor index and the lookup bonus, the corpus successors and
the corpus bonus, each against a direct scan."""

import random
from collections import Counter

import pytest

from pacer_core.priors import CorpusSuccessors, SuccessorIndex, corpus_bonus, lookup_bonus

from helpers import brute_successors


def test_a_worked_example():
    index = SuccessorIndex(2)
    index.extend([5, 6, 7, 5, 6, 8])
    assert index.successors([9, 5, 6]) == [{7, 8}, {7, 8}]  # after 6; after (5, 6)
    assert index.successors([1, 5]) == [{6}, set()]
    assert index.successors([8]) == [set()]  # 8 ends the text: nothing followed it yet
    assert lookup_bonus(index, [7, 5], [1.0, 10.0]) == {6: 11.0}  # 5 → 6 and (7, 5) → 6
    assert lookup_bonus(index, [4, 6], [1.0, 10.0]) == {7: 1.0, 8: 1.0}
    assert lookup_bonus(index, [], [1.0]) == {}


def test_reading_in_pieces_equals_a_direct_scan():
    rng = random.Random(0)
    text = [rng.randrange(6) for _ in range(200)]
    index = SuccessorIndex(3)
    read = 0
    while read < len(text):
        piece = rng.randint(1, 7)
        index.extend(text[read : read + piece])
        read += piece
        for _ in range(5):
            suffix = [rng.randrange(6) for _ in range(rng.randint(1, 4))]
            assert lookup_bonus(index, suffix, [1.0, 2.5, 4.0]) == brute_successors(
                text[:read], suffix, [1.0, 2.5, 4.0]
            )


def brute_corpus(docs, suffix, longest, keep, min_count):
    """The successors of the longest n-gram ending ``suffix`` seen ``min_count`` times in ``docs``, by a
    scan: the ``keep`` most frequent (ties: lower id) and their shares."""
    for n in range(min(longest, len(suffix)), 0, -1):
        counts = Counter(d[p] for d in docs for p in range(n, len(d)) if d[p - n : p] == suffix[len(suffix) - n :])
        total = sum(counts.values())
        if total >= min_count:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:keep]
            return [t for t, _ in top], [c / total for _, c in top]
    return [], []


def test_corpus_successors_a_worked_example():
    corpus = CorpusSuccessors([[1, 2, 3, 1, 2, 4, 1, 2, 3]], vocab_size=5, longest=2, keep=1, min_count=2)
    assert corpus.lookup([1, 2]) == ([3], [2 / 3])  # (1, 2) → 3 twice, 4 once: only the first kept
    assert corpus.lookup([2, 2]) == ([3], [2 / 3])  # (2, 2) never occurred: back off to 2 alone
    assert corpus.lookup([0, 1]) == ([2], [1.0])  # (0, 1) never occurred; 1 → 2 three times
    assert corpus.lookup([3]) == ([], [])  # 3 → 1 once: under min_count
    assert corpus.lookup([]) == ([], [])
    assert corpus_bonus(corpus, [1, 2], 3.0) == {3: 2.0}


def test_corpus_successors_equal_a_direct_scan():
    rng = random.Random(0)
    docs = [[rng.randrange(7) for _ in range(rng.randrange(0, 40))] for _ in range(50)]
    corpus = CorpusSuccessors(docs, 7, longest=3, keep=3, min_count=4)
    for _ in range(300):
        suffix = [rng.randrange(7) for _ in range(rng.randrange(0, 5))]
        tokens, shares = corpus.lookup(suffix)
        want_tokens, want_shares = brute_corpus(docs, suffix, 3, 3, 4)
        assert tokens == want_tokens and shares == pytest.approx(want_shares)


def test_corpus_ngrams_are_capped_where_a_key_would_overflow():
    assert CorpusSuccessors([[1, 2, 3]], vocab_size=49_152, longest=4).longest == 4  # 49152^4 < 2^63
    assert CorpusSuccessors([[1, 2, 3]], vocab_size=128_256, longest=4).longest == 3  # a Llama-3 vocabulary
    assert CorpusSuccessors([], vocab_size=16, longest=2).lookup([1, 2]) == ([], [])
