"""The decision rules of the training-free stop policies, as pure functions of tensors and lists.

No models, no state, no randomness. ``n`` is the number of draft tokens, ``vocab`` the vocabulary.
The policies in ``pacer_plugins.entropy_stop.policies`` call these; the tests check them directly.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

ABOVE_ANY_PROBABILITY = math.nextafter(1.0, 2.0)
"""The confidence threshold that stops after every first draft token (no probability exceeds it)."""


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of each row of ``probs`` ([..., vocab] → [...], float64).

    ``0 · log 0`` counts as 0, so one-hot rows and rows with zeros (top-k, top-p) are fine.
    """
    return torch.special.entr(probs.double()).sum(-1)


def acceptance_bound(entropies: torch.Tensor, gamma: float) -> torch.Tensor:
    """AdaEDL's / SVIP's entropy-based lower bound on a draft token's acceptance probability,
    ``1 − sqrt(γ · H(q))`` (same shape as ``entropies``; negative when ``γ · H > 1``)."""
    return 1.0 - torch.sqrt(gamma * entropies.clamp_min(0.0))


def first_below(scores: torch.Tensor, threshold: float) -> Optional[int]:
    """Index of the first entry of ``scores`` ([n]) strictly below ``threshold``, or None."""
    below = (scores < threshold).nonzero()
    return int(below[0]) if below.numel() else None


def chosen_probs(draft_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The draft's probability of each token it chose: ``draft_probs[i, tokens[i]]``.

    ``draft_probs``: [n, vocab]; ``tokens``: [n] int64. Returns [n].
    """
    return draft_probs.gather(-1, tokens[:, None]).squeeze(-1)


def verified_outcomes(drafted: int, accepted: int) -> list[int]:
    """Outcomes of the draft tokens the verifier judged: 1 for each accepted token, then 0 for the
    first rejected one (tokens after it were never judged, so they are not counted)."""
    return [1] * accepted + ([0] if accepted < drafted else [])


def calibrated_offset(offset: float, bounds: Sequence[float], outcomes: Sequence[int], rate: float) -> float:
    """The ``entropy`` policy's online calibration: an exponential moving average, one update per
    judged token, of how far its outcome (1 accepted, 0 rejected) lies above its bound:
    ``δ ← δ + η · ((o − b) − δ)``."""
    for bound, outcome in zip(bounds, outcomes):
        offset += rate * ((outcome - bound) - offset)
    return offset


def best_confidence_threshold(
    probs: Sequence[float], accepted: Sequence[int], fp_cost: float = 1.0, fn_cost: float = 3.0
) -> Optional[float]:
    """The threshold minimising ``fp_cost · FPR + fn_cost · FNR`` over observed pairs.

    ``probs[i]`` is the draft's probability of a judged draft token, ``accepted[i]`` its outcome.
    Read "continue drafting" (p ≥ t) as predicting acceptance: a false positive is a rejected token
    with p ≥ t, a false negative an accepted token with p < t; FPR = FP / rejected and
    FNR = FN / accepted. Candidates are the distinct observed probabilities plus
    ``ABOVE_ANY_PROBABILITY`` (predict no acceptance at all), as in an ROC curve; ties go to the
    highest threshold. This is the rule transformers applies with scikit-learn's ``roc_curve``
    (costs 1 and 3), computed by one sort and two cumulative sums. Returns None unless both
    outcomes occur (the rates would be undefined).
    """
    p = torch.tensor(list(probs), dtype=torch.float64)  # [m]
    y = torch.tensor(list(accepted), dtype=torch.bool)  # [m]
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return None
    order = torch.argsort(p, descending=True, stable=True)
    p_sorted, y_sorted = p[order], y[order]
    true_pos = torch.cumsum(y_sorted, 0)  # accepted tokens with p >= p_sorted[i]
    false_pos = torch.cumsum(~y_sorted, 0)  # rejected tokens with p >= p_sorted[i]
    # a threshold at a distinct value counts every token with that probability as positive
    last_of_value = torch.cat([(p_sorted[1:] != p_sorted[:-1]).nonzero().flatten(), torch.tensor([len(p_sorted) - 1])])
    thresholds = torch.cat([torch.tensor([ABOVE_ANY_PROBABILITY], dtype=torch.float64), p_sorted[last_of_value]])
    tp = torch.cat([torch.zeros(1, dtype=torch.long), true_pos[last_of_value]])  # [k + 1]
    fp = torch.cat([torch.zeros(1, dtype=torch.long), false_pos[last_of_value]])  # [k + 1]
    # the cost times positives · negatives: integer counts keep equal costs exactly equal (ties)
    costs = fp_cost * (fp * positives).double() + fn_cost * ((positives - tp) * negatives).double()
    return float(thresholds[int(torch.argmin(costs))])  # the first minimum: the highest threshold
