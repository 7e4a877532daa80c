"""``pacer demo``'s speedups under a burst of load: interleaved rounds, paired ratios, medians.

The engines are fakes that advance an injected clock by a set time per token, so the true speedups
are known; one plain-decoding run is slowed tenfold (a burst of load on the machine, as when a
plain run of HumanEval/0 measured 2.7 tok/s and the demo printed 13.64x and 3.84x overall).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pacer_bench.demo import PLAIN, SPREAD, measure, median_interval, report_lines, round_order, summarize

from helpers import assert_one_line_error, run_cli

TOKENS = 64
PROMPTS = ["code_editing/0", "gsm8k/0", "mtbench/81", "HumanEval/0"]
SECONDS_PER_TOKEN = {PLAIN: 0.030, "fast": 0.020, "slow": 0.025}  # true speedups 1.5x and 1.2x


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    """Generates TOKENS tokens per prompt, advancing the clock; ``burst`` maps (prompt, call) to a
    slow-down factor."""

    def __init__(self, name: str, clock: Clock, burst: dict, log: list):
        self.name, self.clock, self.burst, self.log = name, clock, burst, log
        self.calls: dict[str, int] = {}

    def generate(self, prompt: str):
        call = self.calls.get(prompt, 0)
        self.calls[prompt] = call + 1
        self.log.append((prompt, self.name))
        factor = self.burst.get((prompt, call), 1.0)
        self.clock.now += TOKENS * SECONDS_PER_TOKEN[self.name] * factor
        return SimpleNamespace(tokens=list(range(TOKENS)), metrics={"mean_accepted_length": 1.8})


def demo(repeats: int, burst: dict):
    clock, log = Clock(), []
    engines = {name: FakeEngine(name, clock, burst if name == PLAIN else {}, log) for name in SECONDS_PER_TOKEN}
    runs = measure(engines, PROMPTS, repeats, clock=clock)
    return runs, summarize(runs, ["fast", "slow"]), log


def test_a_burst_of_load_in_one_plain_run_leaves_the_speedups_sane():
    burst = {("HumanEval/0", 0): 10.0}  # its first plain run: 3.3 tok/s instead of 33
    runs, summary, _ = demo(3, burst)
    assert runs[3][0][PLAIN].rate == pytest.approx(TOKENS / (TOKENS * 0.3))  # the burst is in the data
    for name, true in (("fast", 1.5), ("slow", 1.2)):
        s = summary[name]
        assert s["speedup"] == pytest.approx(true)
        assert [p["median"] for p in s["prompts"]] == pytest.approx([true] * 4)  # HumanEval/0's too
        assert s["interval"][0] <= true <= s["interval"][1]
        assert s["identical"] == 4
    lines = report_lines(summary, PROMPTS, 3)
    assert lines[0].startswith("fast: speedup 1.50x [1.50, 1.50] over plain decoding")
    (warning,) = [line for line in lines if line.startswith("warning")]
    assert "HumanEval/0" in warning and ("15.00x" in warning or "12.00x" in warning)  # the disturbed round's ratio


def test_a_steady_machine_gives_no_warning_and_one_round_says_it_is_fragile():
    _, summary, _ = demo(3, {})
    assert all(s["spread"] == pytest.approx(1.0) for s in summary.values())
    assert not [line for line in report_lines(summary, PROMPTS, 3) if line.startswith(("warning", "note"))]
    _, summary, _ = demo(1, {("HumanEval/0", 0): 10.0})
    assert summary["fast"]["prompts"][3]["median"] == pytest.approx(15.0)  # one round cannot hide a burst ...
    assert summary["fast"]["speedup"] == pytest.approx(1.5)  # ... the median over prompts does
    assert any(line.startswith("note: 1 round(s) per prompt") for line in report_lines(summary, PROMPTS, 1))


def test_spread_just_above_the_threshold_warns():
    burst = {("gsm8k/0", 1): SPREAD + 0.05}  # plain slower in one round: that round's ratio up by the factor
    _, summary, _ = demo(3, burst)
    assert summary["fast"]["spread"] == pytest.approx(SPREAD + 0.05)
    assert any(line.startswith("warning") and "gsm8k/0" in line for line in report_lines(summary, PROMPTS, 3))


def test_runs_are_interleaved_round_by_round_in_rotating_order():
    _, _, log = demo(3, {})
    first_prompt = [name for prompt, name in log if prompt == PROMPTS[0]]
    assert first_prompt == [PLAIN, "fast", "slow", "fast", "slow", PLAIN, "slow", PLAIN, "fast"]
    assert [prompt for prompt, _ in log] == [p for p in PROMPTS for _ in range(9)]  # a prompt's rounds together
    assert round_order(["a", "b"], 3) == ["b", "a"]


def test_the_median_interval():
    assert median_interval([1.5]) is None
    low, high = median_interval([1.0, 1.2, 1.4, 1.6, 1.8])
    assert 1.0 <= low <= 1.4 <= high <= 1.8
    assert median_interval([1.3] * 4) == (1.3, 1.3)


def test_the_demo_plans_each_engine_once(monkeypatch, resolutions):
    """Plain decoding and each stack: one run plan each, its engine built on it around the one target."""
    from pacer_bench import demo

    from helpers import CharTokenizer, adapter, tiny_llama

    monkeypatch.setattr(
        demo,
        "DEMO_STACKS",
        {
            "lookup": ["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 4}]"],
            "token": ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 2}]"],
        },
    )
    draft, loaded = adapter(tiny_llama(1)), []
    monkeypatch.setattr(
        demo,
        "load_stack_draft",
        lambda plan, tokenizer, drafts: loaded.append(plan) or (draft if plan.stack.needs("draft_model") else None),
    )
    engines = demo.demo_engines(adapter(tiny_llama(0)), CharTokenizer(), 8, "float32")
    assert list(engines) == [PLAIN, "lookup", "token"] and engines["token"].draft is draft
    assert resolutions == {"plugin_managers": 3, "resolutions": 3}
    assert [engines[name].pm for name in ("lookup", "token")] == [plan.pm for plan in loaded]


def test_bad_demo_arguments_are_one_line_before_a_model_loads(capsys):
    code, _, err = run_cli(["demo", "--repeats", "0"], capsys)
    assert_one_line_error(code, err, "--repeats must be positive")
