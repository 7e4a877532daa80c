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

import json
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np

from pacer_core import Component, DraftBlock, InputError, Resources, hookimpl
from pacer_core.trees import phrase_block

from .index import TokenIndex, context_matches, rank_continuations
from .store import check_path, load_documents, save_documents, tokenizer_identity

__all__ = ["SHIPPED_CORPUS", "DatastoreConfig", "Datastore", "corpus_writer", "load_corpus", "pacer_components"]


@attrs.define
class DatastoreConfig:
    max_ngram: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # longest suffix matched
    min_ngram: int = attrs.field(default=2, validator=attrs.validators.ge(1))  # shortest suffix matched
    branches: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # phrases offered per call
    max_matches: int = attrs.field(default=64, validator=attrs.validators.ge(1))  # occurrences counted
    path: Optional[str] = None  # .npz file of earlier generations: loaded when it exists, saved after each
    max_tokens: int = attrs.field(default=1_000_000, validator=attrs.validators.ge(0))  # earlier generations kept
    # a text file (tokenized with the target's tokenizer), a .json of token ids, a folder `pacer corpus`
    # wrote (the target's answers) or "shipped" (the one the embedded target wrote, in feature_draft)
    corpus: Optional[str] = None

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")


SHIPPED_CORPUS = "shipped"  # corpus: shipped = the self-distillation corpus the embedded target wrote


def load_corpus(path: str, tokenizer: Any, vocab_size: int, target_digest: Optional[str] = None,
                prompt_tail: int = 0) -> list[list[int]]:
    """A corpus's documents. ``shipped`` or a folder that ``pacer corpus`` wrote: the target's own
    answers, each with the last ``prompt_tail`` tokens of its prompt (so an answer's opening is found
    after the chat template's assistant header); refused when another target wrote it. A ``.json``
    file holds token ids (a list, or a list of lists); any other file is UTF-8 text, tokenized once
    with the target's tokenizer (no chat template)."""
    if path == SHIPPED_CORPUS or Path(path).expanduser().is_dir():
        return _target_answers(path, vocab_size, target_digest, prompt_tail)
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(f"datastore corpus '{file}' does not exist: give a text file, a .json of token ids, "
                         f"a folder `pacer corpus` wrote or '{SHIPPED_CORPUS}'")
    if file.suffix == ".json":
        try:
            data = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"datastore corpus '{file}' is not readable JSON ({exc}); give a list of token ids") from None
        docs = data if isinstance(data, list) and data and all(isinstance(d, list) for d in data) else [data]
        for doc in docs:
            if not isinstance(doc, list) or not all(type(t) is int and 0 <= t < vocab_size for t in doc):
                raise InputError(f"datastore corpus '{file}' must hold token ids in [0, {vocab_size}): "
                                 "a list of ints or a list of such lists")
        return docs
    if tokenizer is None:
        raise InputError(f"datastore corpus '{file}' is text but this engine has no tokenizer: "
                         "give token ids in a .json file")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"datastore corpus '{file}' is not readable UTF-8 text ({exc}); give a text file") from None
    return [list(tokenizer.encode(text, chat_template=False))]


def corpus_writer(path: str) -> Optional[dict[str, Any]]:
    """The target that wrote a self-distillation corpus (``shipped`` or a folder ``pacer corpus`` wrote):
    its manifest's ``{"path", "digest"}``; None for a text or .json corpus."""
    if path != SHIPPED_CORPUS and not Path(path).expanduser().is_dir():
        return None
    return _self_distillation(path)[1].manifest.get("target") or {}


def _self_distillation(path: str):
    """(folder, ``CorpusStore``) of ``shipped`` or a corpus folder."""
    try:
        import feature_draft
        from pacer_train.corpus.shards import CorpusStore
    except ImportError:  # pragma: no cover - both plugins ship in the same distribution
        raise InputError(f"datastore corpus '{path}' is a self-distillation corpus, which needs the "
                         "feature_draft plugin: install pacer-sd whole, or give a text or .json corpus") from None
    folder = Path(feature_draft.__file__).resolve().parent / "corpus" if path == SHIPPED_CORPUS \
        else Path(path).expanduser()
    return folder, CorpusStore(folder, create=False)


def _target_answers(path: str, vocab_size: int, target_digest: Optional[str], prompt_tail: int) -> list[list[int]]:
    """The answers of a self-distillation corpus folder (``pacer_train.corpus``; its shards'
    checksums are verified on reading), each after its prompt's last ``prompt_tail`` tokens."""
    from pacer_train.corpus.shards import iter_corpus

    folder, store = _self_distillation(path)
    written_by = store.manifest.get("target") or {}
    if target_digest is not None and written_by.get("digest") not in (None, target_digest):
        raise InputError(f"datastore corpus '{path}' was written by another target ({written_by.get('path')}, "
                         f"weights {written_by.get('digest')}; this target's are {target_digest}): "
                         "grow one with this target (`pacer corpus out=DIR`) or give a text corpus")
    docs = []
    for sample in iter_corpus(folder):
        tokens = sample.tokens[max(0, sample.prompt_length - prompt_tail):]
        if len(tokens) and int(tokens.max()) >= vocab_size:
            raise InputError(f"datastore corpus '{path}' holds token ids beyond this target's vocabulary "
                             f"({vocab_size}): give a corpus this target wrote")
        docs.append(tokens.tolist())
    return docs


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
            self.corpus = TokenIndex(config.max_ngram)
            self.corpus.extend(load_corpus(config.corpus, resources.tokenizer, self.vocab_size,
                                           resources.target.digest, config.max_ngram))
        # what lookups search: under sampling the store as loaded (the live one is copied on write)
        self.searched = self.store
        self.frozen = not resources.sampling.greedy
        self.proposals = 0

    # -- matching -------------------------------------------------------------------------------
    def phrases(self, context: list[int], num_tokens: int, eos: frozenset[int] = frozenset(),
                search_context: bool = True) -> list[list[int]]:
        """Up to ``branches`` continuations of ``context`` of at most ``num_tokens`` tokens, best first.
        ``search_context=False`` leaves the context's own earlier occurrences out (the stored
        generations and the corpus alone: scripts/retrieval_replay.py credits those to prompt lookup)."""
        c = self.config
        ctx = np.asarray(context, dtype=np.int64)  # [L]
        indexes = [self.searched] + ([self.corpus] if self.corpus is not None else [])
        for n in range(min(c.max_ngram, len(ctx)), c.min_ngram - 1, -1):
            found: list[list[int]] = []
            for p in context_matches(ctx, n)[: c.max_matches].tolist() if search_context else []:
                found.append(ctx[p + n: p + n + num_tokens].tolist())
            suffix = ctx[len(ctx) - n:].tolist()
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
        return {"datastore_proposals": self.proposals, "datastore_tokens": self.store.size,
                "datastore_documents": len(self.store.lengths)}


def _cut_at_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component("drafter", "datastore", DatastoreConfig, Datastore,
                  "model-free retrieval: continuations of the context's suffix from this generation, "
                  "earlier ones (kept in a file with path) and a corpus, as branches"),
    ]
