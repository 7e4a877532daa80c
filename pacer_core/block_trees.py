"""Trees over one block: a block drafter's rows (one draft forward gives the distribution of every
position of the block) read as independent positions, each node's row reweighted for its own path where
the drafter says so (its priors along a side path), the likeliest nodes taken best-first (DDTree's
construction, ``block_tree``) and handed out level by level (``BlockTree.next_levels``); docs/block-drafts.md.
Nothing here touches a model; randomness is not used.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Optional

import attrs
import numpy as np
import torch

from .draft_values import DraftBlock, DraftVocab, SideNodes


@attrs.define
class BlockTree:
    """The likeliest nodes of a tree over one block (``block_tree``), handed out level by level.

    ``nodes[i]`` = (depth 0.., token, parent index in ``nodes`` or -1), parents first; ``main``: the
    main path's node indices (each row's argmax, while taken). ``row_of[i]``: the row of ``rows`` node
    i was chosen from (its depth's, or one reweighted for its parent's path).
    ``given`` maps the nodes already in the draft to their draft-tree numbers; ``depth`` is the
    deepest level given."""

    nodes: list[tuple[int, int, int]]
    main: list[int]
    rows: torch.Tensor  # [D + m, w]: the block's rows, then m reweighted ones (over draft_vocab.ids when given)
    hidden: Optional[torch.Tensor]  # [D, h]
    row_of: list[int]
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

        # every node's row is a row of the table (its depth's, or its parent's path's): mapped, never copied
        row_of = self.row_of
        side_nodes = None
        if side:
            parents = [self.given[self.nodes[i][2]] if self.nodes[i][2] >= 0 else -1 for i in side]
            side_nodes = SideNodes(
                torch.tensor([self.nodes[i][1] for i in side], dtype=torch.long),
                torch.tensor(parents, dtype=torch.long),
                self.rows,
                draft_vocab=self.draft_vocab,
                row_map=torch.tensor([row_of[i] for i in side], dtype=torch.long),
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
            row_map=torch.tensor([row_of[i] for i in main], dtype=torch.long),
        )


# A node's children are read from its depth's row reweighted for the node's own path: ``reweight(depth,
# path)`` gives {column: Δ}, log-weights relative to that row (whose priors followed the main path), {} to
# read the row as it is; the drafter's priors along a side path (``BlockDrafter._path_reweight``).
Reweight = Callable[[int, list[int]], dict[int, float]]


@attrs.define
class _Children:
    """One node's candidate children: their (log-probability, column), likeliest first, read from row
    ``depth`` reweighted by exp(Δ) / z on Δ's ``columns`` (none: the row as it is); ``row``: the
    row of the tree's table they are read from, None until one of them is taken."""

    depth: int
    options: list[tuple[float, int]]
    columns: np.ndarray  # [c] int64: the columns Δ names
    weighted: np.ndarray  # [c] float64: p e^Δ / z there
    z: float
    row: Optional[int]


def _children(table: np.ndarray, d: int, k: int, delta: dict[int, float], ranked: dict) -> _Children:
    """The ``k`` likeliest children at depth ``d`` from row d (``table`` [D, w] float32) reweighted by
    exp(``delta``): p_c e^Δ_c / z for the columns Δ names, p_c / z for the rest, z = 1 + Σ p_c (e^Δ_c − 1);
    ``ranked`` caches each row's likeliest columns (a reweighted row's top k lie among the row's top
    k + |Δ| and the columns Δ names)."""
    width = table.shape[1]
    n = min(k + len(delta), width)
    if len(ranked.get(d, ((), ()))[0]) < n:  # a few more than asked: the next side path's Δ may name more
        m = min(max(n, 128), width)
        top = np.argpartition(-table[d], m - 1)[:m] if m < width else np.arange(width)
        top = top[np.lexsort((top, -table[d, top]))]  # likeliest first, ties by column (as argmax_first)
        ranked[d] = (top.tolist(), table[d, top].astype(np.float64).tolist())
    columns, probs = ranked[d]
    if not delta:
        kept = [(math.log(p), c) for p, c in zip(probs[:k], columns[:k]) if p > 0]
        return _Children(d, kept, np.empty(0, np.int64), np.empty(0), 1.0, d)
    named = np.fromiter(delta.keys(), np.int64, len(delta))
    at = table[d, named].astype(np.float64)
    weighted = at * np.exp(np.fromiter(delta.values(), np.float64, len(delta)))
    z = 1.0 + float((weighted - at).sum())
    weighted /= z
    others: list[tuple[float, int]] = []  # the row's likeliest columns Δ does not name
    for p, c in zip(probs, columns):
        if c not in delta:
            others.append((p / z, c))
            if len(others) == k:
                break
    options = sorted(others + list(zip(weighted.tolist(), named.tolist())), key=lambda o: -o[0])[:k]
    kept = [(math.log(p), c) for p, c in options if p > 0]  # stable: ties keep the row's own order first
    return _Children(d, kept, named, weighted, z, None)


def _table(rows: torch.Tensor, table: np.ndarray, families: list[_Children]) -> torch.Tensor:
    """The tree's rows: the block's, then each reweighted family's (row d / z, p e^Δ / z on Δ's columns)."""
    extra = np.stack([table[f.depth] / np.float32(f.z) for f in families])
    for i, f in enumerate(families):
        extra[i, f.columns] = f.weighted
    return torch.from_numpy(np.concatenate([table, extra])).to(rows.device, rows.dtype)  # numpy: one plain copy


def block_tree(
    rows: torch.Tensor,
    hidden: Optional[torch.Tensor],
    topk: int,
    nodes: int,
    draft_vocab: Optional[DraftVocab] = None,
    eos: Any = frozenset(),
    reweight: Optional[Reweight] = None,
) -> Optional[BlockTree]:
    """The ``nodes`` most likely nodes of a tree over one block, taken best-first (DDTree).

    ``rows`` [D, w]: the draft's distribution of the token at depth d + 1 (over ``draft_vocab.ids``
    when given, else the vocabulary), read as independent of the path above it, so a node's joint
    probability is the product of its path's entries; each node tries the ``topk`` likeliest tokens
    of its depth's row, reweighted for its own path by ``reweight`` when given (the priors of a side
    path: its children's row is then a row of its own in the tree's table). The likeliest unexpanded
    candidate is taken next (a heap: a taken node offers its first child and its next sibling), so
    every taken node's parent was taken before it and the result is the ``nodes`` nodes of highest
    joint probability; nothing grows past a token in ``eos``. The main path is the chain of first
    children from the root (the argmax of each row, while taken). ``hidden`` [D, h]: the draft's
    hidden state at each depth (the main path's are the blocks'). Children are chosen, not sampled
    (``sampled=False`` blocks). None when no token has probability > 0.

    Example: rows [[.6 a, .3 b], [.5 c, .4 d]], topk 2, nodes 3 → a (.6), b (.3), a→c (.3): handed
    out whole, the block's tokens [a, c] and a side node b under the root. With ``reweight`` giving
    b's children {d: log 2}, row 1 under b is [.5 c, .8 d] / 1.4 (z = 1 + .4 × (2 − 1)): b's first
    child is d (.3 × .8 / 1.4 ≈ .17), not c, and reads a row of its own.
    """
    depth, width = int(rows.shape[0]), int(rows.shape[1])
    k = min(topk, width)
    if depth == 0 or nodes <= 0:
        return None
    vocab_ids = None if draft_vocab is None else draft_vocab.ids.numpy()
    table = rows.detach().cpu().float().numpy()
    ranked: dict[int, tuple[list[int], list[float]]] = {}
    families = [_children(table, 0, k, {}, ranked)]  # the root's children, then each taken node's
    taken: list[tuple[int, int, int]] = []  # (family, rank, parent index in taken)
    paths: list[list[int]] = []  # each taken node's tokens, root first
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, order, family, rank, parent)
    order = 0

    def offer(f: int, r: int, parent: int, base: float) -> None:
        nonlocal order
        if r < len(families[f].options):
            heapq.heappush(heap, (-(base + families[f].options[r][0]), order, f, r, parent))
            order += 1

    offer(0, 0, -1, 0.0)
    while heap and len(taken) < nodes:
        score, _, f, r, parent = heapq.heappop(heap)
        family = families[f]
        column = family.options[r][1]
        token = column if vocab_ids is None else int(vocab_ids[column])
        taken.append((f, r, parent))
        paths.append((paths[parent] if parent >= 0 else []) + [token])
        offer(f, r + 1, parent, -score - family.options[r][0])  # the next sibling: same parent's score
        d = family.depth + 1
        if d < depth and token not in eos:
            delta = reweight(d, paths[-1]) if reweight is not None else {}
            families.append(_children(table, d, k, delta, ranked))
            offer(len(families) - 1, 0, len(taken) - 1, -score)
    if not taken:
        return None
    own: list[_Children] = []  # a reweighted row joins the table once one of its children is taken
    for f, _, _ in taken:
        if families[f].row is None:
            families[f].row = depth + len(own)
            own.append(families[f])
    all_rows = _table(rows, table, own) if own else rows
    main = [0]  # the first children from the root, while taken
    child_of = {(parent, r): i for i, (_, r, parent) in enumerate(taken)}
    while (main[-1], 0) in child_of:
        main.append(child_of[main[-1], 0])
    tree_nodes = [(families[f].depth, paths[i][-1], parent) for i, (f, _, parent) in enumerate(taken)]
    node_rows = [int(families[f].row) for f, _, _ in taken]  # type: ignore[arg-type]
    return BlockTree(tree_nodes, main, all_rows, hidden, node_rows, draft_vocab)
