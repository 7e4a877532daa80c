"""Growing a draft token tree level by level (EAGLE-2-style dynamic trees), as pure functions.

A tree drafter (``eagle`` and ``draft_model`` with ``tree: {...}``) grows one level per draft
forward. Level 1 takes the ``topk`` most likely tokens of the draft's distribution after the last
committed token. Each later level feeds every node of the previous level in one tree-masked draft
forward and picks, among the ``topk`` most likely children of each, the main-path child (the most
likely child of the current tip: the draft's greedy chain, what stop policies judge) plus the
``topk - 1`` other children with the highest cumulative draft log-probability (a beam over the
tree). Once drafting ends the drafter sends the ``nodes`` nodes of highest cumulative draft
probability (EAGLE-2's re-ranking, ``best_nodes``). Children are chosen deterministically (top-k), so
the sampling verifier treats them as point masses: exact for any temperature, top-k or top-p
(docs/trees.md). Nothing here touches a model; randomness is not used.
"""

from __future__ import annotations

from typing import Optional

import attrs
import torch
from attrs import validators as v

from .types import Draft, DraftBlock, SideNodes, TokenTree


@attrs.define
class TreeConfig:
    """``tree: {topk, depth, nodes}`` on a model drafter; absent = a chain (one token per level)."""

    # defaults: wide and shallow, the stop policy decides the depth, the best 10 nodes sent: 5-8%
    # faster than sending every node and tied with 8 in timed runs on the 2-core CPU in fp32, and
    # about what the fastest shape of the bf16 sweep verified on average (docs/trees.md#sending-the-best-nodes)
    topk: int = attrs.field(default=6, validator=v.ge(1))  # children tried per node, nodes kept per level
    depth: int = attrs.field(default=8, validator=v.ge(1))  # levels per step at most (stop policies may stop earlier)
    nodes: int = attrs.field(default=10, validator=v.ge(1))  # nodes sent for verification at most (the best by score)


@attrs.frozen
class Candidate:
    """A chosen child: ``row`` of the expanded nodes it continues, its token, its cumulative score."""

    row: int
    token: int
    score: float


def grow_level(scores: torch.Tensor, probs: torch.Tensor, tip_row: Optional[int], topk: int,
               room: int) -> list[Candidate]:
    """The next level's nodes: the main-path child first (when ``tip_row`` is given), then side nodes.

    ``scores``: [f] cumulative log-probabilities of the f expanded nodes (0 for the root);
    ``probs``: [f, vocab] the draft's distribution after each (sampling parameters applied, so
    filtered-out tokens have probability 0 and are never chosen); ``tip_row``: the row of the main
    path's tip among them, or None when the main path has ended; ``room``: nodes left in the budget.
    Returns at most ``min(topk, room)`` candidates, ranked by cumulative score after the main one.
    """
    if room <= 0 or probs.shape[0] == 0:
        return []
    k = min(topk, int(probs.shape[1]))
    top_p, top_x = probs.topk(k, dim=-1)  # [f, k]
    total = scores[:, None] + top_p.clamp_min(1e-38).log()  # [f, k]
    total = torch.where(top_p > 0, total, torch.full_like(total, float("-inf")))
    chosen: list[Candidate] = []
    taken: set[tuple[int, int]] = set()
    if tip_row is not None and bool(top_p[tip_row, 0] > 0):
        chosen.append(Candidate(tip_row, int(top_x[tip_row, 0]), float(total[tip_row, 0])))
        taken.add((tip_row, 0))
    order = total.flatten().argsort(descending=True, stable=True).tolist()
    for flat in order:
        if len(chosen) >= min(topk, room):
            break
        row, j = divmod(flat, k)
        if (row, j) in taken or not bool(top_p[row, j] > 0):
            continue
        chosen.append(Candidate(row, int(top_x[row, j]), float(total[row, j])))
        taken.add((row, j))
    return chosen[: min(topk, room)]


def merge_phrases(tokens: list[int], parents: list[int], phrases: list[list[int]], first: int,
                  budget: int, parent: int = -1) -> tuple[list[int], list[int], list[list[int]]]:
    """Phrases continuing node ``parent`` merged into an existing tree (shared prefixes reuse nodes).

    ``tokens``/``parents``: the tree so far (node i's token and parent, -1 the root); each phrase
    walks down from ``parent`` through existing children with its tokens and adds the rest as new
    nodes, numbered from ``first``, at most ``budget`` of them (phrases in order; a phrase that does
    not fit is cut). Returns (new tokens, their parents, for each phrase its node path).
    """
    children: dict[tuple[int, int], int] = {}
    for i, (t, p) in enumerate(zip(tokens, parents)):
        children.setdefault((p, t), i)
    new_tokens: list[int] = []
    new_parents: list[int] = []
    paths: list[list[int]] = []
    for phrase in phrases:
        at, path = parent, []
        for token in map(int, phrase):
            node = children.get((at, token))
            if node is None:
                if len(new_tokens) >= budget:
                    break
                node = children[(at, token)] = first + len(new_tokens)
                new_tokens.append(token)
                new_parents.append(at)
            path.append(node)
            at = node
        paths.append(path)
    return new_tokens, new_parents, paths


def phrase_block(phrases: list[list[int]], draft: Draft) -> Optional[DraftBlock]:
    """A model-free drafter's block from candidate phrases continuing the draft's main path, best
    first: the first phrase is the block's tokens (the main path), the others hang off the same
    node as side nodes, merged into a trie with it (no two siblings repeat a token). All are point
    masses (no draft probabilities, ``sampled=False``). None when there is no non-empty first phrase.
    """
    if not phrases or not phrases[0]:
        return None
    main = [int(t) for t in phrases[0]]
    parent = draft.path_nodes[-1] if len(draft) else -1  # the main path's tip (-1: the root)
    # the main phrase first in the trie: its nodes are the block's tokens, numbered from
    # draft.num_nodes; the other phrases share its prefix and follow as side nodes
    trie = SideNodes.trie([main] + [list(p) for p in phrases[1:]], parent=parent, first=draft.num_nodes)
    side = None
    if len(trie) > len(main):
        side = SideNodes(trie.tokens[len(main):], trie.parents[len(main):])
    return DraftBlock(tokens=torch.tensor(main, dtype=torch.long), side=side, sampled=False)


def best_nodes(tree: TokenTree, nodes: int) -> Optional[list[int]]:
    """The nodes of ``tree`` a tree drafter sends for verification: the ``nodes`` most likely by
    cumulative draft probability (the product of ``q(token | parent)`` down the node's root path,
    ties to the earlier node), plus every node without a draft probability (a point mass another
    source merged in, e.g. a ``hybrid`` member's phrase) with its ancestors. A node is never more
    likely than its parent, so the chosen nodes hang together. None when everything fits.
    """
    n = len(tree)
    if n <= nodes or tree.draft_probs is None:
        return None
    q = tree.draft_probs.gather(1, tree.tokens[:, None])[:, 0].double()  # [N]: q(token | its parent's path)
    parents = tree.parents.tolist()
    score = [0.0] * n
    own = (q > 0).tolist()
    for i, parent in enumerate(parents):
        score[i] = (float(q[i].log()) if own[i] else 0.0) + (score[parent] if parent >= 0 else 0.0)
    ranked = sorted((i for i in range(n) if own[i]), key=lambda i: (-score[i], i))
    keep = set(ranked[:nodes])
    for i in range(n):
        if not own[i]:
            keep.add(i)
            parent = parents[i]
            while parent >= 0:
                keep.add(parent)
                parent = parents[parent]
    return sorted(keep)
