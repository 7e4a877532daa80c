"""Oracle replay: how much could a perfect draft length gain, and how much of it does a policy get?

Pure functions of logged steps and a measured cost model; no models, no clocks.

A **long-draft log** is the per-step record of a stack drafting a long fixed window γ_log (e.g. 16)
with greedy verification: step i drafted ``drafted`` tokens (fewer than γ_log only when the drafter
ran out or the budget ended) and the verifier accepted ``accepted`` of them, the number before the
first rejection. Replayed step by step:

- a **fixed γ** (γ ≤ γ_log) would have drafted ``min(γ, drafted)`` tokens and accepted
  ``min(γ, accepted)`` of them;
- the **oracle** drafts exactly ``accepted`` tokens, all accepted (no wasted draft or verify work);
  when the whole window was accepted the true ideal length may be longer, so the oracle is an upper
  bound among lengths up to γ_log;
- the **cost-optimal oracle** may also stop before the first rejection when extending an accepted
  run would lower the overall rate (it never does when verification is nearly flat in k);
- a **logged policy** (any stack's own log) is charged for what it actually drafted.

Each step emits its accepted tokens plus one (the recovered or bonus token). A step costs
``draft(n) + verify(n + 1)`` for n draft tokens, since the target is fed the pending token plus the
draft; plain decoding costs ``verify(1)`` per token, so a simulated speedup is
``(emitted / seconds) · verify(1)``. The replay treats logged steps as independent situations: it
does not re-simulate where a different γ would have started its next step (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import attrs

__all__ = ["CostModel", "LoggedStep", "Replay", "analyse", "captured_share", "monotone", "replay_best",
           "replay_fixed", "replay_logged", "replay_oracle", "steps_from_metrics"]


def monotone(values: Sequence[float]) -> tuple[float, ...]:
    """The closest non-decreasing sequence (least squares, pool-adjacent-violators): measured
    verification times are noisy, but verifying more tokens never costs less."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return tuple(m for m, w in blocks for _ in range(int(w)))


@attrs.frozen
class CostModel:
    """Measured costs in seconds: ``verify_s[k - 1]`` is one target forward over k tokens (k = 1..K);
    ``draft_token_s`` is the drafter's cost per draft token."""

    verify_s: tuple[float, ...] = attrs.field(converter=tuple)
    draft_token_s: float = 0.0

    def __attrs_post_init__(self) -> None:
        if not self.verify_s or min(self.verify_s) <= 0:
            raise ValueError("verify_s needs at least one positive time (k = 1)")

    def verify(self, k: int) -> float:
        """Cost of verifying k tokens; beyond the measured K, extrapolated linearly from the last two."""
        if k < 1:
            raise ValueError(f"a target forward covers at least one token, got k={k}")
        known = self.verify_s
        if k <= len(known):
            return known[k - 1]
        slope = known[-1] - known[-2] if len(known) >= 2 else 0.0
        return known[-1] + max(slope, 0.0) * (k - len(known))

    def draft(self, n: int) -> float:
        return n * self.draft_token_s

    def step(self, drafted: int) -> float:
        return self.draft(drafted) + self.verify(drafted + 1)


@attrs.frozen
class LoggedStep:
    drafted: int
    accepted: int  # accepted before the first rejection, <= drafted


@attrs.frozen
class Replay:
    emitted: int
    seconds: float
    steps: int

    def speedup(self, cost: CostModel) -> float:
        """Tokens/s of this replay over plain decoding's (one ``verify(1)`` forward per token)."""
        return (self.emitted / self.seconds) * cost.verify(1) if self.seconds > 0 else 0.0


def steps_from_metrics(metrics: dict) -> list[LoggedStep]:
    """The logged steps of one generation's metrics (``drafted_per_step``, ``accepted_per_step``)."""
    return [LoggedStep(int(d), int(a)) for d, a in zip(metrics.get("drafted_per_step", ()),
                                                       metrics.get("accepted_per_step", ()))]


def _replay(choices: Iterable[tuple[int, int]], cost: CostModel) -> Replay:
    emitted, seconds, steps = 0, 0.0, 0
    for drafted, accepted in choices:
        emitted += accepted + 1
        seconds += cost.step(drafted)
        steps += 1
    return Replay(emitted, seconds, steps)


def replay_fixed(log: Sequence[LoggedStep], gamma: int, cost: CostModel) -> Replay:
    """A fixed window γ replayed on a long-draft log (γ must not exceed the log's window)."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    return _replay(((min(gamma, s.drafted), min(gamma, s.accepted)) for s in log), cost)


def replay_oracle(log: Sequence[LoggedStep], cost: CostModel) -> Replay:
    """The oracle: each step drafts exactly the tokens that will be accepted."""
    return _replay(((s.accepted, s.accepted) for s in log), cost)


def replay_best(log: Sequence[LoggedStep], cost: CostModel, iterations: int = 50) -> Replay:
    """The cost-optimal oracle: per step the draft length in 0..accepted that maximises the overall
    emitted/seconds (Dinkelbach's iteration on the ratio). It equals ``replay_oracle`` unless
    extending an accepted run costs more per token than the achieved rate pays."""
    best = replay_oracle(log, cost)
    rate = best.emitted / best.seconds if best.seconds > 0 else 0.0
    for _ in range(iterations):
        lengths = [max(range(s.accepted + 1), key=lambda n: (n + 1) - rate * cost.step(n)) for s in log]
        replay = _replay(((n, n) for n in lengths), cost)
        new_rate = replay.emitted / replay.seconds if replay.seconds > 0 else 0.0
        if new_rate <= rate * (1 + 1e-12):
            break
        best, rate = replay, new_rate
    return best


def replay_logged(log: Sequence[LoggedStep], cost: CostModel) -> Replay:
    """A policy charged for its own logged choices."""
    return _replay(((s.drafted, s.accepted) for s in log), cost)


def captured_share(policy: float, best_fixed: float, oracle: float, min_gap: float = 0.005) -> Optional[float]:
    """The share of the oracle's gain over the best fixed γ that a policy's speedup captures:
    0 = no better than the best fixed γ, 1 = as good as the oracle (negative: worse than best fixed).
    None when the oracle gains less than ``min_gap`` (relative) over the best fixed γ: then there is
    nothing to capture and the ratio would only magnify noise."""
    gap = oracle - best_fixed
    if gap <= min_gap * abs(best_fixed) or gap <= 1e-12:
        return None
    return (policy - best_fixed) / gap


def analyse(log: Sequence[LoggedStep], cost: CostModel, gammas: Sequence[int],
            policies: Optional[dict[str, Sequence[LoggedStep]]] = None) -> dict:
    """Simulated speedups of each fixed γ and the oracle on ``log``, and of each policy on its own
    log, with the share of the oracle's gain over the best fixed γ that each policy captures."""
    fixed = {int(g): replay_fixed(log, g, cost).speedup(cost) for g in gammas}
    best_gamma = max(fixed, key=lambda g: (fixed[g], -g)) if fixed else None
    best = fixed[best_gamma] if fixed else 0.0
    oracle = replay_oracle(log, cost).speedup(cost)
    optimal = replay_best(log, cost).speedup(cost)
    out = {
        "steps": len(log),
        "fixed": fixed,
        "best_fixed_gamma": best_gamma,
        "best_fixed_speedup": best,
        "oracle_speedup": oracle,
        "oracle_over_best_fixed": oracle / best if best > 0 else None,
        "optimal_oracle_speedup": optimal,
        "policies": {},
    }
    for name, steps in (policies or {}).items():
        simulated = replay_logged(steps, cost).speedup(cost) if steps else 0.0
        out["policies"][name] = {"steps": len(steps), "simulated_speedup": simulated,
                                 "captured": captured_share(simulated, best, oracle)}
    return out
