"""Pure functions turning logits into the distributions tokens are drawn from.

No models, no globals, no seeding: randomness comes in as a ``torch.Generator``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .types import SamplingParams


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution after temperature, top-k and top-p, for each row of ``logits``.

    ``logits``: [..., vocab]. Returns float32 probabilities of the same shape. For greedy params
    (temperature 0) this is the point mass on the argmax (ties: lowest index, as ``torch.argmax``).
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # keep the smallest prefix whose mass reaches top_p (the top token is always kept)
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One token id per row of ``probs`` ([..., vocab] → [...]), drawn with ``generator``."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def position_seed(seed: int, position: int) -> int:
    """A 63-bit seed for the draw at ``position`` (an index into prompt + new tokens) of a generation
    seeded ``seed``: a fixed mix of the two (splitmix64's finaliser), so each position's randomness is
    a function of (seed, position) alone, whatever was drawn, drafted or verified before it."""
    x = (int(seed) * _MIX[0] + int(position) * _MIX[1] + 1) % (1 << 64)
    x = ((x ^ (x >> 30)) * _MIX[1]) % (1 << 64)
    x = ((x ^ (x >> 27)) * _MIX[2]) % (1 << 64)
    return (x ^ (x >> 31)) >> 1


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """[vocab] float32 Exponential(1) noise for the draw at ``position``: ``sample_with_noise`` turns
    it into the token the target's own sampling emits there."""
    generator = torch.Generator().manual_seed(position_seed(seed, position))
    return torch.empty(vocab).exponential_(generator=generator)


def sample_with_noise(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token id per row of ``probs`` ([..., vocab] → [...]): argmax(probs / noise), with
    ``noise`` [..., vocab] i.i.d. Exponential(1). P(i) = probs[i] / Σ probs exactly (the exponential
    race); a zero-probability token is never chosen."""
    return (probs.float() / noise.to(probs.device)).argmax(-1)


_NUMPY_ARGMAX = (torch.float32, torch.float64)  # dtypes numpy's argmax reads as torch stores them


def argmax_first(row: torch.Tensor) -> int:
    """The index of the largest value of a 1-D ``row``: what ``int(row.argmax())`` returns (the first
    of tied maxima; the first NaN if there is one). A float32 or float64 row on the CPU is read
    through numpy's ``argmax`` (same rule, ties and NaN included), whose kernel is vectorised: in
    torch 2.13 ``argmax`` and ``max(0)`` read one value at a time (about 50 µs for a 49152-wide row,
    numpy 8 µs); other rows (a device's, bfloat16) through ``argmax``."""
    if row.device.type == "cpu" and row.dtype in _NUMPY_ARGMAX and not row.requires_grad:
        return int(row.numpy().argmax())
    return int(row.argmax())


def take_rows(matrix: torch.Tensor, index: list[int]) -> torch.Tensor:
    """``matrix[index]``, a copy of the rows ``index`` lists: on the CPU (float32, float64) through
    numpy, where indexing a tensor by a list takes a slow path (about ten times numpy's time for a
    few rows); elsewhere through an index tensor."""
    if matrix.device.type == "cpu" and matrix.dtype in _NUMPY_ARGMAX and not matrix.requires_grad:
        # written into a tensor torch allocates (aligned as the index's result was: a matrix product
        # reading the rows takes the same path)
        out = torch.empty((len(index),) + tuple(matrix.shape[1:]), dtype=matrix.dtype)
        np.take(matrix.numpy(), index, axis=0, out=out.numpy())
        return out
    return matrix[torch.tensor(index, device=matrix.device)]


def choose(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator]):
    """Pick a token from one row of logits ([vocab]); returns ``(token, probs)``.

    Greedy returns ``probs = None`` (a point mass, never materialised): it is the argmax.
    """
    if params.greedy:
        return argmax_first(logits), None
    probs = logits_to_probs(logits, params)
    return int(sample(probs, generator)), probs
