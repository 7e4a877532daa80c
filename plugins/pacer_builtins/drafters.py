"""Built-in drafters: ``autoregressive`` (no draft), ``draft_model``, ``prompt_lookup``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import attrs
import torch

from pacer_core import Component, DraftBlock, DraftInfo, Resources, hookimpl
from pacer_core.draft_model_helpers import TOKEN_DRAFT, sync_cache
from pacer_core.sampling import choose, logits_to_probs
from pacer_core.tree_hooks import BudgetedTree
from pacer_core.trees import GrownLevels, TreeConfig, grow_level, node_budget, phrase_block
from pacer_core.types import StepWatch

# the token-level draft shipped for the embedded SmolLM2 target (used when a config omits `draft`), shipped
# to other packages as TOKEN_DRAFT (pacer_shipped: ouroboros runs it too, pard starts from it)
DEFAULT_DRAFT = str(Path(__file__).resolve().parent / "default")
COST_KIND = "token"  # draft_model: a draft model's forwards (pacer_core.cost_profiles.DRAFTER_KINDS)


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
    # grow an EAGLE-2-style dynamic token tree ({topk, depth, nodes}; {} = defaults); null = a chain
    tree: Optional[TreeConfig] = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(TreeConfig))
    )


def level_layout(
    ancestor_rows: list[list[int]], context: int, cached: int, depth: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and mask for one tree level fed after a draft cache of ``cached`` rows.

    The cache holds ``context`` context rows, then rows of earlier tree nodes; node i of the level
    (``depth`` after the last context token) sees the context rows, ``ancestor_rows[i]`` (the
    cache rows of its ancestors) and itself. Returns (positions [k], offsets from ``cached`` as
    ``LanguageModel.forward`` takes them; tree_mask [k, cached + k] bool).
    """
    k = len(ancestor_rows)
    positions = torch.full((k,), context - 1 + depth - cached, dtype=torch.long)  # [k]
    mask = torch.zeros(k, cached + k, dtype=torch.bool)  # [k, cached + k]
    mask[:, :context] = True
    ancestors = [(i, row) for i, rows in enumerate(ancestor_rows) for row in rows]
    if ancestors:  # every node's ancestors in one indexed write
        mask[[i for i, _ in ancestors], [row for _, row in ancestors]] = True
    mask[:, cached:] |= torch.eye(k, dtype=torch.bool)  # each node sees itself
    return positions, mask


class DraftModel(BudgetedTree):
    """A small causal LM sharing the target's tokenizer drafts token by token.

    Tokens are chosen with the run's sampling parameters; ``draft_probs`` are the distributions they
    were sampled from (under greedy decoding, the draft's softmax, whose argmax was chosen).

    With ``tree`` it grows an EAGLE-2-style dynamic token tree instead, one draft forward per level
    and as many levels per ``pacer_propose`` call as the stop policies ask for
    (``pacer_core.trees.grow_level``, ``GrownLevels``): each level's main-path token is the tip's
    most likely child (the main path: the draft's greedy chain), its side nodes the level's other
    chosen children. Children are the top-k of the processed
    distribution (``sampled=False``), so the verifier treats them as point masses.
    """

    def __init__(self, config: DraftModelConfig, resources: Resources):
        self.model = resources.draft
        self.sampling = resources.sampling
        self.hidden = config.hidden_states
        self.tree = config.tree
        self.draft_info = DraftInfo(tree=config.tree)
        self.budget = (
            None
            if config.tree is None
            else node_budget(config.tree, resources.target.device, COST_KIND, resources.target.digest)
        )
        # tree mode, the step being drafted: its context length (the tree's cache rows follow), the
        # last level's (token, the cache rows its parent sees after the context: its ancestors' and its
        # own), their draft-tree numbers and cumulative log-probabilities (main-path node first), the
        # draft's blocks after it
        self._context: Optional[int] = None
        self._level: list[tuple[int, list[int]]] = []
        self._nodes: list[int] = []
        self._scores: list[float] = []
        self._blocks = 0
        self.step = StepWatch()  # tree mode: a step's first call grows from the root

    @hookimpl
    def pacer_start(self, state) -> None:
        self.model.reset()
        self._context = None
        self.step.restart()
        if self.budget is not None and state is not None and not state.sampling.greedy:
            self.budget.restart()  # auto's learned rate carries across greedy generations only

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        if self.tree is not None:
            self._drop_tree_rows()

    def _drop_tree_rows(self) -> None:
        """Crop the draft cache to the context the tree grew from. Its tree rows must never pass for
        context in ``sync_cache``: a side node's row matches a later committed token equal to its
        token, but was computed without that token's real predecessors."""
        if self._context is not None:
            self.model.crop(min(self._context, len(self.model.cached_tokens)))
        self._context, self._level, self._nodes, self._scores = None, [], [], []
        self._blocks = 0

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[f, vocab] logits -> the distributions tree children are chosen from (sampling applied;
        the softmax under greedy decoding, whose argmax is the main-path child)."""
        if self.sampling.greedy:
            return torch.softmax(logits.float(), -1)
        return logits_to_probs(logits, self.sampling)

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        if self.tree is not None:
            return self._propose_levels(state, draft, num_tokens)
        feed = sync_cache(self.model, state.tokens + draft.tokens.tolist())
        tokens, probs, hidden = [], [], []
        for _ in range(num_tokens):
            out = self.model.forward(feed, logits_from=len(feed) - 1, hidden=self.hidden)
            logits = out.logits[-1].cpu()  # [vocab]: the token is chosen on the host (one read)
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

    def _propose_levels(self, state, draft, num_tokens: int) -> Optional[DraftBlock]:
        """Up to ``num_tokens`` levels of the tree in one block: level 1 from the draft's
        distribution after the context, each later one from a forward over every node of the
        previous level (a tree mask over the cached rows). The block's main path is each level's
        main-path child; the others are its side nodes. None after ``tree.depth`` levels."""
        tree, model = self.tree, self.model
        new_step = self.step.starts(state)
        if not new_step and (self._context is None or len(draft.blocks) != self._blocks):
            raise RuntimeError(
                "draft_model tree: the draft is not the one this drafter grew "
                "(one drafter per engine; drafts are not edited between levels)"
            )
        grown, forwards = GrownLevels([-1] if new_step else self._nodes), 0  # this call's levels, one block
        for level_index in range(min(num_tokens, tree.depth - len(draft))):
            if new_step and level_index == 0:  # a new step: level 1
                self._drop_tree_rows()  # normally done in pacer_observe_step already
                feed = sync_cache(model, state.tokens)
                out = model.forward(feed, logits_from=len(feed) - 1, hidden=self.hidden)
                self._context = len(model.cached_tokens)
                probs = self._probs(out.logits[-1:].cpu())  # [1, vocab]
                hidden = out.hidden_states[-1:] if self.hidden else None  # [1, hidden]
                seen, scores = [[]], [0.0]  # the root is the one expanded node: it sees the context
            else:
                level = self._level  # the last level's (token, rows its parent sees), main-path node first
                if level[0][0] in state.eos_token_ids:
                    break  # the main path ended: nothing after EOS is ever committed
                cached = len(model.cached_tokens)
                if cached + len(level) > model.max_length:
                    break
                ancestors = [rows for _, rows in level]
                positions, mask = level_layout(ancestors, self._context, cached, len(draft) + level_index)
                out = model.forward(
                    [token for token, _ in level], positions=positions, tree_mask=mask, hidden=self.hidden
                )
                seen = [rows + [cached + i] for i, rows in enumerate(ancestors)]  # each node's, its own row too
                probs = self._probs(out.logits.cpu())  # [k, vocab]
                ends = [i for i, (token, _) in enumerate(level) if token in state.eos_token_ids]
                probs[ends] = 0.0  # nothing grows past an end-of-sequence side node
                hidden = out.hidden_states if self.hidden else None  # [k, hidden]
                scores = self._scores
            forwards += 1
            chosen = grow_level(scores, probs, 0, tree.topk, tree.topk)
            if not chosen:
                break
            grown.add(chosen, [probs[c.row] for c in chosen], None if hidden is None else hidden[chosen[0].row].float())
            self._level = [(c.token, seen[c.row]) for c in chosen]
            self._scores = [c.score for c in chosen]
        if not grown:
            return None
        block, self._nodes = grown.block(draft.num_nodes, forwards)
        self._blocks = len(draft.blocks) + 1
        return block


@attrs.define
class PromptLookupConfig:
    max_ngram_size: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    min_ngram_size: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    # continuations offered per call: the main one plus up to branches - 1 others as side nodes
    branches: int = attrs.field(default=1, validator=attrs.validators.ge(1))

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.min_ngram_size > self.max_ngram_size:
            raise ValueError(
                f"min_ngram_size ({self.min_ngram_size}) must not exceed max_ngram_size ({self.max_ngram_size})"
            )


def lookup_continuation(context: torch.Tensor, max_n: int, min_n: int, num_tokens: int) -> torch.Tensor:
    """Tokens that followed the most recent earlier occurrence of the context's last n-gram.

    Tries n = max_n … min_n; ``context``: [L]. Returns up to ``num_tokens`` ids (empty if no match).
    """
    length = int(context.shape[0])
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = context[: length - 1].unfold(0, n, 1)  # [L - n, n], excludes the suffix itself
        hits = (windows == context[length - n :]).all(-1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return context[start : start + num_tokens]
    return context[:0]


def lookup_continuations(context: torch.Tensor, max_n: int, min_n: int, num_tokens: int, limit: int) -> list[list[int]]:
    """Up to ``limit`` distinct continuations of the context's last n-gram, best first.

    The first is ``lookup_continuation``'s (the most recent occurrence of the longest matching
    n-gram); the others follow other earlier occurrences, longer n first, most recent first. A
    continuation that is a prefix of one already taken (it would add no tree node) is skipped.
    ``context``: [L]; each continuation has at most ``num_tokens`` ids.
    """
    length = int(context.shape[0])
    found: list[list[int]] = []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = context[: length - 1].unfold(0, n, 1)  # [L - n, n], excludes the suffix itself
        hits = (windows == context[length - n :]).all(-1).nonzero().flatten().tolist()
        for hit in reversed(hits):
            start = hit + n
            candidate = context[start : start + num_tokens].tolist()
            if any(taken[: len(candidate)] == candidate for taken in found):
                continue
            found.append(candidate)
            if len(found) >= limit:
                return found
    return found


class PromptLookup:
    """Model-free n-gram drafting from the context (prompt lookup decoding).

    With ``branches > 1`` the block's tokens are the usual continuation and up to ``branches - 1``
    other continuations (other occurrences of the n-grams) hang off the same node as side nodes,
    merged into a trie with it; all are point masses (no draft probabilities)."""

    def __init__(self, config: PromptLookupConfig, resources: Resources):
        self.config = config

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        context = torch.tensor(state.tokens + draft.tokens.tolist(), dtype=torch.long)
        c = self.config
        if c.branches == 1:
            tokens = lookup_continuation(context, c.max_ngram_size, c.min_ngram_size, num_tokens)
            return DraftBlock(tokens=tokens.clone()) if tokens.numel() else None
        found = lookup_continuations(context, c.max_ngram_size, c.min_ngram_size, num_tokens, c.branches)
        return phrase_block(found, draft)


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "autoregressive",
            AutoregressiveConfig,
            Autoregressive,
            "no draft: plain decoding through the engine (the baseline)",
        ),
        Component(
            "drafter",
            "draft_model",
            DraftModelConfig,
            DraftModel,
            "a small LM sharing the target's tokenizer drafts token by token (or a token tree: tree)",
            needs={"draft_model"},
            provides={"draft_probs", "draft_hidden"},
            default_draft=DEFAULT_DRAFT,
            cost_kind=COST_KIND,
        ),
        Component(
            "drafter",
            "prompt_lookup",
            PromptLookupConfig,
            PromptLookup,
            "model-free n-gram drafting from the context (several matches as branches: branches)",
        ),
    ]


@hookimpl
def pacer_shipped() -> dict[str, str]:
    return {TOKEN_DRAFT: DEFAULT_DRAFT}
