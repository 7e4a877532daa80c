"""The decision rules of the ``pacer`` stop, as pure functions of predictions and costs (docs/pacer.md).

No models, no clocks. ``p`` holds the predictions of the current draft's tokens, p[i - 1] an
estimate of P(x_1 … x_i all accepted); ``cost`` is a measured cost model
(``pacer_core.cost_profiles.CostModel``: seconds per step). The stateful hook (``policy.PacerStop``) and
the noise-free replay (``replay``) both call these.

**paper** (PACER's own rule): stop when the block's mean prediction is below the threshold t;
else t ← min(t · ρ, t_max).

**throughput** (Dinkelbach's ratio rule): a step that sends n draft tokens emits on average
E(n) = 1 + Σ_{i≤n} p_i tokens and costs C(n) = step_s + d · draft_token_s + verify(n + 1) seconds
(d ≥ n tokens drafted). Maximising E − λ · C in every step at λ = the running throughput maximises
the long-run ratio Σ E / Σ C. The rule takes the two decisions of a step separately, each counting
only the cost still ahead of it:

- *go on* (``next_block_pays``): draft the next block if its forecast gain pays its drafting and
  verification, p̂_{e+j} ≥ λ · (draft_token_s + verify(e+j+1) − verify(e+j)) summed over its best
  prefix. The next tokens' p are unknown until drafted; the forecast carries the last token's
  conditional acceptance forward, p̂_{e+j} = p_e · r^j with r = p_e / p_{e−1} (p_0 = 1).
- *send* (``send_length``): once drafting stops, the drafted tokens' cost is spent whatever is
  sent, so the draft is cut to the m maximising Σ_{i≤m} p_i − λ · verify(m + 1): a token is
  verified while its gain pays the row it adds to the target's forward.

Both read p as calibrated. M_B is not calibrated on every text (on a hard writing prompt it
predicted 0.42 per judged token where 0.16 were accepted), so the rule reads p recalibrated by the
generation's own outcome (``recalibrated``; the stop's ``recalibrate``, on by default): every p_i
times κ = (accepted + s) / (predicted + s), the draft tokens accepted and the sum of their
predictions over this generation's verified tokens, with s predicted tokens of prior belief that
M_B is right (κ = 1 before any outcome).
"""

from __future__ import annotations

from typing import Sequence

import torch

from pacer_core.cost_profiles import CostModel


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


def forecast(p: Sequence[float], end: int, ahead: int) -> torch.Tensor:
    """p̂ of the ``ahead`` tokens after draft token ``end`` (≥ 1): p_end · r^j with r = p_end / p_{end−1}
    (p_0 = 1), the last token's conditional acceptance carried forward ([ahead], float64)."""
    last = float(p[end - 1])
    before = float(p[end - 2]) if end >= 2 else 1.0
    ratio = min(last / before, 1.0) if before > 0 else 0.0
    return last * ratio ** torch.arange(1, ahead + 1, dtype=torch.float64)


def next_block_pays(p: Sequence[float], end: int, b: int, cost: CostModel, rate: float) -> bool:
    """Whether drafting the ``b`` tokens after draft token ``end`` is expected to pay: some prefix of
    the block has forecast gains above its marginal costs (drafting and verification) at ``rate``."""
    net = forecast(p, end, b) - rate * marginal_costs(cost, end, end + b)  # [b]
    return bool(net.cumsum(0).max() > 0)


def send_length(p: Sequence[float], low: int, end: int, cost: CostModel, rate: float) -> int:
    """The length m in ``low … end`` to verify of a draft of ``end`` tokens whose drafting has
    stopped: maximising Σ_{i≤m} p_i − rate · verify(m + 1), the drafting being spent either way;
    ties go to the shorter draft. With falling predictions and non-falling verification costs, every
    token whose p_i exceeds the row it adds, rate · (verify(i + 1) − verify(i)), and no other."""
    gains = torch.tensor([0.0] + [float(x) for x in p[:end]], dtype=torch.float64).cumsum(0)  # [end + 1]
    verify = torch.tensor([cost.verify(m + 1) for m in range(end + 1)], dtype=torch.float64)  # [end + 1]
    value = (gains - rate * verify)[low:]  # [end - low + 1]
    return low + int(torch.argmax(value))  # argmax returns the first maximum: the shorter draft


def recalibrated(p: Sequence[float], accepted: float, predicted: float, prior: float) -> list[float]:
    """p_i · κ, capped at 1, with κ = (accepted + prior) / (predicted + prior): the predictions
    rescaled by how many of the generation's verified draft tokens were accepted against how many
    the predictions expected (Σ p over them), ``prior`` predicted tokens pulling κ towards 1. A
    common factor keeps cumulative predictions non-increasing."""
    if prior <= 0:
        raise ValueError(f"prior must be positive (predicted tokens of belief in M_B), got {prior}")
    scale = (accepted + prior) / (predicted + prior)
    return [min(1.0, float(x) * scale) for x in p]


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
