"""Chain replays: how much could a perfect draft length gain, and how much of it does a policy get?

Pure functions of logged steps (``steplog``) and a measured cost model; no models, no clocks.

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
draft (plus ``step_s``, a step's fixed cost, where measured); plain decoding costs ``step(0)`` =
``step_s + verify(1)`` per token, so a simulated speedup is ``(emitted / seconds) · step(0)``.
The replay treats logged steps as independent situations: it does not re-simulate where a
different γ would have started its next step (docs/benchmarks.md).

**Token trees**: a tree step logs its depth as ``drafted``, its accepted path as ``accepted`` and the
nodes the target verified as ``nodes``. Its verification feeds ``nodes + 1`` tokens with an ancestor
mask, so ``replay_logged`` charges ``verify_tree(nodes + 1)`` (the tree-masked forwards measured,
else the chain's). A fixed γ or the oracle cannot be replayed on a tree log (the nodes of a tree cut
at depth γ are not logged, and a chain could not have accepted a path through side nodes): those
replays refuse one, and the report replays chain stacks only.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import attrs

from pacer_core.cost_profiles import CostModel

from .steplog import LoggedStep, is_tree_log

__all__ = ["Replay", "analyse", "captured_share", "replay_best", "replay_fixed", "replay_logged", "replay_oracle"]


def _chain_only(log: Sequence[LoggedStep], what: str) -> None:
    tree = next((s for s in log if s.is_tree), None)
    if tree is not None:
        raise ValueError(
            f"{what} replays a chain log, but a step verified {tree.nodes} tree nodes for depth "
            f"{tree.drafted}: log a stack drafting a chain"
        )


@attrs.frozen
class Replay:
    emitted: int
    seconds: float
    steps: int

    def speedup(self, cost: CostModel) -> float:
        """Tokens/s of this replay over plain decoding's (one step without a draft per token,
        ``step(0)``: a ``verify(1)`` forward plus ``step_s``)."""
        return (self.emitted / self.seconds) * cost.step(0) if self.seconds > 0 else 0.0


def _replay(choices: Iterable[tuple], cost: CostModel) -> Replay:
    """``choices``: (drafted, accepted) of chain steps, or (drafted, accepted, nodes)."""
    emitted, seconds, steps = 0, 0.0, 0
    for drafted, accepted, *nodes in choices:
        emitted += accepted + 1
        seconds += cost.step(drafted, *nodes)
        steps += 1
    return Replay(emitted, seconds, steps)


def replay_fixed(log: Sequence[LoggedStep], gamma: int, cost: CostModel) -> Replay:
    """A fixed window γ replayed on a long-draft log (γ must not exceed the log's window)."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    _chain_only(log, "a fixed γ")
    return _replay(((min(gamma, s.drafted), min(gamma, s.accepted)) for s in log), cost)


def replay_oracle(log: Sequence[LoggedStep], cost: CostModel) -> Replay:
    """The oracle: each step drafts exactly the tokens that will be accepted."""
    _chain_only(log, "the oracle")
    return _replay(((s.accepted, s.accepted) for s in log), cost)


def replay_best(log: Sequence[LoggedStep], cost: CostModel, iterations: int = 50) -> Replay:
    """The cost-optimal oracle: per step the draft length in 0..accepted that maximises the overall
    emitted/seconds (Dinkelbach's iteration on the ratio). It equals ``replay_oracle`` unless
    extending an accepted run costs more per token than the achieved rate pays."""
    _chain_only(log, "the cost-optimal oracle")
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
    """A policy charged for its own logged choices (a tree step: its depth drafted, its nodes verified)."""
    return _replay(((s.drafted, s.accepted, s.nodes) for s in log), cost)


def captured_share(policy: float, best_fixed: float, oracle: float, min_gap: float = 0.005) -> Optional[float]:
    """The share of the oracle's gain over the best fixed γ that a policy's speedup captures:
    0 = no better than the best fixed γ, 1 = as good as the oracle (negative: worse than best fixed).
    None when the oracle gains less than ``min_gap`` (relative) over the best fixed γ: then there is
    nothing to capture and the ratio would only magnify noise."""
    gap = oracle - best_fixed
    if gap <= min_gap * abs(best_fixed) or gap <= 1e-12:
        return None
    return (policy - best_fixed) / gap


def analyse(
    log: Sequence[LoggedStep],
    cost: CostModel,
    gammas: Sequence[int],
    policies: Optional[dict[str, Sequence[LoggedStep]]] = None,
) -> dict:
    """Simulated speedups of each fixed γ and the oracle on ``log`` (a chain log), and of each policy
    on its own log, with the share of the oracle's gain over the best fixed γ that each chain policy
    captures (None for a tree policy: the chain oracle does not bound a tree)."""
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
        tree = is_tree_log(steps)  # a tree may beat the chain oracle: no share of its gain to capture
        out["policies"][name] = {
            "steps": len(steps),
            "simulated_speedup": simulated,
            "tree": tree,
            "captured": None if tree else captured_share(simulated, best, oracle),
        }
    return out
