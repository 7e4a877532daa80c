"""Pure functions turning logits into the distributions tokens are drawn from.

No models, no globals, no seeding: randomness comes in as a ``torch.Generator``.
"""

from __future__ import annotations

from typing import Optional

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


def choose(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator]):
    """Pick a token from one row of logits ([vocab]); returns ``(token, probs)``.

    Greedy returns ``probs = None`` (a point mass, never materialised): it is the argmax.
    """
    if params.greedy:
        return int(logits.argmax()), None
    probs = logits_to_probs(logits, params)
    return int(sample(probs, generator)), probs
