"""The ``phrase_pool`` drafter: Ouroboros' phrase pool as a model-free draft source.

No draft model: the pool (``pacer_plugins.ouroboros.pool``, the same one the ``ouroboros`` drafter keeps) is
filled from the prompt's own n-grams (``prompt_phrases``), from the target as in Ouroboros
(``learn_from_step``: the target's argmax chains along the verified paths and its corrections of
the phrases that hung off accepted nodes) and from the generation's own n-grams as they are
committed. Each call offers up to ``topk`` phrases keyed by the
last token of the context, most recent first: the first continues the main path, the others hang
off the same node as side nodes (a trie). They are point masses for the verifier, so the drafter
is exact under greedy decoding and sampling alike. Its purpose is to be a ``hybrid`` member
(``members: [{name: eagle}, {name: phrase_pool}]``): pool phrases become branches the target
checks beside a model drafter's tree. The faithful ``ouroboros`` drafter is unchanged.
"""

from __future__ import annotations

from typing import Optional

import attrs

from pacer_core import Component, DraftBlock, Resources, hookimpl
from pacer_core.trees import phrase_block

from .pool import PhrasePool, learn_from_step, ngram_pairs, open_pool

__all__ = ["PhrasePoolConfig", "PhrasePoolDrafter", "pacer_components"]


@attrs.define
class PhrasePoolConfig:
    level: int = attrs.field(default=7, validator=attrs.validators.ge(2))  # phrases hold level - 1 tokens
    guess_set_size: int = attrs.field(default=20, validator=attrs.validators.ge(1))  # phrases per key
    topk: int = attrs.field(default=3, validator=attrs.validators.ge(1))  # phrases offered per call
    pool_path: Optional[str] = None  # JSON file: loaded when it exists, written after each generation
    warm_start: bool = True  # keep what the pool learned across prompts (greedy decoding only)
    prompt_phrases: bool = True  # seed the pool with the prompt's own n-grams

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.topk > self.guess_set_size:
            raise ValueError(f"topk ({self.topk}) must not exceed guess_set_size ({self.guess_set_size})")


class PhrasePoolDrafter:
    """Pool phrases keyed by the context's last token, as a trie of point masses (see the module).

    Under sampling, or with ``warm_start: false``, every generation starts from the initial pool
    (the file's, else empty), so a seed reproduces its output on the same engine.
    """

    def __init__(self, config: PhrasePoolConfig, resources: Resources):
        self.config = config
        self.phrase_length = config.level - 1
        self.pool = open_pool(config.pool_path, self.phrase_length, config.guess_set_size)
        self._initial = self.pool.to_dict()
        self.offered = 0  # proposals made in this generation

    @hookimpl
    def pacer_start(self, state) -> None:
        if not self.config.warm_start or not state.sampling.greedy:
            self.pool = PhrasePool.from_dict(self._initial)
        if self.config.prompt_phrases:
            self.pool.add_all(ngram_pairs(state.tokens, self.phrase_length))
        self.offered = 0

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        key = int(draft.tokens[-1]) if len(draft) else state.tokens[-1]
        if key in state.eos_token_ids:
            return None
        phrases = [list(p[:num_tokens]) for p in self.pool.get(key, self.config.topk)]
        block = phrase_block(phrases, draft)
        self.offered += block is not None
        return block

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        learn_from_step(self.pool, state, step)
        n, tokens = self.phrase_length, state.tokens  # and the n-grams this step's tokens completed
        first = max(0, step.committed_before - n)
        self.pool.add_all(ngram_pairs(tokens[first:], n))

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        if self.config.pool_path:
            self.pool.save(self.config.pool_path)
        return {"phrase_pool_phrases": len(self.pool), "phrase_pool_proposals": self.offered}


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "phrase_pool",
            PhrasePoolConfig,
            PhrasePoolDrafter,
            "model-free: Ouroboros' phrase pool (filled from the prompt and the target) offers "
            "phrases continuing the context as branches; a hybrid member",
        ),
    ]
