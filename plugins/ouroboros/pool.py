"""Ouroboros' phrase pool: key token → the most recent n-grams seen after it (pure Python).

A **phrase** is a tuple of ``phrase_length`` token ids (Ouroboros' ``level - 1``) that followed a
**key** token somewhere: in the draft model's lookahead window, in the target's argmax chains, or
in a target-corrected candidate suffix. Each key keeps at most ``capacity`` phrases (Ouroboros'
``guess_set_size``); adding a phrase makes it the most recent one of its key (re-adding refreshes
it), and a full key evicts its least recently used phrase. Lookups do not reorder: recency means
"last added or confirmed". The pool can be saved to and loaded from a JSON file (warm start).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from pacer_core import InputError
from pacer_core.jsonfile import MAX_DATA_BYTES, loads, read_bytes

__all__ = ["PhrasePool", "argmax_chains", "learn_from_step", "ngram_pairs", "open_pool"]

Phrase = tuple[int, ...]
FORMAT = "ouroboros-phrase-pool"
VERSION = 1


class PhrasePool:
    """key token → up to ``capacity`` phrases of exactly ``phrase_length`` tokens, LRU-evicted."""

    def __init__(self, phrase_length: int, capacity: int):
        if phrase_length < 1:
            raise ValueError(f"phrase_length must be >= 1, got {phrase_length}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.phrase_length = phrase_length
        self.capacity = capacity
        self._table: dict[int, OrderedDict[Phrase, None]] = {}  # each ordered oldest → newest

    # -- reading ---------------------------------------------------------------------------------
    def get(self, key: int, limit: int | None = None) -> list[Phrase]:
        """The phrases of ``key``, most recent first (at most ``limit``); [] for an unknown key."""
        phrases = self._table.get(int(key))
        if not phrases:
            return []
        newest_first = list(reversed(phrases))
        return newest_first if limit is None else newest_first[:limit]

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __len__(self) -> int:
        """The number of phrases over all keys."""
        return sum(len(p) for p in self._table.values())

    def keys(self) -> Iterator[int]:
        return iter(self._table)

    # -- writing ---------------------------------------------------------------------------------
    def add(self, key: int, phrase: Sequence[int]) -> bool:
        """Make ``phrase`` the most recent phrase of ``key``, evicting its least recently used
        phrase when the key is full. Phrases of another length are ignored (returns False)."""
        phrase = tuple(int(t) for t in phrase)
        if len(phrase) != self.phrase_length:
            return False
        phrases = self._table.setdefault(int(key), OrderedDict())
        if phrase in phrases:
            phrases.move_to_end(phrase)
        else:
            phrases[phrase] = None
            if len(phrases) > self.capacity:
                phrases.popitem(last=False)
        return True

    def add_all(self, pairs: Iterable[tuple[int, Sequence[int]]]) -> int:
        """Add ``(key, phrase)`` pairs in order; returns how many were of the right length."""
        return sum(self.add(key, phrase) for key, phrase in pairs)

    def replace(self, key: int, old: Sequence[int], new: Sequence[int]) -> bool:
        """Drop ``old`` from ``key`` (if present) and add ``new`` as its most recent phrase:
        a candidate suffix corrected by the target replaces the guess it came from."""
        if len(new) != self.phrase_length:
            return False
        phrases = self._table.get(int(key))
        if phrases is not None:
            phrases.pop(tuple(int(t) for t in old), None)
        return self.add(key, new)

    def clear(self) -> None:
        self._table.clear()

    # -- persistence -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "phrase_length": self.phrase_length,
            "capacity": self.capacity,
            "table": {str(key): [list(p) for p in phrases] for key, phrases in self._table.items() if phrases},
        }

    @classmethod
    def from_dict(cls, data: dict, capacity: int | None = None) -> "PhrasePool":
        """A pool from ``to_dict`` output; ``capacity`` (default: the saved one) keeps each key's
        most recent phrases when smaller than the saved capacity."""
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"not a phrase pool (format {FORMAT!r}, version {VERSION})")
        pool = cls(int(data["phrase_length"]), int(capacity or data["capacity"]))
        for key, phrases in data["table"].items():
            for phrase in phrases:  # oldest first, so the order (and the LRU eviction) is kept
                pool.add(int(key), phrase)
        return pool

    def save(self, path: Union[str, Path]) -> None:
        """Write the pool as JSON (atomically: a partial file never replaces a good one)."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Union[str, Path], capacity: int | None = None) -> "PhrasePool":
        file = Path(path).expanduser()
        data = read_bytes(file, "phrase pool", "delete it or set another pool_path", limit=MAX_DATA_BYTES)
        try:
            data = loads(data)
        except ValueError as exc:  # not JSON, or nested deeper than MAX_DEPTH
            raise ValueError(f"cannot read phrase pool '{path}': {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ValueError(f"'{path}' is not a phrase pool file")
        try:
            return cls.from_dict(data, capacity)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"'{path}' is not a valid phrase pool file: {exc}") from None


def argmax_chains(tokens: Sequence[int], argmax: Sequence[int], length: int) -> list[tuple[int, Phrase]]:
    """(key, phrase) pairs where the phrase is a model's own greedy chain after the key.

    ``tokens`` is a fed token path and ``argmax[i]`` the model's argmax after ``tokens[: i + 1]``
    (``len(argmax) == len(tokens)``). For each start ``i`` the chain is ``argmax[i], argmax[i + 1],
    ...`` for as long as the path fed exactly those tokens (``tokens[i + j + 1] == argmax[i + j]``),
    so every chain token was predicted after the chain itself. Chains of ``length`` tokens are
    returned, keyed by ``tokens[i]``.
    """
    n = len(tokens)
    if len(argmax) != n:
        raise ValueError(f"tokens ({n}) and argmax ({len(argmax)}) must have the same length")
    pairs = []
    for i in range(n - length + 1):
        chain = [int(argmax[i])]
        for j in range(i + 1, i + length):
            if int(tokens[j]) != chain[-1]:
                break
            chain.append(int(argmax[j]))
        if len(chain) == length:
            pairs.append((int(tokens[i]), tuple(chain)))
    return pairs


def ngram_pairs(tokens: Sequence[int], length: int) -> Iterator[tuple[int, Sequence[int]]]:
    """(key, phrase) for every ``length``-token n-gram of ``tokens`` after its first token, keyed by
    the token before it."""
    return ((tokens[i], tokens[i + 1 : i + 1 + length]) for i in range(len(tokens) - length))


def open_pool(path: Optional[str], phrase_length: int, capacity: int) -> PhrasePool:
    """The pool saved at ``path`` (each key's ``capacity`` most recent phrases) when it exists, else
    an empty one; ``InputError`` for a file that is not a pool or holds phrases of another length."""
    if path and Path(path).expanduser().exists():
        try:
            pool = PhrasePool.load(path, capacity=capacity)
        except ValueError as exc:
            raise InputError(f"{exc}; delete it or set another pool_path") from None
        if pool.phrase_length != phrase_length:
            raise InputError(
                f"phrase pool '{path}' holds phrases of {pool.phrase_length} tokens; "
                f"level {phrase_length + 1} needs {phrase_length}: use level "
                f"{pool.phrase_length + 1} or another pool_path"
            )
        return pool
    return PhrasePool(phrase_length, capacity)


def learn_from_step(pool: PhrasePool, state: Any, step: Any) -> None:
    """What a verified step teaches the pool (``step.target_argmax``: the target's argmax at every
    node): the target's argmax chains along the main path and the accepted path, and each candidate
    suffix hanging off an accepted node (or the root) replaced by the target's correction of it.
    Nothing without a draft or the argmax rows."""
    draft, verdict = step.draft, step.verdict
    tree, accepted = draft.tree, verdict.nodes(draft)
    main_nodes = set(draft.path_nodes)
    if len(draft) == 0 or step.target_argmax is None or len(step.target_argmax) != len(tree) + 1:
        return
    argmax = step.target_argmax.tolist()  # [N + 1]: row 0 after the root, row i + 1 after node i
    tokens = tree.tokens.tolist()
    root = state.tokens[step.committed_before - 1]
    length = pool.phrase_length

    def fed(nodes) -> tuple[list[int], list[int]]:  # a root path and the target's argmax along it
        return [root] + [tokens[i] for i in nodes], [argmax[0]] + [argmax[i + 1] for i in nodes]

    paths = [fed(draft.path_nodes)]
    if any(i not in main_nodes for i in accepted):
        paths.append(fed(accepted))
    # each candidate suffix hanging off an accepted node, as the target would have continued it
    children = tree.children
    for leaf in (i for i in range(len(tree)) if i not in main_nodes and not children[i]):
        path = tree.path_to(leaf)
        attach = max((j for j, node in enumerate(path) if node in main_nodes), default=-1)
        anchor = path[attach] if attach >= 0 else -1
        if anchor != -1 and anchor not in accepted:
            continue
        branch = path[attach + 1 :]
        key = tokens[anchor] if anchor >= 0 else root
        corrected = [argmax[anchor + 1]] + [argmax[i + 1] for i in branch]
        pool.replace(key, [tokens[i] for i in branch], corrected[:length])
    for chain, target in paths:  # the target's own greedy chains along the verified paths
        pool.add_all(argmax_chains(chain, target, length))
