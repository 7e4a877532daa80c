"""Built-in drafters: ``autoregressive`` (no draft), ``draft_model``, ``prompt_lookup``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import attrs
import torch

from pacer_core import Component, DraftBlock, Resources, hookimpl
from pacer_core.sampling import choose

# the token-level draft shipped for the embedded SmolLM2 target (made by `pacer distill
# student.kind=token`, see its manifest.json): used when a config omits `draft`
DEFAULT_DRAFT = str(Path(__file__).resolve().parent / "default")


@attrs.define
class AutoregressiveConfig:
    pass


class Autoregressive:
    """Proposes nothing: every step is one plain target forward (the baseline, through the engine)."""

    def __init__(self, config: AutoregressiveConfig, resources: Resources):
        pass

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        return None


@attrs.define
class DraftModelConfig:
    hidden_states: bool = True  # return the draft's last-layer hidden states (PACER reads them)


def sync_cache(model, context: list[int]) -> list[int]:
    """Crop ``model``'s cache to its longest prefix shared with ``context``; return what to feed.

    At least the last context token is always returned (its logits are what the caller needs).
    """
    cached = model.cached_tokens
    shared = 0
    for a, b in zip(cached, context):
        if a != b:
            break
        shared += 1
    shared = min(shared, len(context) - 1)
    model.crop(shared)
    return context[shared:]


class DraftModel:
    """A small causal LM sharing the target's tokenizer drafts token by token.

    Tokens are chosen with the run's sampling parameters; ``draft_probs`` are the distributions they
    were sampled from (under greedy decoding, the draft's softmax, whose argmax was chosen).
    """

    def __init__(self, config: DraftModelConfig, resources: Resources):
        self.model = resources.draft
        self.sampling = resources.sampling
        self.hidden = config.hidden_states

    @hookimpl
    def pacer_start(self, state) -> None:
        self.model.reset()

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        feed = sync_cache(self.model, state.tokens + draft.tokens.tolist())
        tokens, probs, hidden = [], [], []
        for _ in range(num_tokens):
            out = self.model.forward(feed, logits_from=len(feed) - 1, hidden=self.hidden)
            logits = out.logits[-1]  # [vocab]
            token, token_probs = choose(logits, self.sampling, state.generator)
            tokens.append(token)
            probs.append(torch.softmax(logits, -1) if token_probs is None else token_probs)
            if self.hidden:
                hidden.append(out.hidden_states[-1].float())
            if token in state.eos_token_ids:
                break
            feed = [token]
        return DraftBlock(
            tokens=torch.tensor(tokens, dtype=torch.long),
            draft_probs=torch.stack(probs),
            hidden_states=torch.stack(hidden) if self.hidden else None,
            forwards=len(tokens),
        )


@attrs.define
class PromptLookupConfig:
    max_ngram_size: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    min_ngram_size: int = attrs.field(default=1, validator=attrs.validators.ge(1))

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.min_ngram_size > self.max_ngram_size:
            raise ValueError(f"min_ngram_size ({self.min_ngram_size}) must not exceed "
                             f"max_ngram_size ({self.max_ngram_size})")


def lookup_continuation(context: torch.Tensor, max_n: int, min_n: int, num_tokens: int) -> torch.Tensor:
    """Tokens that followed the most recent earlier occurrence of the context's last n-gram.

    Tries n = max_n … min_n; ``context``: [L]. Returns up to ``num_tokens`` ids (empty if no match).
    """
    length = int(context.shape[0])
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = context[: length - 1].unfold(0, n, 1)  # [L - n, n], excludes the suffix itself
        hits = (windows == context[length - n:]).all(-1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return context[start: start + num_tokens]
    return context[:0]


class PromptLookup:
    """Model-free n-gram drafting from the context (prompt lookup decoding)."""

    def __init__(self, config: PromptLookupConfig, resources: Resources):
        self.config = config

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        context = torch.tensor(state.tokens + draft.tokens.tolist(), dtype=torch.long)
        tokens = lookup_continuation(context, self.config.max_ngram_size, self.config.min_ngram_size, num_tokens)
        return DraftBlock(tokens=tokens.clone()) if tokens.numel() else None


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component("drafter", "autoregressive", AutoregressiveConfig, Autoregressive,
                  "no draft: plain decoding through the engine (the baseline)"),
        Component("drafter", "draft_model", DraftModelConfig, DraftModel,
                  "a small LM sharing the target's tokenizer drafts token by token",
                  needs={"draft_model"}, provides={"draft_probs", "draft_hidden"},
                  default_draft=DEFAULT_DRAFT),
        Component("drafter", "prompt_lookup", PromptLookupConfig, PromptLookup,
                  "model-free n-gram drafting from the context"),
    ]
