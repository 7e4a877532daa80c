"""The decision rules of the ``pacer`` stop, as pure functions of predictions and costs (docs/pacer.md).

No models, no clocks. ``p`` holds the predictions of the current draft's tokens, p[i - 1] an
estimate of P(x_1 … x_i all accepted); ``cost`` is a measured cost model
(``pacer_bench.oracle.CostModel``: seconds per step). The stateful hook (``policy.PacerStop``) and
the noise-free replay (``replay``) both call these.

**paper** (PACER's own rule): stop when the block's mean prediction is below the threshold t;
else t ← min(t · ρ, t_max).

**throughput** (Dinkelbach's ratio rule): a step that sends n draft tokens emits on average
E(n) = 1 + Σ_{i≤n} p_i tokens and costs C(n) = step_s + n · draft_token_s + verify(n + 1) seconds.
At the running throughput λ (tokens per second) draft token i pays for itself when its gain
exceeds its marginal cost, p_i ≥ λ · (C(i) − C(i − 1)); maximising E(n) − λ · C(n) per step
maximises the long-run ratio Σ E / Σ C at λ = that ratio. After each block the draft keeps its
best prefix in the block and goes on only if the whole block paid.
"""

from __future__ import annotations

from typing import Sequence

import torch

from pacer_bench.oracle import CostModel


def paper_passes(mean: float, threshold: float) -> bool:
    """PACER's block test: the block's mean prediction reaches the threshold."""
    return mean >= threshold


def paper_next_threshold(threshold: float, rho: float, t_max: float) -> float:
    """The threshold after a passed block: t · ρ, capped at ``t_max``."""
    return min(threshold * rho, t_max)


def step_cost(cost: CostModel, n: int) -> float:
    """C(n): seconds of a step that drafts and sends n tokens (the target is fed the pending token
    and the draft)."""
    return cost.step(n)


def marginal_costs(cost: CostModel, start: int, end: int) -> torch.Tensor:
    """C(i) − C(i − 1) for draft tokens i = start + 1 … end: one token's drafting plus what its
    row adds to the verification forward ([end - start], float64)."""
    verify = torch.tensor([cost.verify(k + 1) for k in range(start, end + 1)], dtype=torch.float64)
    return cost.draft_token_s + (verify[1:] - verify[:-1])


def best_prefix(p: Sequence[float], start: int, end: int, cost: CostModel, rate: float) -> int:
    """The draft length m in ``start … end`` maximising E(m) − rate · C(m), tokens ``1 … start``
    being kept already; ties go to the shorter draft.

    ``p``: predictions of at least ``end`` draft tokens. With predictions that fall along the draft
    and costs that do not fall, this is the length just before the first token whose gain
    p_i is below ``rate`` · (C(i) − C(i − 1)).
    """
    gains = torch.tensor([float(x) for x in p[start:end]], dtype=torch.float64)  # [end - start]
    net = gains - rate * marginal_costs(cost, start, end)  # [end - start]
    # value of m = start + j relative to m = start: the sum of the first j net gains
    value = torch.cat([torch.zeros(1, dtype=torch.float64), net.cumsum(0)])  # [end - start + 1]
    return start + int(torch.argmax(value))  # argmax returns the first maximum: the shorter draft


def plain_rate(cost: CostModel) -> float:
    """Tokens per second without drafting, 1 / C(0): the rate a draft must beat, λ's start."""
    return 1.0 / step_cost(cost, 0)


class RunningRate:
    """λ: the throughput the rule compares against, learned from the steps' outcomes.

    An exponential moving average of emitted tokens and of their modelled seconds, kept apart
    (λ = tokens / seconds: Dinkelbach's ratio, so a slow step weighs by its length), from one
    plain-decoding step (1 token in C(0) seconds). The seconds come from the cost model, never a
    clock, so the decisions are a deterministic function of the outputs.
    """

    def __init__(self, cost: CostModel, decay: float):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        self.cost, self.decay = cost, decay
        self.reset()

    def reset(self) -> None:
        self.tokens, self.seconds = 1.0, step_cost(self.cost, 0)

    @property
    def value(self) -> float:
        return self.tokens / self.seconds

    def update(self, emitted: int, drafted: int, sent: int) -> None:
        """One step's outcome: ``emitted`` tokens for ``drafted`` tokens drafted, ``sent`` verified."""
        seconds = self.cost.step(drafted, sent=sent)
        self.tokens += self.decay * (emitted - self.tokens)
        self.seconds += self.decay * (seconds - self.seconds)


def cumulative_confidence(log_chosen: torch.Tensor, before: float = 0.0) -> torch.Tensor:
    """The draft's own estimate of P(x_1 … x_i accepted): Π_{j≤i} q_j(x_j), from log q_j(x_j) of
    tokens ``start …`` ([k]) and the summed log of the tokens before them (``before``) → [k]."""
    return (before + log_chosen.double().cumsum(0)).exp()
