"""A step's draft: the blocks drafters propose (``DraftBlock``, with ``SideNodes`` off the main path),
the ``Draft`` they make, and its ``TokenTree`` as the target scores it (with the tree algorithms the
engine, verifiers and tree drafters share: paths, depths, masks, truncation and selection).

Shapes are noted as ``# [n, vocab]`` comments; ``n`` is the number of draft tokens (``N`` the tree's
nodes), ``vocab`` the model vocabulary.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Union, cast, overload

import attrs
import numpy as np
import torch

from .fields import tensor_field

__all__ = ["Draft", "DraftBlock", "DraftVocab", "SideNodes", "TokenTree"]


_NUMPY_FLOATS = (torch.float32, torch.float64)  # dtypes numpy reads as torch stores them


@attrs.frozen(eq=False)
class DraftVocab:
    """The tokens a drafter's distributions cover, when it predicts a subset of the target's
    vocabulary (an EAGLE-3-style head): column j of its rows of probabilities is token ``ids[j]``,
    and every other token has probability 0. A block that carries rows at this width
    (``DraftBlock.draft_vocab``) skips the copy into the target's vocabulary until something
    reads its ``draft_probs``: a greedy tree step ranks and verifies without ever reading them.
    A drafter builds one and hands the same object to every block."""

    ids: torch.Tensor = tensor_field()  # [w] int64, distinct target token ids
    # mypy's attrs plugin takes the ``tensor_field()`` above for a default value, so it sees a field
    # without a default after one with
    size: int  # type: ignore[misc]  # the target's vocabulary
    # optional: every token id's column (-1: none) in these ids or in ids that extend them (a drafter's
    # list, kept as its vocabulary grows at the end: a column past ``len(ids)`` is none here); read by
    # ``token_probs`` instead of building ``columns`` (a [size] map) for a few tokens
    column_of: Optional[Sequence[int]] = attrs.field(default=None, eq=False, repr=False)

    @functools.cached_property
    def columns(self) -> torch.Tensor:  # [size] int64: each token's column, -1 outside the subset
        out = torch.full((self.size,), -1, dtype=torch.long)
        out[self.ids] = torch.arange(len(self.ids))
        return out

    def widen(self, rows: torch.Tensor) -> torch.Tensor:
        """[n, w] rows over ``ids`` → [n, size] rows over the target's vocabulary, 0 elsewhere."""
        # index_copy_: a plain copy, much cheaper than assigning through a fancy index on a large vocabulary
        wide = torch.zeros(rows.shape[0], self.size, dtype=rows.dtype, device=rows.device)
        return wide.index_copy_(1, self.ids.to(rows.device), rows)

    def token_probs(
        self, rows: torch.Tensor, tokens: torch.Tensor, row_map: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """[n] row i's probability of ``tokens[i]`` (0 outside the subset): ``widen(rows)`` gathered
        at ``tokens`` without widening; with a ``row_map``, row i is ``rows[row_map[i]]``."""
        if self.column_of is None:
            columns = self.columns[tokens.cpu()].to(rows.device)  # [n]
        else:
            width, column_of = len(self.ids), self.column_of
            listed = [column_of[token] for token in tokens.tolist()]
            listed = [c if c < width else -1 for c in listed]
            if rows.device.type == "cpu" and rows.dtype in _NUMPY_FLOATS and not rows.requires_grad:
                # a few values read in numpy: each small tensor operation costs more than all of it
                at = np.array(listed, dtype=np.int64)
                index = np.arange(len(listed)) if row_map is None else row_map.cpu().numpy()
                values = rows.numpy()[index, np.maximum(at, 0)]
                values[at < 0] = 0
                return torch.from_numpy(values)
            columns = torch.tensor(listed).to(rows.device)
        found = _gather(rows, row_map, columns.clamp_min(0))
        return torch.where(columns >= 0, found, torch.zeros_like(found))


def _gather(rows: torch.Tensor, row_map: Optional[torch.Tensor], columns: torch.Tensor) -> torch.Tensor:
    """[n]: row i's (``rows[row_map[i]]``, or ``rows[i]`` without a map) value at ``columns[i]``."""
    if row_map is None:
        return rows.gather(1, columns[:, None])[:, 0]
    return rows[row_map.to(rows.device), columns]


# a block of a tree's rows: (rows, row map or None, the DraftVocab its rows cover or None)
_RowBlock = tuple[torch.Tensor, Optional[torch.Tensor], Optional[DraftVocab]]


def _shared_tables(parts: Sequence[_RowBlock]) -> list[_RowBlock]:
    """Row blocks (rows, row map, vocabulary) in node order, consecutive ones that map into the same
    rows over the same vocabulary (a block's main path and side nodes) joined into one: their nodes
    read as one gather."""
    joined: list[_RowBlock] = []
    for rows, row_map, vocab in parts:
        if (
            joined
            and row_map is not None
            and joined[-1][0] is rows
            and joined[-1][1] is not None
            and joined[-1][2] is vocab
        ):
            joined[-1] = (rows, torch.cat([joined[-1][1], row_map]), vocab)
        else:
            joined.append((rows, row_map, vocab))
    return joined


@overload
def _wide(rows: torch.Tensor, vocab: Optional[DraftVocab]) -> torch.Tensor: ...
@overload
def _wide(rows: Optional[torch.Tensor], vocab: Optional[DraftVocab]) -> Optional[torch.Tensor]: ...
def _wide(rows: Optional[torch.Tensor], vocab: Optional[DraftVocab]) -> Optional[torch.Tensor]:
    return rows if rows is None or vocab is None else vocab.widen(rows)


@overload
def _mapped(rows: torch.Tensor, row_map: Optional[torch.Tensor]) -> torch.Tensor: ...
@overload
def _mapped(rows: Optional[torch.Tensor], row_map: Optional[torch.Tensor]) -> Optional[torch.Tensor]: ...
def _mapped(rows: Optional[torch.Tensor], row_map: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Each node's row: ``rows[row_map]``, or ``rows`` themselves without a map."""
    return rows if rows is None or row_map is None else rows.index_select(0, row_map.to(rows.device))


@attrs.frozen
class _RowTable:
    """The rows of probabilities a block's tokens (``DraftBlock``) or side nodes (``SideNodes``) were
    chosen from, as both carry them: a table given at the width of ``draft_vocab`` (the whole
    vocabulary without one), node i's row ``row_map[i]`` (row i without a map), read as given
    (``draft_table``), per node (``draft_rows``) or per node over the target's vocabulary
    (``draft_probs``). The fields are the subclasses' own, declared in their constructor's order."""

    if TYPE_CHECKING:
        _draft_probs: Optional[torch.Tensor]
        draft_vocab: Optional[DraftVocab]
        row_map: Optional[torch.Tensor]

    @property
    def draft_table(self) -> Optional[torch.Tensor]:  # [m, w]: the rows as given (before row_map)
        return self._draft_probs

    @functools.cached_property
    def draft_rows(self) -> Optional[torch.Tensor]:  # [n, w]: each node's row as given (over draft_vocab.ids)
        return _mapped(self._draft_probs, self.row_map)

    @functools.cached_property
    def draft_probs(self) -> Optional[torch.Tensor]:  # [n, vocab]
        return _wide(self.draft_rows, self.draft_vocab)


@attrs.frozen
class SideNodes(_RowTable):
    """Alternative draft tokens a block hangs off the draft's tree: the target scores them in the
    same forward as the main path, and a tree verifier may accept a path through them.

    ``parents[i]`` is the node each token continues, as an index into the whole draft tree
    (``Draft.tree``: earlier nodes, this block's main-path nodes, or earlier side nodes of this
    block), or -1 for the root (the last committed token). ``draft_probs`` row i is the draft's
    distribution the token was chosen from (None: no distribution, a point mass). ``sampled``: the
    tokens were drawn at random from their rows, siblings independently (None: as the block's
    main-path tokens); False: chosen deterministically (top-k, lookup), verified as point masses.
    ``draft_vocab``: the rows were given over a subset of the vocabulary, ``row_map``: shared by
    several nodes (see ``DraftBlock``).
    """

    tokens: torch.Tensor = tensor_field()  # [s] int64
    parents: torch.Tensor = tensor_field()  # [s] int64
    # [s, vocab], or [m, w]: over draft_vocab.ids, node i's row row_map[i]: read through ``draft_probs``
    # (each node's row, widened), ``draft_rows`` (each node's row) or ``draft_table`` (as given)
    _draft_probs: Optional[torch.Tensor] = tensor_field(default=None, alias="draft_probs")
    sampled: Optional[bool] = None
    draft_vocab: Optional[DraftVocab] = None
    row_map: Optional[torch.Tensor] = tensor_field(default=None)  # [s] int64: node i's row of draft_probs

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def trie(cls, phrases: Sequence[Sequence[int]], parent: int, first: int) -> Optional["SideNodes"]:
        """Candidate phrases continuing node ``parent`` as a trie (shared prefixes merged, so no
        two siblings repeat a token), its nodes numbered from ``first`` in the draft tree; None when
        there are no phrases. Drafters without probabilities (phrase pools, lookup) use it."""
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for phrase in phrases:
            at = parent
            for token in map(int, phrase):
                node = index.get((at, token))
                if node is None:
                    node = index[(at, token)] = first + len(tokens)
                    tokens.append(token)
                    parents.append(at)
                at = node
        if not tokens:
            return None
        return cls(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), sampled=False)


@attrs.frozen
class DraftBlock(_RowTable):
    """Tokens one ``pacer_propose`` call adds to the current draft.

    The block's ``tokens`` continue the draft's **main path** (its chain: what stop policies judge).
    ``draft_probs`` is the distribution each token was chosen from (after temperature, top-k and
    top-p), or None for drafters without probabilities (n-gram, phrase pool): the verifier then
    treats each token as a point mass. ``sampled`` says whether the tokens (and side nodes, unless
    ``side.sampled`` says otherwise) were drawn at random from their ``draft_probs`` row, siblings
    independently; False when they were chosen deterministically (top-k children, a greedy chain),
    which the sampling verifier then treats as point masses (exact either way). ``hidden_states`` are the draft model's
    hidden states that produced each main-path token (PACER reads them), or None. ``side`` holds
    alternative tokens anywhere in the tree (a token tree's other candidates, Ouroboros' candidate
    suffixes); the target scores them in the same forward. ``forwards`` counts the draft-model
    forward passes the block cost (0 for model-free drafters).

    A drafter whose distributions cover a subset of the vocabulary may give its rows at that width
    with ``draft_vocab`` saying which token each column is (a column map): ``draft_probs`` is then
    widened into the target's vocabulary on first read, and ``draft_rows`` are the rows as given.
    Tokens drawn or chosen from one distribution may share its row with ``row_map`` (token i's row
    is ``draft_probs[row_map[i]]``; a tree's siblings, a block's depths): the rows are then never
    copied per token unless ``draft_rows`` or ``draft_probs`` is read. ``draft_table`` is the rows
    as given.
    """

    tokens: torch.Tensor = tensor_field()  # [n] int64
    # [n, vocab], or [m, w]: over draft_vocab.ids, token i's row row_map[i]: read through ``draft_probs``
    # (each token's row, widened), ``draft_rows`` (each token's row) or ``draft_table`` (as given)
    _draft_probs: Optional[torch.Tensor] = tensor_field(default=None, alias="draft_probs")
    hidden_states: Optional[torch.Tensor] = tensor_field(default=None)  # [n, hidden]
    side: Optional[SideNodes] = None
    forwards: int = 0  # draft-model forwards spent on this block (reported in metrics)
    sampled: bool = True
    draft_vocab: Optional[DraftVocab] = None
    row_map: Optional[torch.Tensor] = tensor_field(default=None)  # [n] int64: token i's row of draft_probs

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@overload
def _cat(parts: Sequence[torch.Tensor], what: str) -> torch.Tensor: ...
@overload
def _cat(parts: Sequence[Optional[torch.Tensor]], what: str) -> Optional[torch.Tensor]: ...
def _cat(parts: Sequence[Optional[torch.Tensor]], what: str) -> Optional[torch.Tensor]:
    present = [p is not None for p in parts]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"draft blocks disagree on whether they carry {what}")
    return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=0)  # type: ignore[arg-type]


@attrs.frozen
class TokenTree:
    """A draft as the target scores it: every node (main path and side nodes) with its parent.

    Nodes are numbered block by block, each block's main-path tokens then its side nodes, so a
    parent always precedes its children; -1 is the root (the last committed token). A chain is the
    tree whose parents are -1, 0, 1, ... Row ``i + 1`` of the verifier's ``target_logits`` scores
    the token after node i's root path; row 0 the token after the root.
    """

    tokens: torch.Tensor = tensor_field()  # [N] int64
    parents: torch.Tensor = tensor_field()  # [N] int64, parents[i] < i
    # [N, vocab] or None (point masses); or the row blocks that make it, in node order, each as
    # (rows, row map or None, the DraftVocab its rows cover or None: the whole vocabulary), mapped,
    # widened and joined on first read of ``draft_probs`` (a greedy tree step reads only
    # ``token_probs`` and never pays the copy)
    _draft_probs: Union[None, torch.Tensor, tuple[_RowBlock, ...]] = tensor_field(alias="draft_probs")
    sampled: torch.Tensor = tensor_field()  # [N] bool: drawn at random from its draft_probs row
    main_path: tuple[int, ...] = ()  # the main path's node indices, root first

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @functools.cached_property
    def draft_probs(self) -> Optional[torch.Tensor]:  # [N, vocab] or None
        rows = self._draft_probs
        if rows is None or isinstance(rows, torch.Tensor):
            return rows
        wide = [_wide(_mapped(part, row_map), vocab) for part, row_map, vocab in rows]
        return wide[0] if len(wide) == 1 else torch.cat(wide, dim=0)

    @functools.cached_property
    def token_probs(self) -> Optional[torch.Tensor]:  # [N] float: q(token | its parent's path), or None
        """Each node's draft probability ``draft_probs[i, tokens[i]]``, read without joining the rows."""
        rows = self._draft_probs
        if rows is None:
            return None
        if isinstance(rows, torch.Tensor):
            return rows.gather(1, self.tokens[:, None].to(rows.device))[:, 0]
        out, start = [], 0
        for part, row_map, vocab in _shared_tables(rows):
            n = part.shape[0] if row_map is None else row_map.shape[0]
            tokens = self.tokens[start : start + n]
            out.append(
                _gather(part, row_map, tokens.to(part.device))
                if vocab is None
                else vocab.token_probs(part, tokens, row_map)
            )
            start += n
        return out[0] if len(out) == 1 else torch.cat(out)

    @functools.cached_property
    def parent_list(self) -> list[int]:
        """``parents`` as a list, read once."""
        return self.parents.tolist()

    @functools.cached_property
    def depth_list(self) -> list[int]:
        """``depths`` as a list (1 for the root's children)."""
        depths = [0] * len(self)
        for i, parent in enumerate(self.parent_list):
            depths[i] = 1 if parent < 0 else depths[parent] + 1
        return depths

    @functools.cached_property
    def depths(self) -> torch.Tensor:  # [N] int64, 1 for the root's children
        return torch.tensor(self.depth_list, dtype=torch.long)

    @functools.cached_property
    def children(self) -> dict[int, list[int]]:
        """Each node's children in node order (key -1: the root's)."""
        children: dict[int, list[int]] = {-1: []}
        for i, parent in enumerate(self.parent_list):
            children.setdefault(parent, []).append(i)
            children.setdefault(i, [])
        return children

    @functools.cached_property
    def is_chain(self) -> bool:
        """Every node is on the main path (side nodes continuing the main path's tip make a
        chain-shaped tree that is not a chain: a chain verifier's ``accepted`` counts main-path nodes)."""
        return len(self.main_path) == len(self) and self.parent_list == list(range(-1, len(self) - 1))

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (empty for the root, -1)."""
        path, parents = [], self.parent_list
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: node i may attend to node j (j is i or one of its ancestors)."""
        # each node's line (its ancestors and itself) from its parent's, written in one indexed write
        # (numpy: a few small tensor operations per level cost more than the lists)
        lines: list[list[int]] = []
        for i, parent in enumerate(self.parent_list):  # parents precede children
            lines.append((lines[parent] if parent >= 0 else []) + [i])
        mask = np.zeros((len(self), len(self)), dtype=bool)
        mask[[i for i, line in enumerate(lines) for _ in line], [j for line in lines for j in line]] = True
        return torch.from_numpy(mask)


@attrs.frozen
class Draft:
    """The draft of the current step: the blocks proposed so far, a token tree.

    ``tokens``, ``draft_probs`` and ``hidden_states`` are the **main path** (the blocks' tokens
    concatenated, computed once per draft on first use): the chain stop policies judge, and the
    whole draft for chain drafters. ``len(draft)`` is its length, the draft's depth. Side nodes
    make the draft a tree; ``tree`` shows every node for the engine and the verifier. A stop
    policy that looks only at the latest block should read ``draft.blocks[-1]`` (or slice with
    ``draft.last_block``), which costs nothing. ``block_starts`` holds the index of each block's
    first main-path token.
    """

    blocks: tuple[DraftBlock, ...] = ()

    def __len__(self) -> int:
        return self.length

    @functools.cached_property
    def length(self) -> int:
        """Main-path tokens (``len(draft)``), counted once: the engine and drafters ask often."""
        return sum(len(b) for b in self.blocks)

    @functools.cached_property
    def tokens(self) -> torch.Tensor:  # [n] int64
        if not self.blocks:
            return torch.empty(0, dtype=torch.long)
        return _cat([b.tokens for b in self.blocks], "tokens")

    @functools.cached_property
    def draft_probs(self) -> Optional[torch.Tensor]:  # [n, vocab]
        return _cat([b.draft_probs for b in self.blocks], "draft_probs")

    @functools.cached_property
    def hidden_states(self) -> Optional[torch.Tensor]:  # [n, hidden]
        return _cat([b.hidden_states for b in self.blocks], "hidden_states")

    @functools.cached_property
    def num_nodes(self) -> int:
        """Main-path tokens plus side nodes: what the target scores."""
        return sum(len(b) + (len(b.side) if b.side is not None else 0) for b in self.blocks)

    @property
    def depth(self) -> int:
        """The deepest node's depth: ``len(draft)`` for a chain, deeper with side nodes below the tip."""
        if all(b.side is None for b in self.blocks):
            return len(self)
        return max(self.tree.depth_list)

    @functools.cached_property
    def path_nodes(self) -> tuple[int, ...]:
        """The tree node index (``Draft.tree``) of each main-path token."""
        nodes: list[int] = []
        total = 0
        for block in self.blocks:
            nodes.extend(range(total, total + len(block)))
            total += len(block) + (len(block.side) if block.side is not None else 0)
        return tuple(nodes)

    @functools.cached_property
    def tree(self) -> TokenTree:
        """Every node of the draft with its parent, in node order (see ``TokenTree``)."""
        tokens: list[torch.Tensor] = []
        probs: list[tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[DraftVocab]]] = []
        parents: list[int] = []  # read and built as lists: a few small tensors per block cost more
        sampled: list[bool] = []
        tip, total = -1, 0
        has_probs = [b.draft_table is not None for b in self.blocks]
        for block in self.blocks:
            n = len(block)
            tokens.append(block.tokens)
            if n:
                parents.append(tip)
                parents.extend(range(total, total + n - 1))
                tip = total + n - 1
            probs.append((block.draft_table, block.row_map, block.draft_vocab))
            side = block.side
            s = 0 if side is None else len(side)
            sampled.extend([bool(block.sampled)] * n)
            if side is not None and s:
                side_parents = side.parents.tolist()
                if any(p >= total + n + j or p < -1 for j, p in enumerate(side_parents)):
                    raise ValueError("a side node's parent must be an earlier node of the draft tree, or -1")
                side_sampled = block.sampled if side.sampled is None else side.sampled
                side_probs, side_map, side_vocab = side.draft_table, side.row_map, side.draft_vocab
                if side_probs is None and block.draft_table is not None:
                    if side_sampled:
                        raise ValueError("sampled side nodes must carry the draft_probs they were drawn from")
                    # point masses: never read
                    side_probs, side_vocab = torch.zeros(s, block.draft_table.shape[1]), block.draft_vocab
                elif side_probs is not None and block.draft_table is None:
                    raise ValueError("a block's side nodes carry draft_probs but its tokens do not")
                tokens.append(side.tokens)
                parents.extend(side_parents)
                probs.append((side_probs, side_map, side_vocab))
                sampled.extend([bool(side_sampled)] * s)
            total += n + s
        if not self.blocks:
            empty = torch.empty(0, dtype=torch.long)
            return TokenTree(empty, empty.clone(), None, torch.empty(0, dtype=torch.bool))
        if any(has_probs) and not all(has_probs):
            raise ValueError("draft blocks disagree on whether they carry draft_probs")
        # the rows are joined on first read of ``TokenTree.draft_probs`` (checked above: all present or none)
        return TokenTree(
            torch.cat(tokens),
            torch.tensor(parents, dtype=torch.long),
            cast("tuple[_RowBlock, ...]", tuple(probs)) if has_probs[0] else None,  # all rows present (above)
            torch.tensor(sampled, dtype=torch.bool),
            self.path_nodes,
        )

    @property
    def block_starts(self) -> tuple[int, ...]:
        starts, total = [], 0
        for block in self.blocks:
            starts.append(total)
            total += len(block)
        return tuple(starts)

    @property
    def forwards(self) -> int:
        """Draft-model forwards spent on this draft (blocks cut off by ``truncate`` included)."""
        return sum(b.forwards for b in self.blocks)

    @property
    def last_block(self) -> slice:
        """Index range of the latest block (empty slice for an empty draft)."""
        return slice(len(self) - len(self.blocks[-1]) if self.blocks else 0, len(self))

    def extend(self, block: DraftBlock) -> "Draft":
        return Draft(self.blocks + (block,))

    def truncate(self, length: int) -> "Draft":
        """The tree cut at depth ``length``: the first ``length`` main-path tokens and the side nodes
        no deeper than that (whose ancestors are kept). Forwards spent on the cut tokens stay
        counted (on the last kept block)."""
        tree = self.tree
        if not len(tree) or max(tree.depth_list) <= length:
            return self
        return self.select(i for i, depth in enumerate(tree.depth_list) if depth <= length)

    def select(self, nodes: Iterable[int]) -> "Draft":
        """The draft with only the tree nodes ``nodes`` (indices into ``tree``) and none whose
        ancestor is left out: a main-path token goes with every later one, a side node with its
        subtree. Nodes are renumbered in the same order; forwards spent on the dropped nodes stay
        counted (on the last kept block). A node's sampled children go or stay together: dropping some
        of several candidates drawn from one distribution would bias their rejection."""
        tree = self.tree
        wanted = set(int(i) for i in nodes)
        if not len(tree) or wanted.issuperset(range(len(tree))):
            return self
        keep = _kept_nodes(tree, wanted)
        old_to_new, kept_blocks, total, next_index = {-1: -1}, [], 0, 0
        for block in self.blocks:
            n = len(block)
            unshifted = next_index == total  # nothing dropped before this block: its numbering stands
            take = 0
            while take < n and keep[total + take]:
                take += 1
            for i in range(take):
                old_to_new[total + i] = next_index + i
            next_index += take
            side = block.side
            new_side = None
            rows: list[int] = []
            if side is not None and len(side):
                new_parents = []  # in order: a side node's parent may be an earlier side node of this block
                for j, parent in enumerate(side.parents.tolist()):
                    if keep[total + n + j] and parent in old_to_new:
                        rows.append(j)
                        new_parents.append(old_to_new[parent])
                        old_to_new[total + n + j] = next_index
                        next_index += 1
                if unshifted and take == n and len(rows) == len(side):
                    kept_blocks.append(block)  # kept whole, numbered as before
                    total += n + len(side)
                    continue
                if rows:  # the kept nodes' rows are mapped, not copied
                    index = torch.tensor(rows, dtype=torch.long)
                    new_side = SideNodes(
                        side.tokens[index],
                        torch.tensor(new_parents),
                        side.draft_table,
                        side.sampled,
                        side.draft_vocab,
                        None if side.draft_table is None else _kept_rows(side.row_map, index),
                    )
            elif unshifted and take == n and side is None:
                kept_blocks.append(block)
                total += n
                continue
            if take or new_side is not None or not kept_blocks:
                table, row_map = block.draft_table, block.row_map
                kept_blocks.append(
                    DraftBlock(
                        block.tokens[:take],
                        table if table is None or row_map is not None else table[:take],
                        None if block.hidden_states is None else block.hidden_states[:take],
                        new_side,
                        block.forwards,
                        block.sampled,
                        block.draft_vocab,
                        None if row_map is None else row_map[:take],
                    )
                )
            total += n + (len(side) if side is not None else 0)
        cut = self.forwards - sum(b.forwards for b in kept_blocks)
        kept_blocks[-1] = attrs.evolve(kept_blocks[-1], forwards=kept_blocks[-1].forwards + cut)
        return Draft(tuple(kept_blocks))


def _kept_nodes(tree: TokenTree, wanted: set[int]) -> list[bool]:
    """Per node of ``tree``: kept by a selection of the nodes ``wanted`` (a node goes with its ancestors).
    ``ValueError`` where it keeps some of a node's sampled children and drops others."""
    parents = tree.parent_list
    keep = [False] * len(tree)
    for i, parent in enumerate(parents):  # parents precede children
        keep[i] = i in wanted and (parent < 0 or keep[parent])
    sampled_kept: dict[int, set[bool]] = {}  # per parent: whether its sampled children are kept
    for i, (parent, sampled) in enumerate(zip(parents, tree.sampled.tolist())):
        if sampled:
            sampled_kept.setdefault(parent, set()).add(keep[i])
    split = next((parent for parent, kept in sampled_kept.items() if len(kept) > 1), None)
    if split is not None:
        raise ValueError(
            f"a selection keeps some of node {split}'s sampled children and drops others: "
            "candidates drawn from one distribution must be kept or dropped together"
        )
    return keep


def _kept_rows(row_map: Optional[torch.Tensor], kept: torch.Tensor) -> torch.Tensor:
    """The row map of the nodes ``kept`` (indices) of nodes whose rows ``row_map`` maps (None: row i)."""
    return kept if row_map is None else row_map[kept]
