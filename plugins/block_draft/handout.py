"""What every block drafter shares (``dflash``, ``pard``): one draft forward gives a block of rows, the
draft distributions of the next ``block`` tokens, and this base hands them out.

Chains: the block's tokens are handed to the stop policies as they ask (``fixed(4)`` takes four at
once, a policy judging each token takes one per call, with no new forward until the block is used
up); once it is, a further block is one more forward, conditioned on the tokens drafted so far in
the step (PACER's "draft more"). Under greedy decoding each token is its row's argmax; under
sampling it is drawn from its row, rows independently (each row is a draft distribution like any
other: the verifiers stay exact). Nothing is drafted past an end-of-sequence token.

Trees (``tree: {...}``): the block's rows are read as independent distributions of the tokens at
depths 1..block, and the nodes of highest joint probability are taken best-first
(``pacer_core.block_trees.block_tree``: DDTree's construction), then sent by ``tree.nodes`` (a number or
``auto``). A tree deeper than the block reads further blocks, each one more forward conditioned on
the main path drafted before it (each row's argmax), as a chain's further block is; the tree is
built once a step, from all its rows, and handed out level by level as the stop policies ask.

The context priors (pacer_core/priors.py, as the ``eagle`` drafter applies them): row i's logits get
``lookup_bias``'s b_n added for every token that followed an earlier occurrence, in the committed
text, of the last n tokens of its path (the committed text, then the tokens chosen at the rows
before it), and ``corpus_bias`` × share for the successors of the path's longest frequent n-gram in
a corpus of the target's own answers; so the rows are read in order. In a tree the rows are biased
along the main path (each row's argmax), and a side node's children are read from its depth's row
reweighted for the side node's own path (``_path_reweight``), as the ``eagle`` drafter biases each
node's row by its own path. The distribution a token is drawn from is the one the verifier is told,
so every verifier stays exact (a tree's children are chosen, verified as point masses).

A subclass sets ``sampling``, ``tree``, ``budget`` (``pacer_core.trees.node_budget`` with cost kind
``block``, None for a chain), ``columns`` (a ``pacer_core.context_vocab.ContextVocab``: its rows'
columns, the draft's vocabulary then, with ``context_vocab``, the committed tokens outside it, read
at the start of each step), ``block``, ``lookup_bias`` (``pacer_core.priors.lookup_bias_for``),
``corpus_bias`` and ``corpus`` (``pacer_train.corpus.prior.corpus_prior``: the bias, and the
successor table, None where the bias is 0), and implements ``_forward`` (one forward: logits and
hidden states over ``columns``), ``_ready`` (whether it can draft after these committed tokens)
and ``_reset`` (its own state at the start of a generation).
"""

from __future__ import annotations

from typing import Optional

import attrs
import numpy as np
import torch

from pacer_core import DraftBlock, DraftVocab, hookimpl
from pacer_core.block_trees import BlockTree, Reweight, block_tree
from pacer_core.context_vocab import ContextVocab
from pacer_core.priors import CorpusSuccessors, SuccessorIndex, path_bonus
from pacer_core.sampling import argmax_first, logits_to_probs, sample
from pacer_core.tree_hooks import BudgetedTree
from pacer_core.types import StepWatch


@attrs.define
class Block:
    """The latest block of the step's main path: the drafted tokens it was conditioned on, its tokens,
    rows and hidden states, and how many were handed out."""

    known: list[int]
    tokens: list[int]
    rows: torch.Tensor  # [block, draft vocabulary]
    hidden: Optional[torch.Tensor]  # [block, hidden]
    handed: int = 0


class BlockDrafter(BudgetedTree):
    """Hands out the blocks a subclass's forward drafts, as a chain or a tree over one block."""

    columns: ContextVocab
    lookup_bias: tuple[float, ...]
    corpus_bias: float
    corpus: Optional[CorpusSuccessors]

    def _forward(self, committed: list[int], known: list[int]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """One draft forward after the ``committed`` tokens and the ``known`` tokens drafted before it in
        this step: the logits of the next ``block`` tokens over the draft's vocabulary ([block, w] float32
        on the CPU, before the priors and the sampling parameters) and the draft's hidden states there
        ([block, h]); None when it cannot draft (nothing is proposed)."""
        raise NotImplementedError

    def _ready(self, committed: list[int]) -> bool:
        raise NotImplementedError

    def _reset(self) -> None:
        raise NotImplementedError

    @hookimpl
    def pacer_start(self, state) -> None:
        if self.budget is not None and state is not None and not state.sampling.greedy:
            self.budget.restart()  # auto's learned rate carries across greedy generations only
        self._reset()
        self.index = SuccessorIndex(len(self.lookup_bias))  # the committed text's n-grams → successors
        self.suffix_length = max(len(self.lookup_bias), self.corpus.longest if self.corpus is not None else 0)
        self.columns.reset()
        self.step = StepWatch()  # a step's first call drafts a new block
        self.latest: Optional[Block] = None  # a chain's latest block
        self.plan: Optional[BlockTree] = None  # a tree's nodes, handed out level by level
        self.plan_for = 0  # the draft's nodes the plan's next levels continue

    @property
    def draft_vocab(self) -> Optional[DraftVocab]:
        """What the rows' columns are now (None: the whole vocabulary, in order)."""
        return self.columns.draft_vocab

    def _token_ids(self, columns: torch.Tensor) -> list[int]:
        """Target token ids of the rows' ``columns``."""
        ids = self.columns.id_list
        return [ids[c] for c in columns.tolist()]

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, w] logits → the draft distributions (the sampling parameters applied)."""
        return torch.softmax(logits, -1) if self.sampling.greedy else logits_to_probs(logits, self.sampling)

    def _column_bonus(self, suffix: list[int], width: int, corpus: bool = True) -> dict[int, float]:
        """The priors' bonuses for the path ending ``suffix`` (``path_bonus``; the lookup prior's alone
        without ``corpus``), by column of the rows (the first ``width`` columns): a token outside the
        draft's vocabulary has no column to raise."""
        column = self.columns.column
        given = path_bonus(self.index, self.lookup_bias, self.corpus if corpus else None, self.corpus_bias, suffix)
        return {column[t]: v for t, v in given.items() if 0 <= column[t] < width}

    def _rows(
        self, logits: torch.Tensor, committed: list[int], known: list[int], generator: Optional[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's draft distributions ([n, w]) and each row's chosen column ([n]): drawn with
        ``generator``, or the argmax without one. With the priors, row i's logits first get the bonuses
        of the path before it: the ``committed`` text and the ``known`` tokens drafted before this block,
        then the tokens chosen at rows 0..i-1 (the lookup prior reads the committed text only)."""

        def choose(rows: torch.Tensor) -> torch.Tensor:
            if generator is None:
                return torch.tensor([argmax_first(row) for row in rows], dtype=torch.long)
            return sample(rows, generator)

        if not self.suffix_length:
            rows = self._probs(logits)
            return rows, choose(rows)
        self.index.extend(committed[len(self.index.text) :])  # the committed text never shrinks
        logits = logits.clone()  # [n, w] float32 on the CPU: the bonuses go in as numpy float32 additions
        values, width = logits.numpy(), logits.shape[1]
        suffix, rows, columns = (committed + known)[-self.suffix_length :], [], []
        for i in range(len(logits)):
            for at, value in self._column_bonus(suffix, width).items():
                values[i, at] += np.float32(value)
            probs = self._probs(logits[i : i + 1])
            column = choose(probs)
            rows.append(probs[0])
            columns.append(column)
            suffix = (suffix + self._token_ids(column))[-self.suffix_length :]
        return torch.stack(rows), torch.cat(columns)

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        new_step = self.step.starts(state)
        if new_step:
            self.latest = self.plan = None  # nothing drafted for this step yet
            self.columns.read(state.tokens)  # the committed tokens outside the draft's columns join them
        if not self._ready(state.tokens):
            return None
        if self.tree is not None:
            return self._propose_tree(state, draft, num_tokens, new_step)
        main = draft.tokens.tolist()
        latest, forwards = self.latest, 0
        if (
            latest is None
            or latest.handed >= len(latest.tokens)
            or main != latest.known + latest.tokens[: latest.handed]
        ):
            drafted = self._forward(state.tokens, main)
            if drafted is None:
                return None
            logits, hidden = drafted
            rows, columns = self._rows(logits, state.tokens, main, None if self.sampling.greedy else state.generator)
            latest = self.latest = Block(main, self._token_ids(columns), rows, hidden)
            forwards = 1
        first = latest.handed
        last = min(len(latest.tokens), first + num_tokens)
        for i in range(first, last):  # nothing is drafted past an end-of-sequence token
            if latest.tokens[i] in state.eos_token_ids:
                last = i + 1
                break
        latest.handed = last
        return DraftBlock(
            tokens=torch.tensor(latest.tokens[first:last], dtype=torch.long),
            draft_probs=latest.rows[first:last],
            hidden_states=None if latest.hidden is None else latest.hidden[first:last],
            forwards=forwards,
            sampled=not self.sampling.greedy,
            draft_vocab=self.draft_vocab,
        )

    def _tree_rows(self, state) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor], int, list[int]]]:
        """The rows of a tree ``tree.depth`` deep ([depth, w]), their hidden states, the forwards paid and
        the main path (each row's argmax): one block, then, while the tree is deeper, further blocks
        conditioned on the main path drafted so far (as a chain's further block), the priors along it."""
        main: list[int] = []
        rows: list[torch.Tensor] = []
        hidden: list[Optional[torch.Tensor]] = []
        while len(main) < self.tree.depth:
            drafted = self._forward(state.tokens, main)
            if drafted is None:
                if not rows:
                    return None
                break
            block_rows, columns = self._rows(drafted[0], state.tokens, main, None)
            rows.append(block_rows)
            hidden.append(drafted[1])
            tokens = self._token_ids(columns)
            main += tokens
            if any(t in state.eos_token_ids for t in tokens):
                break  # nothing grows past an end-of-sequence token on the main path
        depth = min(self.tree.depth, len(main))
        known = [h for h in hidden if h is not None]
        hidden_rows = torch.cat(known)[:depth] if len(known) == len(hidden) else None
        return torch.cat(rows)[:depth], hidden_rows, len(rows), main[:depth]

    def _path_reweight(self, committed: list[int], main: list[int]) -> Optional[Reweight]:
        """The lookup prior along a side path, relative to the main path's (``block_tree``'s ``reweight``):
        the children at depth d of a node whose path is ``path`` get the lookup bonuses of committed + path
        where row d has those of committed + main[:d] (divided by the temperature, as the row's logits
        were); None without a lookup prior. The corpus prior stays the main path's: re-reading it per
        side node cost more host time than its τ bought (docs/block-drafts.md#side-paths-own-priors)."""
        if not self.lookup_bias:
            return None
        width, longest = len(self.columns.id_list), len(self.lookup_bias)
        scale = 1.0 if self.sampling.greedy else 1.0 / self.sampling.temperature
        main_bonus: dict[int, dict[int, float]] = {}

        def bonus(path: list[int]) -> dict[int, float]:
            return self._column_bonus((committed + path)[-longest:], width, corpus=False)

        def reweight(d: int, path: list[int]) -> dict[int, float]:
            if path == main[:d]:
                return {}
            if d not in main_bonus:
                main_bonus[d] = bonus(main[:d])
            delta = bonus(path)
            for c, v in main_bonus[d].items():
                delta[c] = delta.get(c, 0.0) - v
            return {c: scale * v for c, v in delta.items() if v != 0.0}

        return reweight

    def _propose_tree(self, state, draft, num_tokens: int, new_step: bool) -> Optional[DraftBlock]:
        """The next ``num_tokens`` levels of this step's tree: the first call runs the forwards
        (``_tree_rows``) and takes the tree's likeliest nodes (``block_tree``), later calls hand out deeper
        levels of the same tree (no forward); a policy judging each token gets one level a call."""
        plan = self.plan
        if new_step:
            drafted = self._tree_rows(state)
            if drafted is None:
                return None
            rows, hidden, forwards, main = drafted
            depth = len(rows)
            cap = self.tree.nodes if isinstance(self.tree.nodes, int) else self.tree.topk * depth
            reweight = self._path_reweight(state.tokens, main)
            plan = self.plan = block_tree(
                rows, hidden, self.tree.topk, cap, self.draft_vocab, state.eos_token_ids, reweight
            )
            self.plan_for = 0
        elif plan is None or self.plan_for != draft.num_nodes:
            return None  # another drafter's block came last: this tree stops growing
        else:
            forwards = 0
        block = None if plan is None else plan.next_levels(num_tokens, draft.num_nodes, forwards)
        if block is not None:
            self.plan_for = draft.num_nodes + len(block) + (len(block.side) if block.side else 0)
        return block
