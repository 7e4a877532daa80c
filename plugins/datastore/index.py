"""Exact suffix matching over a growing store of token documents (numpy; no models, no randomness).

``TokenIndex`` holds documents back to back in one int64 array, separated by -1. Every position p
of a document is indexed by its **window**: the ``width`` tokens from p on, cut at the document's
end. Windows are encoded as bytes (token + 1, big-endian uint32; 0 past the end), so bytewise order
is lexicographic order and all positions whose window starts with an n-gram (n <= width) form one
contiguous range of a sorted array, found with two binary searches (``np.searchsorted``).

Positions live in sorted **runs**. Adding a document sorts its positions into a new run, then runs
of similar size are merged (a log-structured merge: at most about log2(size) runs, each position
re-sorted O(log size) times over the store's life), so adding is cheap and a lookup costs
O(runs × log size), fast as the store grows. Evicting the oldest documents filters them out of
every run (runs stay sorted). Lookups answer the same as an index built at once from the same
documents (tests/test_datastore.py).

``context_matches`` finds the same matches in the current context (a few thousand tokens, scanned
directly), ``rank_continuations`` turns the continuations of all matches into ranked phrases.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

__all__ = ["TokenIndex", "context_matches", "rank_continuations"]

SEPARATOR = -1  # between documents in ``TokenIndex.tokens``


class TokenIndex:
    """Documents of token ids with every n-gram of up to ``width`` tokens findable (see the module)."""

    def __init__(self, width: int):
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        self.tokens = np.empty(0, dtype=np.int64)  # [size + documents] documents, each followed by -1
        self.lengths: list[int] = []  # tokens of each document, oldest first
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (keys [r] S{4·width}, positions [r] int64)

    # -- size --------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Tokens stored (separators not counted)."""
        return int(self.tokens.shape[0]) - len(self.lengths)

    @property
    def runs(self) -> int:
        return len(self._runs)

    def documents(self) -> list[list[int]]:
        """The stored documents, oldest first."""
        out, start = [], 0
        for length in self.lengths:
            out.append(self.tokens[start : start + length].tolist())
            start += length + 1
        return out

    def copy(self) -> "TokenIndex":
        other = TokenIndex(self.width)
        other.tokens, other.lengths = self.tokens.copy(), list(self.lengths)
        other._runs = [(keys.copy(), positions.copy()) for keys, positions in self._runs]
        return other

    # -- writing -----------------------------------------------------------------------------------
    def _keys(self, document: np.ndarray) -> np.ndarray:
        """[m] window keys of a document's m positions."""
        w = self.width
        padded = np.concatenate([document + 1, np.zeros(w - 1, dtype=np.int64)]).astype(">u4")  # [m + w - 1]
        windows = np.lib.stride_tricks.sliding_window_view(padded, w)  # [m, w]
        return np.ascontiguousarray(windows).view(f"S{4 * w}").ravel()  # [m]

    def add(self, document: Sequence[int], max_tokens: Optional[int] = None) -> None:
        """Append a document (empty ones are ignored); with ``max_tokens``, then evict the oldest
        documents until at most that many tokens are stored (a longer document keeps its end)."""
        doc = np.asarray(document, dtype=np.int64).reshape(-1)
        if max_tokens is not None:
            doc = doc[len(doc) - min(len(doc), max_tokens) :]
        if len(doc):
            if int(doc.min()) < 0 or int(doc.max()) >= 2**32 - 1:
                raise ValueError("token ids must lie in [0, 2**32 - 1)")
            start = int(self.tokens.shape[0])
            self.tokens = np.concatenate([self.tokens, doc, [SEPARATOR]])
            self.lengths.append(int(len(doc)))
            keys = self._keys(doc)
            order = np.argsort(keys, kind="stable")
            self._runs.append((keys[order], start + order.astype(np.int64)))
            while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
                self._merge_last_two()
        if max_tokens is not None:
            self.evict(max_tokens)

    def extend(self, documents: Sequence[Sequence[int]], max_tokens: Optional[int] = None) -> None:
        """Append several documents at once (one sort; what ``add`` one by one would store): the
        newest that fit in ``max_tokens`` when given."""
        docs = [np.asarray(d, dtype=np.int64).reshape(-1) for d in documents]
        if max_tokens is not None:
            kept, total = [], 0  # the newest documents whose total fits; only the newest may be cut
            for i, doc in enumerate(reversed(docs)):
                if i == 0:
                    doc = doc[len(doc) - min(len(doc), max_tokens) :]
                elif total + len(doc) > max_tokens:
                    break
                kept.append(doc)
                total += len(doc)
            docs = kept[::-1]
        docs = [d for d in docs if len(d)]
        if not docs:
            return
        if min(int(d.min()) for d in docs) < 0 or max(int(d.max()) for d in docs) >= 2**32 - 1:
            raise ValueError("token ids must lie in [0, 2**32 - 1)")
        start = int(self.tokens.shape[0])
        sep = np.array([SEPARATOR], dtype=np.int64)
        self.tokens = np.concatenate([self.tokens] + [part for d in docs for part in (d, sep)])
        starts = start + np.concatenate([[0], np.cumsum([len(d) + 1 for d in docs])[:-1]])
        keys = np.concatenate([self._keys(d) for d in docs])
        positions = np.concatenate([s + np.arange(len(d), dtype=np.int64) for s, d in zip(starts, docs)])
        order = np.argsort(keys, kind="stable")
        self.lengths += [int(len(d)) for d in docs]
        self._runs.append((keys[order], positions[order]))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            self._merge_last_two()
        if max_tokens is not None:
            self.evict(max_tokens)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [size] without separators, lengths [documents]): what a datastore file holds."""
        return self.tokens[self.tokens != SEPARATOR], np.array(self.lengths, dtype=np.int64)

    def _merge_last_two(self) -> None:
        (k1, p1), (k2, p2) = self._runs[-2], self._runs[-1]
        keys, positions = np.concatenate([k1, k2]), np.concatenate([p1, p2])
        order = np.argsort(keys, kind="stable")
        self._runs[-2:] = [(keys[order], positions[order])]

    def evict(self, max_tokens: int) -> int:
        """Drop the oldest documents until at most ``max_tokens`` tokens are stored; returns how many."""
        drop, size = 0, self.size
        while drop < len(self.lengths) and size > max_tokens:
            size -= self.lengths[drop]
            drop += 1
        if drop:
            cut = sum(self.lengths[:drop]) + drop  # the first kept document's start
            self.tokens = self.tokens[cut:]
            self.lengths = self.lengths[drop:]
            runs = []
            for keys, positions in self._runs:
                keep = positions >= cut
                if keep.any():
                    runs.append((keys[keep], positions[keep] - cut))
            self._runs = runs
        return drop

    # -- reading -----------------------------------------------------------------------------------
    def find(self, ngram: Sequence[int]) -> np.ndarray:
        """[h] int64: the start positions of every occurrence of ``ngram`` (1..width tokens),
        most recent (highest) first."""
        n = len(ngram)
        if not 1 <= n <= self.width:
            raise ValueError(f"an n-gram of {n} tokens; this index finds 1 to {self.width}")
        if any(int(t) < 0 for t in ngram):
            return np.empty(0, dtype=np.int64)
        head = (np.asarray(ngram, dtype=np.int64) + 1).astype(">u4").tobytes()
        low = np.array([head + b"\x00" * 4 * (self.width - n)], dtype=f"S{4 * self.width}")
        high = np.array([head + b"\xff" * 4 * (self.width - n)], dtype=f"S{4 * self.width}")
        found = []
        for keys, positions in self._runs:
            a, b = int(np.searchsorted(keys, low[0], "left")), int(np.searchsorted(keys, high[0], "right"))
            if b > a:
                found.append(positions[a:b])
        if not found:
            return np.empty(0, dtype=np.int64)
        return -np.sort(-np.concatenate(found))

    def continuation(self, start: int, length: int) -> list[int]:
        """Up to ``length`` tokens from position ``start``, stopping at the document's end."""
        piece = self.tokens[start : start + length]
        ends = np.flatnonzero(piece == SEPARATOR)
        return piece[: ends[0] if len(ends) else len(piece)].tolist()


def context_matches(context: np.ndarray, n: int) -> np.ndarray:
    """[h] int64: positions p (most recent first) where ``context[p:p + n]`` equals the context's
    last n tokens, the suffix itself excluded (p + n < len(context)); ``context``: [L] int64."""
    length = int(context.shape[0])
    if n < 1 or n >= length:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(context[: length - 1], n)  # [L - n, n]
    hits = np.flatnonzero((windows == context[length - n :]).all(axis=1))
    return hits[::-1].astype(np.int64)


def rank_continuations(continuations: Sequence[Sequence[int]], branches: int) -> list[list[int]]:
    """Up to ``branches`` phrases from the continuations of all matches, best first.

    ``continuations`` (most recent match first) are counted in a trie: a node's count is how many
    continuations pass through it. The first phrase follows the most frequent child from the root
    down to a leaf (ties: the child seen first, i.e. from the more recent match); each further
    phrase starts at the most frequent node not yet taken whose parent is taken (same tie rule) and
    continues the same way, so branches are ranked by how many matches support them. Every phrase
    is given from the root (its shared prefix included); no phrase repeats another's nodes.
    """
    children: list[dict[int, int]] = [{}]
    count, token, parent = [0], [-1], [-1]
    for continuation in continuations:
        at = 0
        for t in map(int, continuation):
            node = children[at].get(t)
            if node is None:
                node = children[at][t] = len(count)
                children.append({})
                count.append(0)
                token.append(t)
                parent.append(at)
            count[node] += 1
            at = node

    def down(node: int) -> list[int]:  # the most frequent chain below node
        path = []
        while children[node]:
            node = max(children[node].values(), key=lambda c: (count[c], -c))
            path.append(node)
        return path

    def up(node: int) -> list[int]:  # node's root path, without the root
        path = []
        while node > 0:
            path.append(node)
            node = parent[node]
        return path[::-1]

    phrases: list[list[int]] = []
    taken = {0}
    start = 0
    while len(phrases) < branches:
        if start < 0:
            break
        nodes = up(start) + down(start)
        if not nodes:
            break
        taken.update(nodes)
        phrases.append([token[i] for i in nodes])
        frontier = [c for p in taken for c in children[p].values() if c not in taken]
        start = max(frontier, key=lambda c: (count[c], -c)) if frontier else -1
    return phrases
