"""Held-out quality of acceptance predictions: accuracy, ROC AUC and calibration (ECE), in torch."""

from __future__ import annotations

import torch


def accuracy(probs: torch.Tensor, labels: torch.Tensor, threshold: float = 0.5) -> float:
    """Fraction of tokens whose prediction (prob >= threshold) equals the label."""
    return float(((probs >= threshold) == labels.bool()).float().mean())


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: the probability that a random accepted token scores higher than a
    random rejected one (ties count one half), from the Mann-Whitney rank sum. NaN if one class is
    missing."""
    scores, labels = scores.double().flatten(), labels.bool().flatten()
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = torch.argsort(scores, stable=True)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.double)
    # tied scores share the mean of their ranks
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2  # mean of ranks end-count+1 .. end
    ranks[order] = mean_rank[inverse]
    rank_sum = float(ranks[labels].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """ECE with ``bins`` equal-width bins on [0, 1]: Σ_b (n_b / N) · |mean prob_b − accepted rate_b|."""
    probs, labels = probs.double().flatten(), labels.double().flatten()
    index = (probs * bins).long().clamp(0, bins - 1)
    prob_sum = torch.bincount(index, weights=probs, minlength=bins)
    label_sum = torch.bincount(index, weights=labels, minlength=bins)
    return float((prob_sum - label_sum).abs().sum() / max(1, len(probs)))


def prediction_report(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """The held-out metrics a checkpoint's manifest carries."""
    probs, labels = probs.double(), labels.double()
    eps = 1e-7
    log_loss = -(labels * probs.clamp_min(eps).log() + (1 - labels) * (1 - probs).clamp_min(eps).log()).mean()
    return {
        "tokens": int(len(probs)),
        "accepted_rate": float(labels.mean()),
        "mean_prediction": float(probs.mean()),
        "accuracy": accuracy(probs, labels),
        "auc": roc_auc(probs, labels),
        "ece": expected_calibration_error(probs, labels),
        "brier": float(((probs - labels) ** 2).mean()),
        "log_loss": float(log_loss),
    }


def position_report(probs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> list[dict[str, float]]:
    """Per draft position (0 = the first draft token): tokens, accepted rate, mean prediction, ROC AUC
    (NaN where one outcome is missing) and ECE of ``probs`` [N] against ``labels`` [N] at ``positions`` [N]."""
    rows = []
    for p in range(int(positions.max()) + 1 if len(positions) else 0):
        at = positions == p
        if not bool(at.any()):
            continue
        rows.append(
            {
                "position": p,
                "tokens": int(at.sum()),
                "accepted_rate": float(labels[at].double().mean()),
                "mean_prediction": float(probs[at].double().mean()),
                "auc": roc_auc(probs[at], labels[at]),
                "ece": expected_calibration_error(probs[at], labels[at]),
            }
        )
    return rows
