"""Trees over one block: a block drafter's rows (one draft forward gives the distribution of every
position of the block) read as independent positions, the likeliest nodes taken best-first (DDTree's
construction, ``block_tree``) and handed out level by level (``BlockTree.next_levels``); docs/block-drafts.md.
Nothing here touches a model; randomness is not used.
"""

from __future__ import annotations

import heapq
from typing import Any, Optional

import attrs
import torch

from .draft_values import DraftBlock, DraftVocab, SideNodes


@attrs.define
class BlockTree:
    """The likeliest nodes of a tree over one block (``block_tree``), handed out level by level.

    ``nodes[i]`` = (depth 0.., token, parent index in ``nodes`` or -1), parents first; ``main``: the
    main path's node indices (each row's argmax, while taken). ``given`` maps the nodes already in
    the draft to their draft-tree numbers; ``depth`` is the deepest level given."""

    nodes: list[tuple[int, int, int]]
    main: list[int]
    rows: torch.Tensor  # [D, w]: the block's rows (over draft_vocab.ids when given)
    hidden: Optional[torch.Tensor]  # [D, h]
    draft_vocab: Optional[DraftVocab] = None
    given: dict[int, int] = attrs.field(factory=dict)
    depth: int = 0

    def next_levels(self, levels: int, first: int, forwards: int = 0) -> Optional[DraftBlock]:
        """The nodes of the next ``levels`` levels as a block whose first node is numbered ``first``
        in the draft tree (its main path first, then its side nodes, as ``Draft.tree`` numbers a
        block); every deeper node too once the main path ends among them (a block continues the
        main path, so none could follow). None when nothing is left."""
        top = self.depth + levels
        main = [i for i in self.main if self.depth <= self.nodes[i][0] < top]
        if not main:
            return None
        if main[-1] == self.main[-1]:  # the main path ends here: the rest hangs off what is given
            top = max(d for d, _, _ in self.nodes) + 1
        on_main = set(main)
        side = [i for i, (d, _, _) in enumerate(self.nodes) if self.depth <= d < top and i not in on_main]
        for j, i in enumerate(main + side):
            self.given[i] = first + j
        self.depth = top

        # every node's row is its depth's row of the block: mapped, never copied per node
        side_nodes = None
        if side:
            parents = [self.given[self.nodes[i][2]] if self.nodes[i][2] >= 0 else -1 for i in side]
            side_nodes = SideNodes(
                torch.tensor([self.nodes[i][1] for i in side], dtype=torch.long),
                torch.tensor(parents, dtype=torch.long),
                self.rows,
                draft_vocab=self.draft_vocab,
                row_map=torch.tensor([self.nodes[i][0] for i in side], dtype=torch.long),
            )
        depths = torch.tensor([self.nodes[i][0] for i in main], dtype=torch.long)
        hidden = None if self.hidden is None else self.hidden[depths]
        return DraftBlock(
            tokens=torch.tensor([self.nodes[i][1] for i in main], dtype=torch.long),
            draft_probs=self.rows,
            hidden_states=hidden,
            side=side_nodes,
            forwards=forwards,
            sampled=False,
            draft_vocab=self.draft_vocab,
            row_map=depths,
        )


def block_tree(
    rows: torch.Tensor,
    hidden: Optional[torch.Tensor],
    topk: int,
    nodes: int,
    draft_vocab: Optional[DraftVocab] = None,
    eos: Any = frozenset(),
) -> Optional[BlockTree]:
    """The ``nodes`` most likely nodes of a tree over one block, taken best-first (DDTree).

    ``rows`` [D, w]: the draft's distribution of the token at depth d + 1 (over ``draft_vocab.ids``
    when given, else the vocabulary), read as independent of the path above it, so a node's joint
    probability is the product of its path's entries; each node tries the ``topk`` likeliest tokens
    of its depth's row. The likeliest unexpanded candidate is taken next (a heap: a taken node offers
    its first child and its next sibling), so every taken node's parent was taken before it and the
    result is the ``nodes`` nodes of highest joint probability; nothing grows past a token in ``eos``.
    The main path is the chain of first children from the root (the argmax of each row, while
    taken). ``hidden`` [D, h]: the draft's hidden state at each depth (the main path's are the
    blocks'). Children are chosen, not sampled (``sampled=False`` blocks). None when no token has
    probability > 0.

    Example: rows [[.6 a, .3 b], [.5 c, .4 d]], topk 2, nodes 3 → a (.6), b (.3), a→c (.3): handed
    out whole, the block's tokens [a, c] and a side node b under the root.
    """
    depth = int(rows.shape[0])
    k = min(topk, int(rows.shape[1]))
    if depth == 0 or nodes <= 0:
        return None
    top_p, top_x = rows.topk(k, dim=-1)  # [D, k]
    log_p = top_p.double().clamp_min(1e-300).log().tolist()
    p, columns = top_p.tolist(), top_x.tolist()
    ids = columns if draft_vocab is None else draft_vocab.ids[top_x.cpu()].tolist()
    taken: list[tuple[int, int, int]] = []  # (depth, rank, parent index in taken)
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, order, depth, rank, parent)
    order = 0

    def offer(d: int, r: int, parent: int, base: float) -> None:
        nonlocal order
        if d < depth and r < k and p[d][r] > 0:
            heapq.heappush(heap, (-(base + log_p[d][r]), order, d, r, parent))
            order += 1

    offer(0, 0, -1, 0.0)
    while heap and len(taken) < nodes:
        score, _, d, r, parent = heapq.heappop(heap)
        taken.append((d, r, parent))
        me = len(taken) - 1
        offer(d, r + 1, parent, -score - log_p[d][r])  # the next sibling: same parent's score
        if ids[d][r] not in eos:
            offer(d + 1, 0, me, -score)
    if not taken:
        return None
    main = [0]  # the first children from the root, while taken
    child_of = {(parent, r): i for i, (_, r, parent) in enumerate(taken)}
    while (main[-1], 0) in child_of:
        main.append(child_of[main[-1], 0])
    return BlockTree([(d, int(ids[d][r]), parent) for d, r, parent in taken], main, rows, hidden, draft_vocab)
