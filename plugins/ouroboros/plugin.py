"""The ``ouroboros`` drafter (Zhao et al., EMNLP 2024, arXiv 2402.13720), greedy only.

Each **draft forward** feeds the draft model, in one pass with a tree mask (``lookahead_layout``):

- the **main** tokens: the context tokens not yet in the draft model's cache (the last one is the
  token whose continuation is wanted);
- the **lookahead window** (Jacobi decoding, as in lookahead decoding): ``level - 1`` rows of
  ``window_size`` guessed tokens; each forward refines the last row, shifts the rows up and
  harvests one phrase per column into the pool;
- the **guess set**: every pool phrase keyed by the last main token, each as its own branch.

The draft model's greedy next token comes from the last main row. A phrase whose first tokens
equal the draft model's own greedy chain (its first token equals that next token, each later token
equals the draft's argmax after the phrase's previous token) lets the forward emit those tokens
and the argmax after them at once: the draft is always the draft model's greedy chain, reached
with fewer forwards. Each block hangs up to ``topk`` pool phrases keyed by its last token on that
token as candidate suffixes: side nodes of the draft tree (``DraftBlock.side``, a trie), which the
engine scores in the same target forward and the verifier accepts like any other tree path. In
``pacer_observe_step`` the pool learns from the target (``StepRecord.target_argmax``): its argmax
chains along the main path and the accepted path, and each candidate suffix hanging off an
accepted node as the target corrected it.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

import attrs
import torch

from pacer_core import Component, DraftBlock, Resources, SideNodes, hookimpl
from pacer_core.draft_model_helpers import shipped_draft, sync_cache

from .pool import learn_from_step, ngram_pairs, open_pool

__all__ = ["OuroborosConfig", "Ouroboros", "lookahead_layout", "pacer_components"]


@attrs.define
class OuroborosConfig:
    """Defaults: the original's (``ouroboros(...)`` in thunlp/Ouroboros: window 20, guess set 20,
    level 7, topk 3); ``gamma`` 0 leaves the draft length to the stop policies. Per-task settings
    of the paper are in docs/ouroboros.md."""

    gamma: int = attrs.field(default=0, validator=attrs.validators.ge(0))  # cap on draft tokens per step; 0 = none
    window_size: int = attrs.field(default=20, validator=attrs.validators.ge(0))  # lookahead columns; 0 = off
    guess_set_size: int = attrs.field(default=20, validator=attrs.validators.ge(1))  # phrases per key
    level: int = attrs.field(default=7, validator=attrs.validators.ge(2))  # phrases hold level - 1 tokens
    topk: int = attrs.field(default=3, validator=attrs.validators.ge(0))  # candidate suffixes per step
    pool_path: Optional[str] = None  # JSON file: loaded when it exists, written after each generation
    warm_start: bool = True  # keep the pool across prompts
    prompt_phrases: bool = False  # also seed the pool with the prompt's own n-grams

    def __attrs_post_init__(self) -> None:  # checked by load_config, before any model loads
        if self.topk > self.guess_set_size:
            raise ValueError(f"topk ({self.topk}) must not exceed guess_set_size ({self.guess_set_size})")


def lookahead_layout(n_main: int, rows: int, cols: int, phrase_lengths: Sequence[int]):
    """Positions and tree mask for [main, window, phrase_1, phrase_2, ...] in one draft forward.

    ``main`` (``n_main`` tokens) is causal; the last main token sits at offset ``n_main - 1``.
    The window is ``rows`` × ``cols`` tokens, row-major; token (l, i) sits ``i + l + 1`` after the
    last main token and sees window row 0 up to column i, then its own column from row 1 down to
    itself: column i reads ``row0[: i + 1] + [row1[i], ..., row_l[i]]``. Each phrase sits right
    after the last main token and sees the main tokens and causally itself. Returns
    (positions [k] offsets from the cache length, tree_mask [k, k] bool).
    """
    n_window = rows * cols
    k = n_main + n_window + sum(phrase_lengths)
    positions = torch.arange(k)
    mask = torch.zeros(k, k, dtype=torch.bool)
    mask[:, :n_main] = True
    mask[:n_main, :n_main] = torch.tril(torch.ones(n_main, n_main, dtype=torch.bool))
    if n_window:
        level = torch.arange(rows).repeat_interleave(cols)  # [n_window] row of each window token
        column = torch.arange(cols).repeat(rows)  # [n_window]
        positions[n_main : n_main + n_window] = n_main + level + column
        first_row = (level[None, :] == 0) & (column[None, :] <= column[:, None])
        own_column = (level[None, :] >= 1) & (level[None, :] <= level[:, None]) & (column[None, :] == column[:, None])
        mask[n_main : n_main + n_window, n_main : n_main + n_window] = first_row | own_column
    start = n_main + n_window
    for length in phrase_lengths:
        positions[start : start + length] = torch.arange(n_main, n_main + length)
        mask[start : start + length, start : start + length] = torch.tril(torch.ones(length, length, dtype=torch.bool))
        start += length
    return positions, mask


@attrs.frozen
class _Drafted:
    """Tokens one or more draft forwards produced, with what produced each (rows aligned)."""

    tokens: list[int]
    hidden_states: torch.Tensor  # [t, hidden]
    draft_probs: torch.Tensor  # [t, vocab]

    def __len__(self) -> int:
        return len(self.tokens)

    def __add__(self, other: "_Drafted") -> "_Drafted":
        return _Drafted(
            self.tokens + other.tokens,
            torch.cat([self.hidden_states, other.hidden_states]),
            torch.cat([self.draft_probs, other.draft_probs]),
        )

    def split(self, n: int) -> tuple["_Drafted", "_Drafted"]:
        return (
            _Drafted(self.tokens[:n], self.hidden_states[:n], self.draft_probs[:n]),
            _Drafted(self.tokens[n:], self.hidden_states[n:], self.draft_probs[n:]),
        )


class Ouroboros:
    """Phrase drafting with the draft model, a phrase pool and candidate suffixes (see the module).

    Blocks: ``pacer_propose`` returns exactly ``min(num_tokens, gamma - len(draft))`` tokens (fewer
    only at EOS); tokens a multi-token forward produced beyond that are kept and served first by
    the next call of the same step (PACER's next block), so no draft forward is wasted.
    """

    def __init__(self, config: OuroborosConfig, resources: Resources):
        self.config = config
        self.model = resources.draft
        self.phrase_length = config.level - 1
        self.pool = open_pool(config.pool_path, self.phrase_length, config.guess_set_size)
        self.window: list[list[int]] = []  # rows × columns of the lookahead window
        self._window_updates = 0
        self._surplus: Optional[tuple[list[int], _Drafted]] = None  # (context it continues, tokens)
        self.stats: Counter[str] = Counter()

    # -- hooks -----------------------------------------------------------------------------------
    @hookimpl
    def pacer_start(self, state) -> None:
        self.model.reset()
        if not self.config.warm_start:
            self.pool.clear()
        prompt, n = state.tokens, self.phrase_length
        if self.config.prompt_phrases:
            self.pool.add_all(ngram_pairs(prompt, n))
        # the window starts as tokens picked from the prompt (lookahead decoding's initialisation)
        picks = torch.randint(len(prompt), (n, self.config.window_size), generator=torch.Generator().manual_seed(0))
        self.window = [[prompt[int(j)] for j in row] for row in picks] if self.config.window_size else []
        self._window_updates = 0
        self._surplus = None
        self.stats = Counter()

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        cap = self.config.gamma - len(draft) if self.config.gamma else num_tokens
        want = min(num_tokens, cap)
        if want <= 0 or (len(draft) and int(draft.tokens[-1]) in state.eos_token_ids):
            return None
        context = state.tokens + draft.tokens.tolist()
        drafted, forwards = self._take_surplus(context), 0
        while len(drafted) < want and not (drafted.tokens and drafted.tokens[-1] in state.eos_token_ids):
            drafted = drafted + self._draft_forward(context + drafted.tokens)
            forwards += 1
        eos = [i for i, t in enumerate(drafted.tokens) if t in state.eos_token_ids]
        block, rest = drafted.split(min(want, eos[0] + 1) if eos else want)
        self._surplus = (context + block.tokens, rest) if len(rest) and not eos else None
        key = block.tokens[-1]
        candidates = [] if key in state.eos_token_ids else self.pool.get(key, self.config.topk)
        first = draft.num_nodes + len(block)  # tree index of this block's first side node
        side = SideNodes.trie(candidates, parent=first - 1, first=first)  # point masses
        return DraftBlock(
            tokens=torch.tensor(block.tokens, dtype=torch.long),
            draft_probs=block.draft_probs,
            hidden_states=block.hidden_states,
            side=side,
            forwards=forwards,
            sampled=False,
        )

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self._surplus = None
        sync_cache(self.model, state.tokens)  # roll the draft cache back to the committed tokens
        draft = step.draft
        main_nodes = set(draft.path_nodes)
        self.stats["branch_tokens"] += sum(1 for i in step.verdict.nodes(draft) if i not in main_nodes)
        learn_from_step(self.pool, state, step)

    @hookimpl
    def pacer_finish(self, state, result) -> dict:
        if self.config.pool_path:
            self.pool.save(self.config.pool_path)
        s = self.stats
        return {
            "ouroboros_draft_forwards": s["forwards"],
            "ouroboros_multi_token_forwards": s["multi_token_forwards"],
            "ouroboros_phrase_tokens": s["phrase_tokens"],
            "ouroboros_branch_tokens": s["branch_tokens"],
            "ouroboros_pool_phrases": len(self.pool),
        }

    # -- drafting --------------------------------------------------------------------------------
    def _take_surplus(self, context: list[int]) -> _Drafted:
        if self._surplus is not None and self._surplus[0] == context:
            return self._surplus[1]
        hidden = self.model.hidden_size
        return _Drafted([], torch.empty(0, hidden), torch.empty(0, self.model.vocab_size))

    def _draft_forward(self, context: list[int]) -> _Drafted:
        """One draft forward continuing ``context``: the greedy next token, plus the tokens of the
        longest pool phrase that agrees with the draft model's greedy chain and the token after it."""
        model = self.model
        feed = sync_cache(model, context)
        cached = len(model.cached_tokens)
        room = model.max_length - cached - len(feed)  # positions left after the last main token
        phrases = [list(p[:room]) for p in self.pool.get(context[-1])] if room > 0 else []
        rows, cols = len(self.window), self.config.window_size
        window = self.window if rows and rows + cols - 1 <= room else []
        n_window = len(window) * cols
        tokens = feed + [t for row in window for t in row] + [t for p in phrases for t in p]
        tree = (
            lookahead_layout(len(feed), len(window), cols, [len(p) for p in phrases])
            if len(tokens) > len(feed)
            else (None, None)
        )
        out = model.forward(tokens, positions=tree[0], tree_mask=tree[1], logits_from=len(feed) - 1, hidden=True)
        model.crop(cached + len(feed))  # drop the window and the phrases: only the main chain is kept
        logits = out.logits  # [1 + n_window + Σ len(p), vocab]: the last main token's row first
        hidden = out.hidden_states[len(feed) - 1 :]  # rows aligned with logits
        argmax = logits.argmax(-1).tolist()
        # the guess set: the phrase agreeing longest with the draft's greedy chain
        chain = [0]  # rows whose argmax is the next draft token
        start = 1 + n_window
        for phrase in phrases:
            rows_p = list(range(start, start + len(phrase)))
            start += len(phrase)
            matched = 0
            while matched < len(phrase) and phrase[matched] == argmax[([0] + rows_p)[matched]]:
                matched += 1
            if matched + 1 > len(chain):
                chain = [0] + rows_p[:matched]
        if window:
            self._lookahead_step(argmax[1 + n_window - cols : 1 + n_window])
        self.stats.update(forwards=1, phrase_tokens=len(chain) - 1, multi_token_forwards=int(len(chain) > 1))
        return _Drafted([argmax[r] for r in chain], hidden[chain].float(), torch.softmax(logits[chain], -1).cpu())

    def _lookahead_step(self, last_row_argmax: list[int]) -> None:
        """Jacobi update of the lookahead window: harvest one phrase per column (row 0 is the key,
        rows 1… and the new guess the phrase), then shift the rows up and append the new guesses."""
        self._window_updates += 1
        window = self.window
        if self._window_updates >= len(window):  # rows 1… hold the draft model's own guesses by now
            for i, new in enumerate(last_row_argmax):
                self.pool.add(window[0][i], [row[i] for row in window[1:]] + [new])
        self.window = window[1:] + [list(last_row_argmax)]


@hookimpl
def pacer_components() -> list[Component]:
    return [
        Component(
            "drafter",
            "ouroboros",
            OuroborosConfig,
            Ouroboros,
            "Ouroboros: the draft model drafts phrase by phrase from a phrase pool; candidate "
            "suffixes are verified in the same target pass (greedy only)",
            needs={"draft_model", "greedy"},
            provides={"draft_probs", "draft_hidden"},
            default_draft=shipped_draft(),
            cost_kind="token",
        ),  # a draft model's forwards
    ]
