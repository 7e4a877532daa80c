"""Acceptance rules of lossless speculative decoding, as pure functions.

Vocabulary (see docs/concepts.md): **accepted** draft tokens are the longest prefix the verifier
keeps; **recovered** is the token drawn from the residual distribution at the first rejection;
**bonus** is drawn from the target's distribution after the last draft token when all were accepted.
Randomness is passed in (``uniforms``, ``generator``); nothing here seeds or touches a model.
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

import torch

from .sampling import argmax_first, sample, sample_with_noise
from .types import Verdict

_Kind = Literal["recovered", "bonus"]  # Verdict.next_kind


def _children(parents: Optional[torch.Tensor], n: int) -> dict[int, list[int]]:
    """Each node's children in node order (key -1: the root's); ``parents`` None is a chain."""
    children: dict[int, list[int]] = {i: [] for i in range(-1, n)}
    for i, parent in enumerate(range(-1, n - 1) if parents is None else parents.tolist()):
        children[parent].append(i)
    return children


def greedy_verify(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, parents: Optional[torch.Tensor] = None
) -> Verdict:
    """Accept the longest root path that follows the target's argmax, then its argmax after it.

    ``draft_tokens``: [n] tree nodes; ``parents``: [n], each node's parent (-1: the root, the last
    committed token), or None for a chain; ``target_logits``: [n + 1, vocab] — row 0 scores the
    token after the root, row i + 1 the token after node i's root path. Where several children
    carry the target's token (duplicate siblings), the one with the longest accepted continuation
    wins (the first on ties). The next token is the target's argmax after the last accepted node:
    ``bonus`` when that node is a leaf, else ``recovered``.
    """
    n = int(draft_tokens.shape[0])
    tokens = draft_tokens.tolist()
    children = _children(parents, n)
    argmax = _row_argmax(target_logits)

    def longest(node: int) -> list[int]:  # accepted nodes below ``node``
        best: list[int] = []
        for child in children[node]:
            if tokens[child] == argmax(node + 1):
                path = [child] + longest(child)
                if len(path) > len(best):
                    best = path
        return best

    path = longest(-1)
    last = path[-1] if path else -1
    kind: _Kind = "recovered" if children[last] else "bonus"
    return Verdict(
        accepted=len(path), next_token=argmax(last + 1), next_kind=kind, path=None if parents is None else tuple(path)
    )


def _row_argmax(logits: torch.Tensor) -> Callable[[int], int]:
    """``row -> argmax of logits[row]`` ([rows, vocab]). On the CPU (``logits.is_cpu``) each row is
    read when first asked for (a greedy walk reads the rows along its path, about τ of a tree's rows);
    on a device every row at once, in one kernel and one copy back (one wait for the device per
    verification)."""
    if not logits.is_cpu:
        rows = logits.argmax(-1).tolist()
        return rows.__getitem__
    seen: dict[int, int] = {}

    def argmax(row: int) -> int:
        if row not in seen:
            seen[row] = argmax_first(logits[row])
        return seen[row]

    return argmax


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, target_probs − draft_probs)) for [vocab] rows.

    When the two distributions are equal the residual has no mass; rejection then has probability 0
    and any choice keeps the output exact, so the target distribution is returned instead of
    dividing 0 by 0. Any positive mass is normalized, however small: it is exactly what a rejection
    of that (tiny) probability must draw from.
    """
    residual = (target_probs - draft_probs).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / torch.where(mass > 0, mass, torch.ones_like(mass)), target_probs)


def speculative_verify(
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    generator: Optional[torch.Generator],
    parents: Optional[torch.Tensor] = None,
    sampled: Optional[torch.Tensor] = None,
    next_noise: Optional[Callable[[int], torch.Tensor]] = None,
) -> Verdict:
    """Speculative sampling on a token tree (Leviathan et al. 2023; SpecInfer's multi-candidate rule).

    ``draft_tokens``: [n] tree nodes; ``parents``: [n] (-1: the root), or None for a chain;
    ``draft_probs``: [n, vocab], the distribution each node was chosen from, or None (point masses);
    ``sampled``: [n] bool, whether a node was drawn at random from its row (siblings independently),
    else chosen deterministically and treated as a point mass (default: all drawn);
    ``target_probs``: [n + 1, vocab] after the same temperature/top-k/top-p, row 0 after the root,
    row i + 1 after node i; ``uniforms``: [n] draws from U[0, 1), one per node; ``next_noise``:
    ``next_noise(accepted)`` is the [vocab] Exponential(1) noise the next token is drawn with
    (``sample_with_noise``; per-position randomness), else it is drawn with ``generator``.

    From the root, the children of the current node are tried in node order against the current
    distribution p (the target's row for that node): child x with draft distribution q is accepted
    when p(x) > 0 and (``p(x) >= q(x)`` or ``uniforms[x] * q(x) < p(x)``) — min(1, p/q) without
    dividing — and the walk moves on to x; after each rejection p becomes normalize(max(0, p − q)),
    which for a point mass removes x. When every child is rejected the recovered token is drawn
    from the final p; at a leaf the bonus token is drawn from its row. On a chain this is the
    classic rule.
    """
    n = int(draft_tokens.shape[0])
    children = _children(parents, n)
    tokens = draft_tokens.tolist()
    path: list[int] = []
    node = -1

    def verdict(kind: _Kind, p: torch.Tensor) -> Verdict:  # a chain's path is its first accepted nodes
        token = sample(p, generator) if next_noise is None else sample_with_noise(p, next_noise(len(path)))
        return Verdict(
            accepted=len(path), next_token=int(token), next_kind=kind, path=None if parents is None else tuple(path)
        )

    while True:
        p = target_probs[node + 1]  # [vocab]
        if not children[node]:
            return verdict("bonus", p)
        for child in children[node]:
            x = tokens[child]
            point = draft_probs is None or (sampled is not None and not bool(sampled[child]))
            q_x = 1.0 if point or draft_probs is None else float(draft_probs[child, x])
            p_x = float(p[x])
            # accept with probability min(1, p/q), without dividing: p > 0 and (p ≥ q or u·q < p); the
            # p ≥ q test keeps p == q accepted when u·q rounds up to p (subnormal probabilities)
            if p_x > 0 and (p_x >= q_x or float(uniforms[child]) * q_x < p_x):
                path.append(child)
                node = child
                break
            if point or draft_probs is None:
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft_probs[child]
            p = residual_distribution(p, q)
        else:
            return verdict("recovered", p)


def sample_match_verify(
    draft_tokens: torch.Tensor, target_probs: torch.Tensor, noise: torch.Tensor, parents: Optional[torch.Tensor] = None
) -> Verdict:
    """Keep draft tokens while they equal the token the target's own sampling draws there.

    ``draft_tokens``: [n] tree nodes; ``parents``: [n] (-1: the root), or None for a chain;
    ``target_probs``: [n + 1, vocab] (row 0 after the root, row i + 1 after node i); ``noise``:
    [depth + 1, vocab] Exponential(1) noise, row d for the token at depth d (0: the root's child),
    the same noise plain decoding draws that position with. At each node the target's token is
    ``sample_with_noise(row, noise[depth])``; the walk moves to the child carrying it (the first, on
    duplicate siblings) and stops where none does: that token is then ``recovered`` (or ``bonus``
    at a leaf). Every emitted token is the one plain sampling emits with the same noise, so the
    output is exactly plain sampling's, whatever was drafted (greedy, temperature 0: the argmax).
    """
    n = int(draft_tokens.shape[0])
    children = _children(parents, n)
    tokens = draft_tokens.tolist()
    path: list[int] = []
    node = -1
    while True:
        drawn = int(sample_with_noise(target_probs[node + 1], noise[len(path)]))
        child = next((c for c in children[node] if tokens[c] == drawn), None)
        if child is None:
            return Verdict(
                accepted=len(path),
                next_token=drawn,
                next_kind="recovered" if children[node] else "bonus",
                path=None if parents is None else tuple(path),
            )
        path.append(child)
        node = child
