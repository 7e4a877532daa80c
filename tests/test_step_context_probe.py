"""scripts/step_context_probe.py's analysis: the cross-validated models see the step context when
it decides acceptance, and the replayed rules sit between the best fixed window and the oracle."""

import math
import random

import pytest
import torch

from helpers import load_script


def probe():
    return load_script("step_context_probe")


def steps(context_decides: bool, count: int = 600):
    """Synthetic steps of 8 draft tokens: the accepted run is long after an easy context (a confident
    target) when ``context_decides``, else it follows the draft's own log q."""
    rng = random.Random(0)
    rows = []
    for s in range(count):
        easy = rng.random() < 0.5
        log_q = [math.log(rng.uniform(0.05, 0.95)) for _ in range(8)]
        if context_decides:
            accepted = rng.randint(4, 8) if easy else 0
        else:
            accepted = next((i for i, lq in enumerate(log_q) if rng.random() > math.exp(lq)), 8)
        rows.append(
            {
                "prompt": f"set/{s % 24}",
                "n": 8,
                "accepted": accepted,
                "log_q": log_q,
                "entropy": [1.0] * 8,
                "log_top": [-0.1] * 8,
                "context": {
                    "target_top": 0.95 if easy else 0.3,
                    "target_entropy": 0.2 if easy else 3.0,
                    "accepted": 2,
                    "drafted": 8,
                    "bonus": False,
                },
            }
        )
    return rows


def position_one_auc(module, rows, predictions):
    from plugins.pacer_stop.metrics import roc_auc

    y = torch.tensor([float(r["accepted"] > 0) for r in rows])
    return roc_auc(torch.tensor([p[0] for p in predictions]), y)


def test_the_context_model_wins_exactly_when_the_context_decides():
    module = probe()
    decided = steps(True)
    assert position_one_auc(module, decided, module.cross_validated(decided, True)) > 0.9
    assert position_one_auc(module, decided, module.cross_validated(decided, False)) < 0.6
    undecided = steps(False)
    assert position_one_auc(module, undecided, module.cross_validated(undecided, False)) > 0.7


def test_the_replay_puts_a_predictor_between_the_best_fixed_window_and_the_oracle():
    module = probe()
    rows = steps(True)
    cost = lambda n: 50.0 + 4.0 * n  # noqa: E731
    oracle = module.throughput(rows, lambda s, r, rate: min(r["accepted"], 8), cost, 50.0)
    fixed = max(module.throughput(rows, lambda s, r, rate, g=g: g, cost, 50.0) for g in range(9))
    truth = [[1.0 if r["accepted"] > i else 0.0 for i in range(8)] for r in rows]

    def rule(s, r, rate):
        values = [1 + sum(truth[s][:n]) - rate * cost(n) for n in range(9)]
        return max(range(9), key=values.__getitem__)

    assert fixed < oracle
    assert abs(module.throughput(rows, rule, cost, 50.0) - oracle) < 1e-9  # knowing the labels is the oracle


def test_hindsight_calibration_matches_each_positions_accepted_rate_and_orders_by_confidence():
    module = probe()
    rows = steps(False)
    calibrated = module.hindsight_calibrated(rows, bins=10)
    for i in range(8):
        rate = sum(r["accepted"] > i for r in rows) / len(rows)
        assert sum(p[i] for p in calibrated) / len(rows) == pytest.approx(rate)
    # where acceptance follows the draft's own q, more confident bins accept more often at position 1
    order = sorted(range(len(rows)), key=lambda s: rows[s]["log_q"][0])
    assert calibrated[order[-1]][0] > calibrated[order[0]][0] + 0.3
