"""The corpus prior's table and default (``corpus_bias``, docs/draft.md#the-corpus-prior-corpus_bias): a
corpus of the target's own answers read as n-gram successors (``pacer_core.priors.CorpusSuccessors``),
shared by every drafter that applies the prior (``eagle``, ``dflash``, ``pard``)."""

from __future__ import annotations

import functools
from typing import Optional

from pacer_core.priors import CorpusSuccessors

from .loaders import corpus_writer, load_corpus

CORPUS_NGRAM = 4  # the longest n-gram the corpus prior matches
CORPUS_BIAS = 3.0  # chosen on held-out open-chat items and MT-Bench questions 11-30 (docs/draft.md)


@functools.lru_cache(maxsize=2)
def corpus_successors(corpus: str, tokenizer, vocab_size: int, target_digest: Optional[str]) -> CorpusSuccessors:
    """The corpus prior's n-gram table of ``corpus`` (read as the datastore drafter reads its ``corpus``;
    kept for the next drafter of the same target: a bench builds one per stack)."""
    return CorpusSuccessors(
        load_corpus(corpus, tokenizer, vocab_size, target_digest, CORPUS_NGRAM), vocab_size, CORPUS_NGRAM
    )


def own_corpus(corpus: str, target_digest: Optional[str]) -> bool:
    """Whether ``corpus`` is this target's own writing (a self-distillation corpus it wrote) or a file."""
    writer = corpus_writer(corpus)
    return writer is None or (target_digest is not None and writer.get("digest") == target_digest)


def corpus_bias_for(own_subset: bool, corpus_bias: Optional[float], corpus: str, target_digest: Optional[str]) -> float:
    """The ``corpus_bias`` a draft gets: as set, else CORPUS_BIAS for a draft with its own head subset
    where ``corpus`` is this target's own writing (or a file), 0 otherwise."""
    if corpus_bias is not None:
        return float(corpus_bias)
    return CORPUS_BIAS if own_subset and own_corpus(corpus, target_digest) else 0.0


def corpus_prior(
    own_subset: bool,
    corpus_bias: Optional[float],
    corpus: str,
    tokenizer,
    vocab_size: int,
    target_digest: Optional[str],
) -> tuple[float, Optional[CorpusSuccessors]]:
    """A drafter's corpus prior: its bias (``corpus_bias_for``) and, where the bias is not 0, the table
    of ``corpus`` it reads (None otherwise)."""
    bias = corpus_bias_for(own_subset, corpus_bias, corpus, target_digest)
    return bias, corpus_successors(corpus, tokenizer, vocab_size, target_digest) if bias else None
