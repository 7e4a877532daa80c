"""The ``datastore`` drafter: model-free retrieval of continuations by exact suffix matching
(REST / SuffixDecoding style).

Sources, searched together: (a) this generation's context (prompt and committed tokens, plus the
draft so far); (b) earlier generations, kept in memory across prompts and, with ``path``, in a file
across runs, at most ``max_tokens`` tokens (oldest evicted); (c) an optional ``corpus``. The context's
last n tokens are matched exactly, n from ``max_ngram`` down to ``min_ngram``: the longest n any
source matches wins. The continuations after its most recent ``max_matches`` occurrences (context
first, then earlier generations, then the corpus, each newest first) are counted in a trie and
``rank_continuations`` makes up to ``branches`` phrases: the main path follows the most frequent
continuation, the others branch off where most matches disagree with it. All are point masses for
the verifier, so the drafter is exact under greedy decoding and sampling alike.

At the end of each generation its tokens (with the ``max_ngram`` prompt tokens before them, so a
response's opening can be found after the same prompt ending) join the store, which is then saved.
Under sampling the store the engine started with is the one searched, so a seed reproduces its
output on the same engine; later generations are still stored and saved for later runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import attrs
import numpy as np

from pacer_core import Component, DraftBlock, Resources, hookimpl
from pacer_core.trees import phrase_block

from .index import TokenIndex, context_matches, rank_continuations
from .store import check_path, load_documents, save_documents, tokenizer_identity

__all__ = ["DatastoreConfig", "Datastore", "pacer_components"]


@attrs.define
class DatastoreConfig:
    max_ngram: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # longest suffix matched
    min_ngram: int = attrs.field(default=2, validator=attrs.validators.ge(1))  # shortest suffix matched
    branches: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # phrases offered per call
    max_matches: int = attrs.field(default=64, validator=attrs.validators.ge(1))  # occurrences counted
    path: Optional[str] = None  # .npz file of earlier generations: loaded when it exists, saved after each
    max_tokens: int = attrs.field(default=1_000_000, validator=attrs.validators.ge(0))  # earlier generations kept
    # a text file (tokenized with the target's tokenizer), a .json of token ids, a folder `pacer corpus`
    # wrote (the target's answers) or "shipped" (the one the embedded target wrote, in eagle)
    corpus: Optional[str] = None

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")


class Datastore:
    """Continuations of the context's suffix from the context, earlier generations and a corpus
    (see the module)."""

    def __init__(self, config: DatastoreConfig, resources: Resources):
        self.config = config
        self.vocab_size = resources.target.vocab_size
        self.identity = tokenizer_identity(resources.tokenizer, self.vocab_size)
        self.store = TokenIndex(config.max_ngram)  # earlier generations
        if config.path and config.max_tokens > 0:
            check_path(config.path)  # saved after each generation: refused now rather than after decoding
        if config.path and Path(config.path).expanduser().exists():
            self.store.extend(load_documents(config.path, self.identity, self.vocab_size), config.max_tokens)
        self.corpus: Optional[TokenIndex] = None
        if config.corpus:
            from pacer_train.corpus.loaders import load_corpus  # the corpus-reading half of the training package

            self.corpus = TokenIndex(config.max_ngram)
            self.corpus.extend(
                load_corpus(
                    config.corpus, resources.tokenizer, self.vocab_size, resources.target.digest, config.max_ngram
                )
            )
        # what lookups search: under sampling the store as loaded (the live one is copied on write)
        self.searched = self.store
        self.frozen = not resources.sampling.greedy
        self.proposals = 0

    # -- matching -------------------------------------------------------------------------------
    def phrases(
        self, context: list[int], num_tokens: int, eos: frozenset[int] = frozenset(), search_context: bool = True
    ) -> list[list[int]]:
        """Up to ``branches`` continuations of ``context`` of at most ``num_tokens`` tokens, best first.
        ``search_context=False`` leaves the context's own earlier occurrences out (the stored
        generations and the corpus alone: scripts/retrieval_replay.py credits those to prompt lookup)."""
        c = self.config
        ctx = np.asarray(context, dtype=np.int64)  # [L]
        indexes = [self.searched] + ([self.corpus] if self.corpus is not None else [])
        for n in range(min(c.max_ngram, len(ctx)), c.min_ngram - 1, -1):
            found: list[list[int]] = []
            for p in context_matches(ctx, n)[: c.max_matches].tolist() if search_context else []:
                found.append(ctx[p + n : p + n + num_tokens].tolist())
            suffix = ctx[len(ctx) - n :].tolist()
            for index in indexes:
                room = c.max_matches - len(found)
                if room <= 0:
                    break
                found += [index.continuation(p + n, num_tokens) for p in index.find(suffix)[:room].tolist()]
            found = [_cut_at_eos(f, eos) for f in found if f]
            if found:
                return rank_continuations(found, c.branches)
        return []

    # -- hooks ----------------------------------------------------------------------------------
    @hookimpl
    def pacer_start(self, state) -> None:
        self.proposals = 0

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        if len(draft) and int(draft.tokens[-1]) in state.eos_token_ids:
            return None
        context = state.tokens + draft.tokens.tolist()
        block = phrase_block(self.phrases(context, num_tokens, state.eos_token_ids), draft)
        self.proposals += block is not None
        return block

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        c = self.config
        if c.max_tokens > 0:
            if self.frozen and self.store is self.searched:
                self.store = self.store.copy()  # copy on write: lookups keep the loaded store
            start = max(0, state.prompt_length - c.max_ngram)
            self.store.add(state.tokens[start:], max_tokens=c.max_tokens)
            if c.path:
                tokens, lengths = self.store.arrays()
                save_documents(c.path, tokens, lengths, self.identity)
        return {
            "datastore_proposals": self.proposals,
            "datastore_tokens": self.store.size,
            "datastore_documents": len(self.store.lengths),
        }


def _cut_at_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "datastore",
            DatastoreConfig,
            Datastore,
            "model-free retrieval: continuations of the context's suffix from this generation, "
            "earlier ones (kept in a file with path) and a corpus, as branches",
        ),
    ]
