"""The context vocabulary (``context_vocab``, docs/draft.md, "The context vocabulary and the priors"): a
draft whose head is the target's output layer over a subset of its vocabulary can say only that
subset; the committed tokens (prompt and answer so far) outside it join the head within a
generation, each as a new column at the end with its own row of the target's output layer. A
phrase of the context then stays drafting-reachable, rare identifiers included, which the lookup
prior raises only where a token has a column.

The ``eagle`` and ``dflash`` drafters share this one table (``pard`` holds it ungrown, over its own
model's vocabulary): they read the committed text into it, join the added columns to their head's
logits (``logits``) and hand out their rows with ``draft_vocab``, whose column map grows with the
table (earlier blocks keep theirs).
"""

from __future__ import annotations

from typing import Optional

import torch

from .draft_values import DraftVocab
from .sampling import take_rows


class ContextVocab:
    """The draft's columns: the ``subset`` of a target vocabulary of ``vocab_size`` tokens, then, when
    ``grow``, each committed token outside it, with its row of ``target_head`` ([vocab_size, hidden])."""

    def __init__(self, subset: torch.Tensor, vocab_size: int, target_head: Optional[torch.Tensor], grow: bool, dtype):
        self.subset = subset.cpu()
        self.vocab_size = vocab_size
        self.target_head = target_head
        self.grow = grow and target_head is not None
        self.dtype = dtype
        self._subset_columns = [-1] * vocab_size  # the draft's column of each token id, -1: none
        for column, token in enumerate(self.subset.tolist()):
            self._subset_columns[token] = column
        # the subset is the target's vocabulary in order (a published EAGLE-1/2 head): its rows need no map
        self._subset_whole = bool(torch.equal(self.subset, torch.arange(vocab_size)))
        self.reset()

    def reset(self) -> None:
        """The subset alone: the start of a generation."""
        self.ids = self.subset  # [w] target id of each column
        self.id_list: list[int] = self.ids.tolist()  # the same, read once
        self.column = list(self._subset_columns)  # each token id's column, -1: none (a list: read per token)
        self.whole = self._subset_whole  # the columns are the target's vocabulary in order
        self.extra_head: Optional[torch.Tensor] = None  # [extra, hidden]: the target's rows of the added tokens
        self._draft_vocab = DraftVocab(self.ids, self.vocab_size, self.column)
        self.scanned = 0  # committed tokens already read

    @property
    def draft_vocab(self) -> Optional[DraftVocab]:
        """What the rows' columns are (None: the whole vocabulary, in order)."""
        return None if self.whole else self._draft_vocab

    def read(self, context: list[int]) -> tuple[list[int], int]:
        """Read the tokens of ``context`` (committed tokens, which only grow within a generation) not
        read yet; add those outside the columns (when growing). Returns the new distinct tokens, in
        order, and how many columns were added."""
        new = list(dict.fromkeys(context[self.scanned :]))
        self.scanned = len(context)
        column = self.column
        outside = [t for t in new if column[t] < 0] if self.grow else []
        if outside:
            assert self.target_head is not None
            rows = take_rows(self.target_head, outside).to(self.dtype)
            self.extra_head = rows if self.extra_head is None else torch.cat([self.extra_head, rows])
            for j, token in enumerate(outside, start=len(self.id_list)):
                column[token] = j
            self.ids = torch.cat([self.ids, torch.tensor(outside, dtype=torch.long)])
            self.id_list += outside
            self.whole = False
            self._draft_vocab = DraftVocab(self.ids, self.vocab_size, column)  # a new one: earlier blocks keep theirs
        return new, len(outside)

    def logits(self, hidden: torch.Tensor, head_logits: torch.Tensor) -> torch.Tensor:
        """[k, subset] logits of the draft's head at ``hidden`` [k, hidden] → [k, columns]: the added
        tokens' logits joined on."""
        if self.extra_head is None:
            return head_logits
        return torch.cat([head_logits, (hidden @ self.extra_head.T).to(head_logits.dtype)], -1)
