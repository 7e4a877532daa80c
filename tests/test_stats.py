"""The bench's 95% intervals (pacer_bench/stats.py) and ``pacer report --compare`` (pacer_bench/compare.py).

The bootstrap is checked against what it must be: its draws (clusters together, repeats within their
prompt), its determinism under a seed, and its coverage on synthetic data whose true ratio is known.
The comparison is checked on records where the answer is known (one stack clearly faster, or the
same stack measured twice with noise).
"""

from __future__ import annotations

import numpy as np
import pytest

from pacer_bench.compare import compare
from pacer_bench.stats import (
    bootstrap_weights,
    cell_intervals,
    format_interval,
    interval,
    percentile_interval,
    prompt_speedups,
    rate_columns,
    ratio,
    ratio_of_rates,
    tau_columns,
)


def test_clusters_are_drawn_whole_and_repeats_within_their_prompt():
    clusters = ["a", "a", "a", "b", "b", "b", "c", "c", "c", "d"]  # three prompts of three repeats, one of one
    weights = bootstrap_weights(clusters, np.random.default_rng(1), resamples=500)
    assert weights.shape == (500, 10) and (weights >= 0).all() and (weights == np.round(weights)).all()
    per_prompt = np.stack([weights[:, :3].sum(1), weights[:, 3:6].sum(1), weights[:, 6:9].sum(1), weights[:, 9]], 1)
    sizes = np.array([3, 3, 3, 1])
    draws = per_prompt / sizes  # how often each prompt was drawn: a whole number, four in all
    assert (draws == np.round(draws)).all() and (draws.sum(1) == 4).all()
    assert (weights[:, :3].std(1) > 0).any()  # the repeats of a drawn prompt are drawn too
    assert abs(draws.mean() - 1.0) < 0.05


def test_one_repeat_is_a_plain_paired_bootstrap_over_prompts():
    weights = bootstrap_weights(["p", "q", "r", "s"], np.random.default_rng(0), resamples=300)
    assert (weights.sum(1) == 4).all()


def test_the_same_seed_gives_the_same_interval_and_another_seed_a_close_one():
    rng = np.random.default_rng(5)
    columns = np.column_stack([rng.uniform(50, 150, 30), rng.uniform(2, 6, 30)])
    clusters = list(range(30))
    first = interval(ratio, columns, clusters, np.random.default_rng(7))
    assert first == interval(ratio, columns, clusters, np.random.default_rng(7))
    other = interval(ratio, columns, clusters, np.random.default_rng(8))
    assert other != first and abs(other[0] - first[0]) < 0.05 * first[0]
    point = columns[:, 0].sum() / columns[:, 1].sum()
    assert first[0] < point < first[1]


def test_identical_units_give_a_degenerate_interval_and_no_unit_none():
    columns = np.tile([10.0, 4.0], (6, 1))
    assert interval(ratio, columns, list(range(6)), np.random.default_rng(0)) == pytest.approx((2.5, 2.5))
    assert interval(ratio, np.zeros((0, 2)), [], np.random.default_rng(0)) is None
    # one prompt (however many repeats) says nothing of the spread between prompts
    assert interval(ratio, np.array([[10.0, 4.0], [12.0, 4.0]]), ["q", "q"], np.random.default_rng(0)) is None
    with pytest.raises(ValueError):
        interval(ratio, np.zeros((3, 2)), [0, 1], np.random.default_rng(0))


def test_undefined_resamples_are_dropped_and_mostly_undefined_gives_none():
    assert percentile_interval(np.array([1.0, 2.0, np.nan, 3.0])) is not None
    assert percentile_interval(np.array([np.inf, np.nan, np.nan, 1.0])) is None


def _speedup_data(rng, prompts, repeats, true_speedup, prompt_sd=0.5, run_sd=0.15):
    """Per (prompt, repeat): tokens and seconds of a stack and of the baseline. Each prompt has its
    own length and speed; run noise is lognormal with mean 1, and the stack's expected time is the
    baseline's ÷ true_speedup, so the population ratio of totals is true_speedup."""
    rows, clusters = [], []
    for p in range(prompts):
        tokens = rng.integers(40, 200)
        base_rate = 20.0 * rng.lognormal(-(prompt_sd**2) / 2, prompt_sd)
        for _ in range(repeats):
            base_s = tokens / base_rate * rng.lognormal(-(run_sd**2) / 2, run_sd)
            stack_s = tokens / base_rate / true_speedup * rng.lognormal(-(run_sd**2) / 2, run_sd)
            rows.append((tokens, stack_s, tokens, base_s))
            clusters.append(p)
    return np.array(rows, dtype=float), clusters


@pytest.mark.parametrize("repeats", [1, 3])
def test_the_speedup_interval_covers_the_true_ratio_about_95_percent_of_the_time(repeats):
    rng = np.random.default_rng(2024)
    trials, hits = 300, 0
    for _ in range(trials):
        columns, clusters = _speedup_data(rng, 40, repeats, 1.3)
        low, high = interval(ratio_of_rates, columns, clusters, rng, resamples=400)
        hits += low <= 1.3 <= high
    assert 0.90 <= hits / trials <= 0.99, hits / trials


def test_the_tau_interval_covers_the_true_tau_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    trials, hits = 300, 0
    for _ in range(trials):  # per prompt: steps, and emitted tokens = steps × a prompt's own τ (mean 2.2)
        steps = rng.integers(20, 80, 40).astype(float)
        tau = rng.uniform(1.4, 3.0, 40)
        columns = np.column_stack([rng.poisson(steps * tau), steps])
        low, high = interval(ratio, columns, list(range(40)), rng, resamples=400)
        # the true ratio of totals: E[steps × τ] / E[steps] = 2.2 (steps and τ independent)
        hits += low <= 2.2 <= high
    assert 0.90 <= hits / trials <= 0.99, hits / trials


def test_more_repeat_noise_widens_the_interval():
    widths = []
    for run_sd in (0.01, 0.4):
        rng = np.random.default_rng(3)
        columns, clusters = _speedup_data(rng, 30, 3, 1.3, prompt_sd=0.0, run_sd=run_sd)
        low, high = interval(ratio_of_rates, columns, clusters, np.random.default_rng(0))
        widths.append(high - low)
    assert widths[1] > 5 * widths[0]


# -- records ------------------------------------------------------------------------------------------
def rec(model, question, tokens, seconds, repeat=0, turn=0, steps=None, accepts=None, prompt_set="p"):
    accepts = accepts if accepts is not None else [1] * tokens
    return {
        "prompt_set": prompt_set,
        "question_id": question,
        "model_id": model,
        "repeat": repeat,
        "turn": turn,
        "tokens": [0] * tokens,
        "metrics": {"wall_s": seconds, "steps": steps or len(accepts), "accept_lengths": accepts},
    }


def test_records_make_paired_units_per_prompt_and_repeat_over_their_turns():
    base = [rec("b", "q1", 10, 1.0), rec("b", "q1", 10, 2.0, turn=1), rec("b", "q2", 8, 1.0)]
    mine = [
        rec("a", "q1", 10, 0.5),
        rec("a", "q1", 10, 1.0, turn=1),
        rec("a", "q2", 8, 0.5),
        rec("a", "q3", 9, 0.5),
    ]  # q3 has no partner: left out of the pairing
    reference = {(r["prompt_set"], r["question_id"], r["repeat"], r["turn"]): r for r in base}
    columns, clusters = rate_columns(mine, reference)
    assert columns.tolist() == [[20, 1.5, 20, 3.0], [8, 0.5, 8, 1.0]] and clusters == [("p", "q1"), ("p", "q2")]
    columns, clusters = tau_columns(
        [rec("a", "q1", 6, 1.0, accepts=[2, 4]), rec("a", "q1", 3, 1.0, turn=1, accepts=[1, 2])]
    )
    assert columns.tolist() == [[9, 4]] and clusters == [("p", "q1")]
    cis = cell_intervals(base, reference)
    assert cis == {"speedup_ci": [1.0, 1.0], "tau_ci": [1.0, 1.0]}  # the baseline against itself


def test_per_prompt_speedups_are_ratios_of_totals_over_each_prompts_repeats():
    base = [rec("b", "q1", 10, 1.0), rec("b", "q1", 10, 3.0, repeat=1), rec("b", "m/2", 8, 1.0, prompt_set="m")]
    mine = [rec("a", "q1", 10, 0.5), rec("a", "q1", 10, 3.5, repeat=1), rec("a", "m/2", 8, 2.0, prompt_set="m")]
    mine.append(rec("a", "q3", 9, 0.5))  # no partner: not a prompt of the pairing
    reference = {(r["prompt_set"], r["question_id"], r["repeat"], r["turn"]): r for r in base}
    # q1: 20 tokens in 4.0 s against 20 in 4.0 s (not the mean of its repeats' ratios, 1.0 and 0.86)
    assert prompt_speedups(mine, reference) == {"p/q1": pytest.approx(1.0), "m/2": pytest.approx(0.5)}
    assert prompt_speedups(base, reference) == {"p/q1": 1.0, "m/2": 1.0}  # the baseline against itself


def _noisy_run(speed_a, speed_b, prompts=30, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for q in range(prompts):
        tokens = int(rng.integers(30, 120))
        base = tokens / 20.0 * rng.lognormal(0, 0.4)  # prompts differ a lot in speed
        for model, speed in (("ar", 1.0), ("A", speed_a), ("B", speed_b)):
            records.append(rec(model, f"q{q}", tokens, base / speed * rng.lognormal(0, 0.08)))
    return records


def test_compare_says_which_stack_is_faster_only_beyond_the_noise():
    found = compare(_noisy_run(1.4, 1.2), "A", "B", ["p"])
    assert list(found) == ["p", "all"]
    c = found["all"]
    assert c["verdict"] == "A faster" and c["ci"][0] > 1.0 and c["prompts"] == 30 and c["pairs"] == 30
    assert c["ratio"] == pytest.approx(1.4 / 1.2, rel=0.06)
    assert compare(_noisy_run(1.2, 1.4), "A", "B", ["p"])["all"]["verdict"] == "B faster"
    same = compare(_noisy_run(1.3, 1.3, seed=4), "A", "B", ["p"])["all"]
    assert same["verdict"] == "no difference beyond the noise" and same["ci"][0] < 1.0 < same["ci"][1]


def test_intervals_are_written_after_their_value():
    assert format_interval(1.234, [1.1, 1.4], ".2f", "×") == "1.23× [1.10, 1.40]"
    assert format_interval(2.0, None) == "2.00" and format_interval(None, [1, 2]) == "—"
