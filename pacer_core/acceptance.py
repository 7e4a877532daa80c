"""Acceptance rules of lossless speculative decoding, as pure functions.

Vocabulary (see docs/concepts.md): **accepted** draft tokens are the longest prefix the verifier
keeps; **recovered** is the token drawn from the residual distribution at the first rejection;
**bonus** is drawn from the target's distribution after the last draft token when all were accepted.
Randomness is passed in (``uniforms``, ``generator``); nothing here seeds or touches a model.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .sampling import sample
from .types import Verdict


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Accept while each draft token equals the target's argmax at its position.

    ``draft_tokens``: [n]; ``target_logits``: [n + 1, vocab] — row i scores the token after the
    committed sequence plus ``draft_tokens[:i]``. The next token is the target's argmax at the first
    mismatch (recovered) or after the last draft token (bonus).
    """
    n = int(draft_tokens.shape[0])
    target_argmax = target_logits.argmax(-1)  # [n + 1]
    mismatch = (draft_tokens != target_argmax[:n]).nonzero()
    accepted = int(mismatch[0]) if mismatch.numel() else n
    kind = "bonus" if accepted == n else "recovered"
    return Verdict(accepted=accepted, next_token=int(target_argmax[accepted]), next_kind=kind)


def greedy_verify_branches(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    branches: Sequence[torch.Tensor],
    branch_logits: Sequence[torch.Tensor],
) -> Verdict:
    """Greedy verification of a draft followed by candidate branches.

    ``branch_logits[j]``: [m_j, vocab], row i scores the token after ``branches[j][: i + 1]`` (the
    row before the branch's first token is the draft's last row, ``target_logits[n]``). Branches are
    only considered when the whole draft is accepted; the branch with the longest greedy match wins
    (first one on ties), and the bonus token is the target's argmax after it.
    """
    verdict = greedy_verify(draft_tokens, target_logits)
    if verdict.next_kind != "bonus" or not branches:
        return verdict
    best, best_len, best_next = None, 0, verdict.next_token
    for j, (branch, logits) in enumerate(zip(branches, branch_logits)):
        # the target's argmax before each branch token: the draft's last row, then the branch's rows
        expected = torch.cat([verdict.next_token * torch.ones(1, dtype=torch.long), logits.argmax(-1)])
        match = (branch != expected[: branch.shape[0]]).nonzero()
        length = int(match[0]) if match.numel() else int(branch.shape[0])
        if length > best_len:
            best, best_len, best_next = j, length, int(expected[length])
    if best is None:
        return verdict
    return Verdict(
        accepted=verdict.accepted, next_token=best_next, next_kind="bonus",
        branch=best, branch_accepted=best_len,
    )


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, target_probs − draft_probs)) for [vocab] rows.

    When the two distributions are (numerically) equal the residual has no mass; rejection then has
    probability ~0 and any choice keeps the output exact, so the target distribution is returned
    instead of dividing 0 by 0.
    """
    residual = (target_probs - draft_probs).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), target_probs)


def speculative_verify(
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    generator: Optional[torch.Generator],
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    ``draft_tokens``: [n]; ``draft_probs``: [n, vocab], the distributions the drafter sampled from,
    or None when the drafter has none (a point mass on each token); ``target_probs``: [n + 1, vocab]
    after the same temperature/top-k/top-p; ``uniforms``: [n] draws from U[0, 1).

    Token i is accepted when p(x) > 0 and (``p(x) >= q(x)`` or ``uniforms[i] * q(x) < p(x)``) —
    min(1, p/q) without dividing, so zeros in q need no special case and p(x) = 0 never accepts. At the first rejection the recovered
    token is drawn from normalize(max(0, p − q)); if all are accepted the bonus is drawn from p at
    the next position.
    """
    n = int(draft_tokens.shape[0])
    if n:
        rows = torch.arange(n)
        p_x = target_probs[rows, draft_tokens]  # [n]
        q_x = torch.ones(n) if draft_probs is None else draft_probs[rows, draft_tokens]  # [n]
        # accept with probability min(1, p/q), without dividing: p > 0 and (p ≥ q or u·q < p); the
        # p ≥ q test keeps p == q accepted when u·q rounds up to p (subnormal probabilities)
        accept = (p_x > 0) & ((p_x >= q_x) | (uniforms[:n] * q_x < p_x))
        rejected = (~accept).nonzero()
        accepted = int(rejected[0]) if rejected.numel() else n
    else:
        accepted = 0
    if accepted == n:
        return Verdict(accepted=n, next_token=int(sample(target_probs[n], generator)), next_kind="bonus")
    if draft_probs is None:
        q_row = torch.zeros_like(target_probs[accepted])
        q_row[draft_tokens[accepted]] = 1.0
    else:
        q_row = draft_probs[accepted]
    residual = residual_distribution(target_probs[accepted], q_row)
    return Verdict(accepted=accepted, next_token=int(sample(residual, generator)), next_kind="recovered")
