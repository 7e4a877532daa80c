"""Hypothesis strategies for the acceptance math: distributions, distribution pairs, logits.

Distributions are float64 rows over small vocabularies (2 to 8 tokens) and deliberately include
the edge cases the rules must survive: one-hot rows, rows with zeros, uniform rows, and pairs with
p == q exactly, q one-hot, q with zeros where p has mass and vice versa.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

__all__ = [
    "MAX_VOCAB",
    "distribution",
    "distribution_pair",
    "distribution_rows",
    "distinct_logits",
    "logits_rows",
    "vocab_sizes",
]

MAX_VOCAB = 8

vocab_sizes = st.integers(min_value=2, max_value=MAX_VOCAB)

_weights = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_infinity=False)


def _normalize(weights: list[float]) -> torch.Tensor:
    row = torch.tensor(weights, dtype=torch.float64)
    return row / row.sum()


@st.composite
def distribution(draw, vocab: int) -> torch.Tensor:
    """A probability row [vocab] (float64, sums to 1): dense, with zeros, one-hot, uniform or peaked."""
    kind = draw(st.sampled_from(["dense", "zeros", "one_hot", "uniform", "peaked"]))
    if kind == "one_hot":
        row = torch.zeros(vocab, dtype=torch.float64)
        row[draw(st.integers(0, vocab - 1))] = 1.0
        return row
    if kind == "uniform":
        return torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
    weights = draw(st.lists(_weights, min_size=vocab, max_size=vocab))
    if kind == "zeros":  # zero out a random non-empty subset, keep at least one token
        zeros = draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab))
        weights = [0.0 if z else w for z, w in zip(zeros, weights)]
    if kind == "peaked":
        weights[draw(st.integers(0, vocab - 1))] += 20.0
    if sum(weights) < 1e-3:  # all (nearly) zero: put the mass on one token
        weights[draw(st.integers(0, vocab - 1))] = 1.0
    return _normalize(weights)


@st.composite
def distribution_pair(draw, vocab: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(target p, draft q) over the same vocabulary, both [vocab] float64.

    Relations covered: independent, equal (p == q exactly), q one-hot on a token p may lack,
    q a perturbed copy of p, q with zeros where p has mass, p with zeros where q has mass.
    """
    vocab = draw(vocab_sizes) if vocab is None else vocab
    p = draw(distribution(vocab))
    relation = draw(
        st.sampled_from(
            ["independent", "equal", "q_one_hot", "perturbed", "q_zeros_on_p_support", "p_zeros_on_q_support"]
        )
    )
    if relation == "equal":
        return p, p.clone()
    if relation == "q_one_hot":
        q = torch.zeros(vocab, dtype=torch.float64)
        q[draw(st.integers(0, vocab - 1))] = 1.0
        return p, q
    if relation == "perturbed":
        noise = draw(st.lists(st.floats(0.0, 0.05), min_size=vocab, max_size=vocab))
        return p, _normalize([a + b for a, b in zip(p.tolist(), noise)])
    q = draw(distribution(vocab))
    if relation == "q_zeros_on_p_support":
        keep = q * (p == 0)
        q = keep / keep.sum() if keep.sum() > 0 else q
    elif relation == "p_zeros_on_q_support":
        keep = p * (q == 0)
        p = keep / keep.sum() if keep.sum() > 0 else p
    return p, q


@st.composite
def distribution_rows(draw, rows: int, vocab: int) -> torch.Tensor:
    """[rows, vocab] float64, each row a ``distribution``."""
    return torch.stack([draw(distribution(vocab)) for _ in range(rows)])


@st.composite
def logits_rows(draw, rows: int, vocab: int) -> torch.Tensor:
    """[rows, vocab] float32 logits in [-8, 8] (ties possible)."""
    values = draw(st.lists(st.floats(-8.0, 8.0, width=32), min_size=rows * vocab, max_size=rows * vocab))
    return torch.tensor(values, dtype=torch.float32).reshape(rows, vocab)


@st.composite
def distinct_logits(draw, vocab: int | None = None, gap: float = 1e-2) -> torch.Tensor:
    """One row [vocab] float32 of logits at least ``gap`` apart (no argmax or top-k ties)."""
    vocab = draw(vocab_sizes) if vocab is None else vocab
    steps = draw(st.lists(st.integers(0, 800), min_size=vocab, max_size=vocab, unique=True))
    row = torch.tensor(steps, dtype=torch.float32) * gap - 4.0
    return row
