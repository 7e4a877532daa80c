"""The oracle replay of chain logs (``pacer_bench.replay.chains``, the logs of
``pacer_bench.replay.steplog``), hand-computed, and the cost model it prices steps with."""

from __future__ import annotations

import pytest

from pacer_bench.replay.chains import analyse, captured_share, replay_best, replay_fixed, replay_logged, replay_oracle
from pacer_bench.replay.steplog import LoggedStep, steps_from_metrics
from pacer_core.cost_profiles import CostModel, cost_model, monotone

# -- oracle replay: hand-computed ---------------------------------------------------------------
# verify(k) for k = 1..5 tokens; 0.1 s per draft token; a step drafting n costs 0.1 n + verify(n + 1):
# n = 0: 1.0, 1: 1.3, 2: 1.6, 3: 1.9, 4: 2.2. Log of a γ = 4 stack: (drafted, accepted before the
# first rejection) = (4, 4), (4, 1), (4, 0), (2, 2) (the drafter ran out after 2).
COST = CostModel((1.0, 1.2, 1.4, 1.6, 1.8), 0.1)
LOG = [LoggedStep(4, 4), LoggedStep(4, 1), LoggedStep(4, 0), LoggedStep(2, 2)]


def test_oracle_replay_matches_the_hand_computation():
    # γ = 1: each step drafts 1; emitted 2 + 2 + 1 + 2 = 7 in 4 × 1.3 s → 7 / 5.2 tokens/s × verify(1)
    assert replay_fixed(LOG, 1, COST).speedup(COST) == pytest.approx(7 / 5.2)
    # γ = 2: emitted 3 + 2 + 1 + 3 = 9 in 4 × 1.6 s
    assert replay_fixed(LOG, 2, COST).speedup(COST) == pytest.approx(9 / 6.4)
    # γ = 4: emitted 5 + 2 + 1 + 3 = 11 in 2.2 × 3 + 1.6 (the last step drafts only 2)
    assert replay_fixed(LOG, 4, COST).speedup(COST) == pytest.approx(11 / 8.2)
    # oracle: draft 4, 1, 0, 2 → emitted 5 + 2 + 1 + 3 = 11 in 2.2 + 1.3 + 1.0 + 1.6 = 6.1 s
    assert replay_oracle(LOG, COST).speedup(COST) == pytest.approx(11 / 6.1)
    assert replay_best(LOG, COST).speedup(COST) == pytest.approx(11 / 6.1)  # extending always pays here
    result = analyse(
        LOG,
        COST,
        [1, 2, 3, 4],
        {
            "policy": [LoggedStep(1, 1), LoggedStep(4, 1), LoggedStep(0, 0), LoggedStep(2, 2)],
            "oracle-like": [LoggedStep(4, 4), LoggedStep(1, 1), LoggedStep(0, 0), LoggedStep(2, 2)],
        },
    )
    assert result["fixed"][3] == pytest.approx(10 / 7.3)  # 4 + 2 + 1 + 3 in 1.9 × 3 + 1.6
    assert result["best_fixed_gamma"] == 2 and result["best_fixed_speedup"] == pytest.approx(9 / 6.4)
    assert result["oracle_over_best_fixed"] == pytest.approx((11 / 6.1) / (9 / 6.4))
    # the policy: emitted 2 + 2 + 1 + 3 = 8 in 1.3 + 2.2 + 1.0 + 1.6 = 6.1 s; worse than γ = 2
    policy = result["policies"]["policy"]
    assert policy["simulated_speedup"] == pytest.approx(8 / 6.1)
    assert policy["captured"] == pytest.approx((8 / 6.1 - 9 / 6.4) / (11 / 6.1 - 9 / 6.4))
    assert result["policies"]["oracle-like"]["captured"] == pytest.approx(1.0)


def test_tree_steps_are_charged_their_nodes_and_refused_by_chain_replays():
    # tree-masked forwards measured at k = 2, 4, 8 tokens: 1.5, 2.0, 3.0 s
    cost = CostModel((1.0, 1.2, 1.4, 1.6, 1.8), 0.1, (2, 4, 8), (1.5, 2.0, 3.0))
    assert cost.verify_tree(2) == 1.5 and cost.verify_tree(3) == pytest.approx(1.75)
    assert cost.verify_tree(6) == pytest.approx(2.5) and cost.verify_tree(10) == pytest.approx(3.5)  # beyond: slope
    assert cost.verify_tree(1) == 1.5  # below the first measured count: its cost
    assert CostModel((1.0, 1.2)).verify_tree(2) == 1.2  # no tree measurements: a chain's cost
    # a chain step costs a causal forward, a tree step (depth 2, 5 nodes) a tree-masked one over 6 tokens
    assert cost.step(2) == cost.step(2, 2) == pytest.approx(0.2 + 1.4)
    assert cost.step(2, 5) == pytest.approx(0.2 + 2.5)
    tree_log = [LoggedStep(2, 2, 5), LoggedStep(3, 1, 3)]  # the second step is a chain (nodes = depth)
    assert replay_logged(tree_log, cost).speedup(cost) == pytest.approx((3 + 2) / (2.7 + 0.3 + 1.6))
    for replay in (
        lambda log: replay_fixed(log, 2, cost),
        lambda log: replay_oracle(log, cost),
        lambda log: replay_best(log, cost),
    ):
        with pytest.raises(ValueError, match="chain log, but a step verified 5 tree nodes for depth 2"):
            replay(tree_log)
    result = analyse(LOG, COST, [1, 2], {"tree": [LoggedStep(4, 4, 12)] * 4, "chain": LOG})
    assert result["policies"]["tree"]["tree"] and result["policies"]["tree"]["captured"] is None
    assert not result["policies"]["chain"]["tree"] and result["policies"]["chain"]["captured"] is not None
    with pytest.raises(ValueError, match="ascending"):
        CostModel((1.0,), 0.0, (4, 2), (1.0, 2.0))
    # logs: nodes_per_step where recorded (older logs lack it: chains)
    assert steps_from_metrics({"drafted_per_step": [2, 0], "accepted_per_step": [1, 0]}) == [
        LoggedStep(2, 1),
        LoggedStep(0, 0),
    ]
    assert steps_from_metrics({"drafted_per_step": [2], "accepted_per_step": [1], "nodes_per_step": [6]}) == [
        LoggedStep(2, 1, 6)
    ]
    # the report's cost model: each measured curve made non-decreasing
    model = cost_model({"verify_s": [1.0, 0.8, 1.2], "tree_k": [2, 4, 8], "tree_verify_s": [1.5, 1.3, 3.0]})
    assert model.verify_s == pytest.approx((0.9, 0.9, 1.2)) and model.tree_verify_s == pytest.approx((1.4, 1.4, 3.0))


def test_cost_optimal_oracle_stops_early_when_verifying_more_is_dear():
    cost = CostModel((1.0, 1.0, 5.0), 0.0)
    log = [LoggedStep(2, 2)]
    assert replay_oracle(log, cost).speedup(cost) == pytest.approx(3 / 5.0)
    assert replay_best(log, cost).speedup(cost) == pytest.approx(2 / 1.0)  # draft 1 of the 2


def test_cost_model_and_helpers():
    assert COST.verify(7) == pytest.approx(1.8 + 2 * 0.2)  # extrapolated from the last two
    assert monotone([1.0, 3.0, 2.0, 4.0]) == pytest.approx((1.0, 2.5, 2.5, 4.0))
    assert captured_share(1.5, 1.5, 1.5) is None and captured_share(1.2, 1.5, 1.505) is None  # no room
    assert captured_share(1.6, 1.5, 1.7) == pytest.approx(0.5)
    assert replay_logged([], COST).speedup(COST) == 0.0
    with pytest.raises(ValueError):
        CostModel(())
