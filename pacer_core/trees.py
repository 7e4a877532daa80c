"""Growing a draft token tree level by level (EAGLE-2-style dynamic trees), as pure functions.

A tree drafter (``eagle`` and ``draft_model`` with ``tree: {...}``) grows one level per draft
forward, and as many levels per ``pacer_propose`` call as the stop policies ask for (``num_tokens``:
``fixed`` asks for the whole depth at once, a policy that judges every token for one). Level 1
takes the ``topk`` most likely tokens of the draft's distribution after the last committed token.
Each later level feeds every node of the previous level in one tree-masked draft
forward and picks, among the ``topk`` most likely children of each, the main-path child (the most
likely child of the current tip: the draft's greedy chain, what stop policies judge) plus the
``topk - 1`` other children with the highest cumulative draft log-probability (a beam over the
tree). Once drafting ends the drafter sends the ``nodes`` nodes of highest cumulative draft
probability (EAGLE-2's re-ranking, ``best_nodes``). Children are chosen deterministically (top-k), so
the sampling verifier treats them as point masses: exact for any temperature, top-k or top-p
(docs/trees.md). Nothing here touches a model; randomness is not used.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional, Sequence, cast

import attrs
import numpy as np
import torch
from attrs import validators as v

from .calibration import FILE as CALIBRATION_FILE
from .calibration import RAW, Calibration, check_draft
from .calibration import apply as calibrated
from .calibration import load as load_calibration
from .draft_values import Draft, DraftBlock, DraftVocab, SideNodes, TokenTree

MAX_TOPK = 64  # children tried per node and nodes kept per level, at most
MAX_DEPTH = 32  # levels per step, at most
MAX_NODES = 512  # nodes sent for verification, at most (EAGLE-2 sends 60 on a GPU)
AUTO = "auto"
CPU_NODES = 10  # ``tree: {}`` on a CPU: the fastest fixed budget measured there (docs/trees.md)


def _nodes(instance, attribute, value) -> None:
    if value is None or value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NODES:
        raise ValueError(f"tree.nodes must be 'auto' or a whole number in 1..{MAX_NODES}, got {value!r}")


def _calibration(instance, attribute, value) -> None:
    if value is None or value == RAW:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"tree.calibration must be a calibration file or '{RAW}', got {value!r}")
    load_calibration(value)  # a file that cannot be used is refused when the config is checked


@attrs.define
class TreeConfig:
    """``tree: {topk, depth, nodes, profile, calibration}`` on a model drafter; absent = a chain (one
    token per level)."""

    # defaults: wide and shallow, the stop policy decides the depth
    # children tried per node, nodes kept per level
    topk: int = attrs.field(default=6, validator=[v.ge(1), v.le(MAX_TOPK)])
    # levels per step at most (stop policies may stop earlier)
    depth: int = attrs.field(default=8, validator=[v.ge(1), v.le(MAX_DEPTH)])
    # nodes sent for verification: a number (the best by cumulative draft probability), 'auto' (per
    # step, the nodes that maximise expected emitted tokens per second under the cost profile), or
    # None: by device (CPU_NODES on a CPU, where a tree-masked forward costs more per node; 'auto'
    # elsewhere): docs/trees.md#cost-sized-trees-nodes-auto
    nodes: Any = attrs.field(default=None, validator=_nodes)
    # the cost profile 'auto' sizes trees with (a shipped name or a file, docs/costs.md); None: the
    # device's (a CPU: the shipped measured CPU profile; a GPU: the shipped published one)
    profile: Optional[str] = None
    # what 'auto' values nodes by: a calibration file (acceptance per depth and cumulative draft
    # probability, pacer_core.calibration), 'raw' (the raw cumulative probability), or None: the
    # draft folder's own calibration.json when it ships one, else raw (docs/trees.md#calibrated-values)
    calibration: Optional[str] = attrs.field(default=None, validator=_calibration)

    def budget(self, device: str) -> Any:
        """The nodes this tree sends on ``device``: a number or AUTO."""
        if self.nodes is not None:
            return self.nodes
        return CPU_NODES if str(device).startswith("cpu") else AUTO


class Candidate(NamedTuple):
    """A chosen child: ``row`` of the expanded nodes it continues, its token, its cumulative score."""

    row: int
    token: int
    score: float


def grow_level(
    scores: Sequence[float],
    probs: torch.Tensor,
    tip_row: Optional[int],
    topk: int,
    room: int,
    token_ids: Optional[Sequence[int]] = None,
) -> list[Candidate]:
    """The next level's nodes: the main-path child first (when ``tip_row`` is given), then side nodes.

    ``scores``: [f] float32 cumulative log-probabilities of the f expanded nodes (0 for the root; a
    list, array or CPU tensor); ``probs``: [f, vocab] float32, the draft's distribution after each
    (sampling parameters applied, so filtered-out tokens have probability 0 and are never chosen);
    ``tip_row``: the row of the main path's tip among them, or None when the main path has ended;
    ``room``: nodes left in the budget; ``token_ids``: the token id of each column of ``probs`` (a
    draft over a subset of the vocabulary), None when column j is token j. Returns at most
    ``min(topk, room)`` candidates, ranked by cumulative score after the main one.
    """
    if room <= 0 or probs.shape[0] == 0:
        return []
    k = min(topk, int(probs.shape[1]))
    top_p, top_x = probs.topk(k, dim=-1)  # [f, k]
    # read once on the host as numpy (f · k values; each small tensor operation costs more than the
    # numpy below): cumulative scores as float32 sums (numpy's float32 addition rounds as torch's; the
    # logarithms stay torch's), the candidates in flat order, only the chosen ones read into Python
    top_p, top_x = top_p.float().cpu(), top_x.cpu()
    log_p = top_p.clamp_min(1e-38).log_().numpy()
    totals = (np.asarray(scores, dtype=np.float32)[:, None] + log_p).ravel()
    p, columns = top_p.numpy().ravel(), top_x.numpy().ravel()
    limit = min(topk, room)
    tip = tip_row * k if tip_row is not None and p[tip_row * k] > 0 else -1  # the main-path child, first
    positive = p > 0
    if tip >= 0:
        positive[tip] = False
    # then the best others by cumulative score, ties in flat order (the sort is stable)
    others = np.flatnonzero(positive)
    picked = others[np.argsort(-totals[others], kind="stable")[: limit - (tip >= 0)]].tolist()
    if tip >= 0:
        picked.insert(0, tip)
    ids = columns[picked].tolist()
    if token_ids is not None:
        ids = [token_ids[column] for column in ids]
    return [Candidate(i // k, token, score) for i, token, score in zip(picked, ids, totals[picked].tolist())]


def merge_phrases(
    tokens: list[int], parents: list[int], phrases: list[list[int]], first: int, budget: int, parent: int = -1
) -> tuple[list[int], list[int], list[list[int]]]:
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


class GrownLevels:
    """The levels one ``pacer_propose`` call of a tree drafter grows, gathered into one block: each
    level's first chosen child continues the block's main path, its others are side nodes. A child
    names its parent by row: ``chosen[i].row`` indexes the level before it, or for the call's first
    level ``expanded``, the draft-tree numbers of the nodes it grows from (the main path's tip first;
    ``[-1]``: the root). ``block`` numbers every node once, as ``Draft.tree`` numbers a block (its main
    path first, then its side nodes in the order grown), and gives the last level's numbers, the
    nodes the drafter's next call grows from: no node has a number before the block has.

    Worked example: expanded [2] (the draft's tip); level 1 chooses a and b, both row 0 (under node 2);
    level 2 chooses c (row 0: under a), d and e (row 1: under b). ``block(first=3)``: the main path a c
    is 3 4, the side nodes b d e are 5 6 7 with parents 2 5 5; the last level's numbers are [4, 6, 7].
    """

    def __init__(self, expanded: Sequence[int] = (-1,)) -> None:
        self.expanded = list(expanded)
        self.levels: list[tuple[list[int], list[int], list[int]]] = []  # (tokens, parent rows, table rows)
        self.hidden: list[Optional[torch.Tensor]] = []  # each level's main-path child's hidden state
        self.tables: list[torch.Tensor] = []  # the levels' rows (distinct tensors), joined by ``block``
        self.rows = 0  # rows in the tables before the latest
        self.used = 0  # rows of the tables up to the last one a node maps to

    def __len__(self) -> int:
        return len(self.levels)

    def add(
        self,
        chosen: Sequence[Candidate],
        rows: Any,
        hidden: Optional[torch.Tensor] = None,
        row_map: Optional[Sequence[int]] = None,
    ) -> None:
        """One level: ``chosen[0]`` continues the main path (a child of the tip), the others are side
        nodes, each under the node its ``row`` indexes in the level before; ``rows[i]`` is the
        distribution chosen[i] was chosen from ([len(chosen), w], or rows to stack), or
        ``rows[row_map[i]]`` with a ``row_map`` (siblings share their parent's row, never copied per
        node); a level whose ``rows`` are the tensor the previous level gave (a drafter writing every
        level into one table) maps into it. ``hidden``: the main-path child's hidden state."""
        table = rows if isinstance(rows, torch.Tensor) else torch.stack(list(rows))
        if not self.tables or table is not self.tables[-1]:
            if self.tables:
                self.rows += int(self.tables[-1].shape[0])
            self.tables.append(table)
        at = [self.rows + (i if row_map is None else int(row_map[i])) for i in range(len(chosen))]
        self.used = max(self.used, max(at) + 1)
        self.levels.append(([c.token for c in chosen], [c.row for c in chosen], at))
        self.hidden.append(hidden)

    def block(
        self, first: int, forwards: int, draft_vocab: Optional[DraftVocab] = None
    ) -> tuple[DraftBlock, list[int]]:
        """The block (its first node numbered ``first`` in the draft tree; its rows over ``draft_vocab``
        when given) and the draft-tree numbers of the last level's nodes (main-path node first)."""
        side_tokens: list[int] = []
        side_parents: list[int] = []
        side_rows: list[int] = []
        above, number = self.expanded, first + len(self.levels)  # the level above; the next side node's number
        for depth, (tokens, parents, at) in enumerate(self.levels):
            numbers = [first + depth] + list(range(number, number + len(tokens) - 1))
            number += len(tokens) - 1
            side_tokens += tokens[1:]
            side_parents += [above[row] for row in parents[1:]]
            side_rows += at[1:]
            above = numbers
        # the levels' rows joined once (one table: as it is, up to its last mapped row); every node
        # maps to its row (siblings share one)
        table = self.tables[0][: self.used] if len(self.tables) == 1 else torch.cat(self.tables)
        side = (
            None
            if not side_tokens
            else SideNodes(
                torch.tensor(side_tokens, dtype=torch.long),
                torch.tensor(side_parents, dtype=torch.long),
                table,
                draft_vocab=draft_vocab,
                row_map=torch.tensor(side_rows, dtype=torch.long),
            )
        )
        block = DraftBlock(
            tokens=torch.tensor([tokens[0] for tokens, _, _ in self.levels], dtype=torch.long),
            draft_probs=table,
            hidden_states=None if any(h is None for h in self.hidden) else torch.stack(cast(list, self.hidden)),
            side=side,
            forwards=forwards,
            sampled=False,
            draft_vocab=draft_vocab,
            row_map=torch.tensor([at[0] for _, _, at in self.levels], dtype=torch.long),
        )
        return block, above


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
    if trie is not None and len(trie) > len(main):  # never None: the main phrase is not empty
        side = SideNodes(trie.tokens[len(main) :], trie.parents[len(main) :])
    return DraftBlock(tokens=torch.tensor(main, dtype=torch.long), side=side, sampled=False)


def best_nodes(tree: TokenTree, nodes: int) -> Optional[list[int]]:
    """The nodes of ``tree`` a tree drafter sends for verification: the ``nodes`` most likely by
    cumulative draft probability (the product of ``q(token | parent)`` down the node's root path,
    ties to the earlier node), plus every node without a draft probability (a point mass another
    source merged in, e.g. a ``hybrid`` member's phrase) with its ancestors. A node is never more
    likely than its parent, so the chosen nodes hang together. None when everything fits.
    """
    n = len(tree)
    if n <= nodes or tree.token_probs is None:
        return None
    # q(token | its parent's path), read once (a tensor element at a time costs more than the whole
    # tree) as log q; a node has a draft probability where q > 0, that is log q > -inf (not NaN either)
    log_q = tree.token_probs.double().log().tolist()
    own = [value > -math.inf for value in log_q]
    parents = tree.parent_list
    score = [0.0] * n
    for i, parent in enumerate(parents):
        score[i] = (log_q[i] if own[i] else 0.0) + (score[parent] if parent >= 0 else 0.0)
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


# -- cost-sized trees: the nodes worth sending ------------------------------------------------------
def node_values(
    tree: TokenTree, point_mass: Optional[Callable[[int], float]] = None, calibration: Optional[Calibration] = None
) -> list[float]:
    """Each node's estimated probability of being accepted: a node the draft model chose, its
    cumulative draft probability (the product of ``q(token | parent)`` down its root path), or with a
    ``calibration`` the acceptance rate it gives at the node's depth and cumulative probability
    (``pacer_core.calibration.apply``; never above the parent's value); a point mass (a phrase
    another source merged in, no draft probability), its parent's value times ``point_mass(node)``
    (that source's acceptance rate at that depth; default 0.5). A node's value never exceeds its
    parent's, so ranking by value keeps ancestors before their descendants."""
    n = len(tree)
    parents = tree.parents.tolist()
    if tree.token_probs is None:
        q = [0.0] * n
    else:
        q = tree.token_probs.double().tolist()  # [N]
    depths = tree.depth_list if calibration is not None else None
    values = [0.0] * n
    cumulative = [0.0] * n  # the product down the root path (a point mass: its rate)
    for i, parent in enumerate(parents):
        above, above_cumulative = (values[parent], cumulative[parent]) if parent >= 0 else (1.0, 1.0)
        own = min(1.0, max(0.0, q[i] if q[i] > 0 else (point_mass(i) if point_mass is not None else 0.5)))
        cumulative[i] = above_cumulative * own
        if calibration is not None and depths is not None and q[i] > 0:
            values[i] = min(above, calibrated(calibration, depths[i], cumulative[i]))
        else:
            values[i] = above * own
    return values


def _ranked(values: Sequence[float], parents: Sequence[int]) -> list[int]:
    """Nodes by value, ties to the earlier node, each after its parent (a node's value never exceeds
    its parent's; one whose parent is not yet ranked is passed over, should values tie oddly)."""
    ranked: list[int] = []
    taken: set[int] = set()
    for i in sorted(range(len(values)), key=lambda i: (-values[i], i)):
        if parents[i] < 0 or parents[i] in taken:
            taken.add(i)
            ranked.append(i)
    return ranked


def value_nodes(
    values: Sequence[float], parents: Sequence[int], verify: Callable[[int], float], rate: float
) -> tuple[list[int], float, float]:
    """The nodes to send: ranked by value (``_ranked``), the first n for the n maximising
    ``Σ values − rate · verify(n + 1)`` (Dinkelbach's step for the ratio expected emitted tokens ÷
    seconds, ``rate`` being the throughput reached so far; ``verify(k)``: a tree-masked target
    forward over k tokens). n may be 0 (a plain step). Returns (the nodes, ascending; their
    expected accepted tokens; the verification's seconds)."""
    ranked = _ranked(values, parents)
    best_n, best_gain, best_value, gain = 0, 0.0, -rate * verify(1), 0.0
    for n, node in enumerate(ranked, start=1):
        gain += values[node]
        value = gain - rate * verify(n + 1)
        if value > best_value:
            best_n, best_gain, best_value = n, gain, value
    return sorted(ranked[:best_n]), best_gain, verify(best_n + 1)


def ranked_nodes(values: Sequence[float], parents: Sequence[int], n: int) -> Optional[list[int]]:
    """The ``n`` nodes of highest value (``_ranked``), every one with its ancestors; None when
    every node fits."""
    if len(values) <= n:
        return None
    return sorted(_ranked(values, parents)[:n])


class NodeBudget:
    """What a tree drafter sends once drafting ends: its best ``nodes`` by cumulative draft
    probability (``best_nodes``), or with ``nodes: auto`` the nodes that maximise expected emitted
    tokens per second under a cost model (``value_nodes``), each valued by ``node_values`` (through
    ``calibration`` when one is given). ``auto`` keeps the throughput it predicts for its own
    choices (expected emitted ÷ predicted seconds, over the steps so far) as the rate a node's
    verification cost is weighed against, so the choice settles at the budget that maximises the
    whole generation's rate, not one step's."""

    def __init__(
        self,
        tree: TreeConfig,
        device: str,
        cost: Any = None,
        calibration: Optional[Calibration] = None,
    ):
        self.nodes = tree.budget(device)
        self.cost = cost
        if self.nodes == AUTO and cost is None:
            raise ValueError("tree nodes 'auto' needs a cost model")
        self.calibration = calibration if self.nodes == AUTO else None
        self.emitted = self.seconds = 0.0

    def values(self, tree: TokenTree, point_mass: Optional[Callable[[int], float]] = None) -> list[float]:
        """Each node's acceptance estimate as this budget values it (``node_values``)."""
        return node_values(tree, point_mass, self.calibration)

    def restart(self) -> None:
        """Forget the throughput learned so far (a sampled generation must start from the same state
        as every other: docs/hooks.md)."""
        self.emitted = self.seconds = 0.0

    @property
    def auto(self) -> bool:
        return self.nodes == AUTO

    def rate(self) -> float:
        """Tokens per second predicted so far (plain decoding's before the first step)."""
        return self.emitted / self.seconds if self.seconds > 0 else 1.0 / self.cost.step(0)

    def select(self, tree: TokenTree, values: Optional[Sequence[float]] = None) -> Optional[list[int]]:
        """The nodes to send (None: all of them); ``values``: each node's acceptance estimate
        (default ``node_values``)."""
        if not self.auto:
            if values is None:
                return best_nodes(tree, self.nodes)
            return ranked_nodes(values, tree.parents.tolist(), self.nodes)
        values = self.values(tree) if values is None else values
        depth = int(tree.depths.max()) if len(tree) else 0
        nodes, expected, sent_s = value_nodes(values, tree.parents.tolist(), self.sending_seconds, self.rate())
        self.emitted += 1.0 + expected
        forwards = math.ceil(depth / self.cost.tokens_per_forward)  # a tree over a block: a forward per block
        self.seconds += forwards * self.cost.draft_forward_s + sent_s
        return None if len(nodes) == len(tree) else nodes

    def sending_seconds(self, k: int) -> float:
        """What sending k − 1 nodes costs (a forward over k tokens, the pending one first): the
        tree-masked verification and the step's host time, which also grows with the nodes sent
        (a profile's ``host_s.tree`` is by nodes sent: masks, positions, acceptance, bookkeeping)."""
        return self.cost.verify_tree(k) + self.cost.host(max(k - 1, 1))


def default_profile(device: str) -> str:
    """The shipped cost profile ``nodes: auto`` sizes trees with when none is named: the measured
    CPU one on a CPU, the published GPU one elsewhere (docs/costs.md)."""
    return CPU_PROFILE if str(device).startswith("cpu") else GPU_PROFILE


CPU_PROFILE = "cpu-2core-smollm2-fp32"
GPU_PROFILE = "a100-7b-bf16"


def node_budget(
    tree: TreeConfig,
    device: Any,
    drafter_kind: str,
    target_digest: Optional[str] = None,
    draft_folder: Any = None,
    draft_identity: Optional[str] = None,
    tokens_per_forward: int = 1,
) -> NodeBudget:
    """A tree drafter's ``NodeBudget`` on ``device`` (a ``drafter_kind`` drafter: ``feature``,
    ``token`` or ``block``, one draft forward of which yields ``tokens_per_forward`` levels of its
    tree) when the budget is ``auto``: its cost model from ``tree.profile``, else the profile
    ``pacer costs`` measured and cached for this device type and target (``target_digest``), else
    the device's shipped one; its calibration from ``tree_calibration``. Raises ``InputError`` for
    a profile or calibration that cannot be read or used."""
    from .cost_profiles import device_profile, load_profile

    device = str(device)
    if tree.budget(device) != AUTO:
        return NodeBudget(tree, device)
    if tree.profile:
        profile = load_profile(tree.profile)
    else:
        profile = device_profile(device, target_digest, default_profile(device), drafter_kind)
    calibration = tree_calibration(tree, draft_folder, draft_identity)
    cost = profile.cost_model(drafter_kind, tokens_per_forward=tokens_per_forward)
    return NodeBudget(tree, device, cost, calibration)


def tree_calibration(
    tree: TreeConfig, draft_folder: Any = None, draft_identity: Optional[str] = None
) -> Optional[Calibration]:
    """The calibration ``nodes: auto`` values nodes by: the file ``tree.calibration`` names, else the
    draft folder's own ``calibration.json`` (``draft_folder``: the drafter's, None when it has
    none), else None (raw values; ``tree.calibration: raw`` asks for them). A calibration fitted on
    another draft's trees than ``draft_identity`` is refused in one line (``InputError``)."""
    from pathlib import Path

    if tree.calibration == RAW:
        return None
    if tree.calibration:
        path = Path(tree.calibration).expanduser()
    elif draft_folder is not None and (Path(draft_folder) / CALIBRATION_FILE).is_file():
        path = Path(draft_folder) / CALIBRATION_FILE
    else:
        return None
    calibration = load_calibration(path)
    check_draft(calibration, draft_identity, path)
    return calibration
