"""The ``pacer`` stop's throughput rule, its cost model cache and the noise-free replay (plugins/pacer_stop).

The pure rule with scripted predictions and cost models (drafting stops exactly where the next
token's forecast gain falls below its marginal cost, and the draft sent is what pays its
verification; flat and rising verification costs; blocks); λ learned from the outcomes; the
draft-confidence predictor; the cost files (keyed by machine and pair, refused for another pair or
when stale) and `pacer costs` on tiny models; the exact distribution with the rule in the stack
(its greedy equality: test_pacer_stop); the replay on synthetic steps and on a tiny run folder;
per-position AUC and calibration.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pacer_bench.replay.stop_rules import HeldOutStep, compare, drive, replay_entropy_stop, replay_policy
from pacer_core import Engine, InputError, load_config
from pacer_core.cost_profiles import CostModel
from pacer_plugins.pacer_stop import measured_costs, rules
from pacer_plugins.pacer_stop.metrics import position_report, roc_auc
from pacer_plugins.pacer_stop.policy import DraftConfidence, PacerStop, PacerStopConfig

from helpers import INLINE_COSTS as COSTS  # the throughput rule's cost model, inline
from helpers import adapter, one_line_error, run_cli, single_thread, tiny_llama, write_checkpoint

FLAT = CostModel([0.010] * 20, draft_token_s=0.002)  # verification as dear for 1 token as for 20
RISING = CostModel([0.010 + 0.002 * k for k in range(20)], draft_token_s=0.002)  # each row adds 2 ms


class Scripted:
    """A fake predictor: draft position i gets ``probs[i]``."""

    def __init__(self, probs):
        self.values = torch.tensor(probs, dtype=torch.float64)

    def reset(self):
        pass

    def __call__(self, hidden, start, confidence=None):
        return self.values[start : start + len(hidden)]


def throughput(probs, cost, **options) -> PacerStop:
    config = PacerStopConfig(rule="throughput", **{"max_draft": len(probs), "min_draft": 0, **options})
    policy = PacerStop(config, Scripted(probs), cost=cost)
    policy.start_generation(greedy=True)
    return policy


# -- the rule ------------------------------------------------------------------------------------
def test_marginal_costs_are_drafting_plus_the_added_verification_row():
    assert rules.marginal_costs(FLAT, 0, 3).tolist() == pytest.approx([0.002] * 3)
    assert rules.marginal_costs(RISING, 2, 5).tolist() == pytest.approx([0.004] * 3)
    assert rules.plain_rate(CostModel([0.01], step_s=0.01)) == pytest.approx(50.0)


@pytest.mark.parametrize("cost, drafted, sent", [(FLAT, 3, 3), (RISING, 3, 2)], ids=["flat", "rising"])
def test_drafting_stops_where_the_next_tokens_gain_falls_below_its_cost_and_sends_what_pays_verification(
    cost, drafted, sent
):
    # λ starts at plain decoding's rate, 1 / verify(1) = 100 tokens/s. Going on: the forecast
    # p̂_{e+1} = p_e² / p_{e−1} must pay drafting and its verification row, 100 · 0.002 (flat) or
    # 100 · 0.004 (rising): after token 3 the forecast is 0.15 · 0.18 = 0.026, below both. Sending:
    # the drafting is spent, a token is verified while p_i pays its row, 0 (flat) or 0.2 (rising).
    probs = [0.9, 0.85, 0.15, 0.1, 0.05, 0.01]
    assert rules.forecast(probs, 2, 2).tolist() == pytest.approx([0.85 * 0.85 / 0.9, 0.85 * (0.85 / 0.9) ** 2])
    assert rules.next_block_pays(probs, 2, 1, cost, 100.0) and not rules.next_block_pays(probs, 3, 1, cost, 100.0)
    assert rules.send_length(probs, 0, 3, cost, 100.0) == sent
    policy = throughput(probs, cost, b=1)
    assert drive(policy, 6) == (drafted, sent)  # rising: token 3 was drafted, and is not verified
    assert policy.totals["early_stops"] == 1


def test_ties_go_to_the_shorter_draft_and_margin_scales_lambda():
    # p_3 = λ · Δverify exactly: verifying it gains nothing, the shorter draft wins the tie
    assert rules.send_length([0.9, 0.5, 0.2, 0.1], 0, 4, RISING, 100.0) == 2
    # the forecast after [0.5, 0.4] is 0.32: it pays a token's 0.002 s at λ 100 (0.2), not at λ 200 (0.4)
    assert rules.next_block_pays([0.5, 0.4], 2, 1, FLAT, 100.0)
    assert not rules.next_block_pays([0.5, 0.4], 2, 1, FLAT, 200.0)
    assert drive(throughput([0.9, 0.5, 0.3, 0.1], FLAT, b=1), 4) == (3, 3)
    assert drive(throughput([0.9, 0.5, 0.3, 0.1], FLAT, b=1, margin=3.0), 4) == (2, 2)  # λ tripled: a 0.6 bar


def test_blocks_are_drafted_whole_and_the_send_skips_their_unpaid_tail():
    probs = [0.9, 0.8, 0.7, 0.1, 0.6, 0.5]
    assert drive(throughput(probs, FLAT, b=2), 6) == (4, 4)  # after block 3-4 the forecast is 0.014
    assert drive(throughput(probs, RISING, b=2), 6) == (4, 3)  # token 4 (0.1) does not pay its row
    assert drive(throughput([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], FLAT, b=2), 6) == (6, 6)  # every block paid
    # a lone dip is outweighed by what follows it: the best prefix is the whole draft
    assert rules.send_length([0.9, 0.15, 0.9], 0, 3, RISING, 100.0) == 3
    assert drive(throughput(probs, RISING, b=2, min_draft=4), 6) == (4, 4)  # never below min_draft
    assert drive(throughput([0.1] * 6, RISING, b=2, min_draft=3), 6) == (4, 3)  # judged only from token 3 on


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=12),
    st.sampled_from([FLAT, RISING]),
    st.integers(1, 4),
    st.floats(0.5, 2.0),
)
def test_with_falling_predictions_the_rule_drafts_while_the_forecast_pays_and_sends_what_pays_its_row(
    raw, cost, b, margin
):
    probs = sorted((x / 1000 for x in raw), reverse=True)
    rate = rules.plain_rate(cost) * margin
    drafted, sent = drive(throughput(probs, cost, b=b, margin=margin), len(probs))
    # drafting stops at the first block end whose next block's forecast does not pay (or at the end)
    ends = [e for e in range(b, len(probs), b)]
    expected = next((e for e in ends if not rules.next_block_pays(probs, e, b, cost, rate)), len(probs))
    assert drafted == expected
    # every drafted token whose gain beats the verification row it adds is sent, and no other
    rows = [cost.verify(i + 1) - cost.verify(i) for i in range(1, drafted + 1)]
    assume(all(abs(p - rate * row) > 1e-9 for p, row in zip(probs, rows)))  # no exact tie in floating point
    assert sent == sum(p > rate * row for p, row in zip(probs, rows))


def test_lambda_learns_the_running_throughput_from_the_cost_model():
    rate = rules.RunningRate(FLAT, decay=0.5)
    assert rate.value == pytest.approx(100.0)
    rate.update(emitted=4, drafted=3, sent=3)  # 4 tokens in 0.016 s
    assert rate.tokens == pytest.approx(2.5) and rate.seconds == pytest.approx(0.013)
    policy = throughput([0.9, 0.9, 0.9], FLAT, b=1, rate_decay=1.0)
    drive(policy, 3)
    policy.observe_outcome(sent=3, accepted=3, emitted=4)
    assert policy.rate.value == pytest.approx(4 / FLAT.step(3))
    policy.start_generation(greedy=True)
    assert policy.rate.value == pytest.approx(4 / FLAT.step(3))  # kept across prompts under greedy
    policy.start_generation(greedy=False)
    assert policy.rate.value == pytest.approx(100.0)  # forgotten under sampling


def test_recalibrated_predictions_scale_by_the_generations_accepted_over_predicted_tokens():
    # κ = (accepted + prior) / (predicted + prior): 2 of 10 predicted, prior 2 -> 1/3; capped at 1
    assert rules.recalibrated([0.9, 0.6], 2, 10.0, 2.0) == pytest.approx([0.3, 0.2])
    assert rules.recalibrated([0.9, 0.6], 9, 1.0, 2.0) == pytest.approx([1.0, 1.0])
    assert rules.recalibrated([0.5], 0, 0.0, 4.0) == [0.5]  # no outcome yet: M_B as it is
    with pytest.raises(ValueError, match="prior must be positive"):
        rules.recalibrated([0.5], 0, 0.0, 0.0)


def test_an_over_predicting_m_b_is_read_down_after_its_tokens_are_rejected():
    probs = [0.6, 0.5, 0.42, 0.35, 0.3, 0.25]
    plain, corrected = throughput(probs, FLAT, b=1, recalibrate=None), throughput(probs, FLAT, b=1, recalibrate=2.0)
    assert drive(plain, 6) == drive(corrected, 6) == (6, 6)  # the first step: nothing learnt yet
    for policy in (plain, corrected):
        policy.observe_outcome(sent=6, accepted=0, emitted=1)  # 2.42 tokens predicted, none accepted
    # read down by κ = 2 / 4.42: p_1 0.27, whose forecast p_1² no longer pays a token's drafting at λ
    assert drive(plain, 6) == (6, 6) and drive(corrected, 6) == (1, 1)
    corrected.start_generation(greedy=True)
    assert drive(corrected, 6) == (6, 6)  # a new generation starts from M_B as it is


def test_the_paper_rule_is_unchanged_by_the_option():
    policy = PacerStop(PacerStopConfig(b=2, t0=0.5, max_draft=6), Scripted([0.9, 0.9, 0.2, 0.2, 0.9, 0.9]))
    assert drive(policy, 6) == (4, 4)
    with pytest.raises(ValueError, match="cost model"):
        PacerStop(PacerStopConfig(rule="throughput"), Scripted([0.5]))
    with pytest.raises(ValueError, match="recalibrate"):
        PacerStopConfig(rule="throughput", recalibrate=0.0)


def test_draft_confidence_is_the_cumulative_product_across_blocks():
    q = torch.tensor([0.9, 0.5, 0.8, 0.25])
    features = torch.stack([q.log(), torch.zeros(4)], dim=-1)
    predictor = DraftConfidence()
    first, second = predictor(None, 0, features[:2]), predictor(None, 2, features[2:])
    assert torch.cat([first, second]).tolist() == pytest.approx(q.double().cumprod(0).tolist())
    assert predictor(None, 1, features[1:2]).tolist() == pytest.approx([0.45])  # re-judging forgets later tokens
    predictor.reset()
    assert predictor(None, 0, features[:1]).tolist() == pytest.approx([0.9])


# -- losslessness ----------------------------------------------------------------------------------
# Greedy equality of the throughput rule (over M_B and over the draft's confidence): test_pacer_stop's
# losslessness tests, beside the paper rule's stacks.


@pytest.mark.parametrize("recalibrate", [", recalibrate: null", ", recalibrate: 1"], ids=["as-given", "recalibrated"])
def test_speculative_sampling_with_the_throughput_rule_matches_the_target_distribution(recalibrate):
    from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs

    from helpers import DRAFT_TABLE, LENGTH, PASS_P, PROMPT, SAMPLINGS, TARGET_TABLE, build_engine
    from helpers import SCRIPTED_VOCAB as VOCAB
    from helpers import sample_outputs as run

    with single_thread():
        target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
        draft = ScriptedLM(VOCAB, seed=1, table=DRAFT_TABLE.clone())
        options = f"b: 1, max_draft: 3, predictor: draft_confidence, {COSTS}{recalibrate}"
        stop = f"{{name: pacer, rule: throughput, {options}}}"
        engine = build_engine(target, draft, "draft_model", stop, SAMPLINGS["t1"])
        outputs, steps = run(engine, PROMPT, 5_000)
        p_value = chisquare_pvalue(outputs, exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling))
    assert p_value > PASS_P
    assert 1.2 < steps < LENGTH - 0.2  # drafts were cut at varying lengths and also rejected


# -- the cost model cache --------------------------------------------------------------------------
PAIR = measured_costs.pair("tttt", "dddd", "torch.float32", "cpu")
MEASURED = {"verify_s": [0.010, 0.012, 0.011], "draft_token_s": 0.003, "step_s": 0.001}


def test_a_cost_file_round_trips_for_its_machine_and_pair(tmp_path):
    key = measured_costs.full_key(PAIR)
    path = measured_costs.write_costs(measured_costs.cache_file(key, tmp_path), key, MEASURED)
    cost = measured_costs.read_costs(path, key)
    assert cost.verify_s == pytest.approx((0.010, 0.0115, 0.0115))  # made non-decreasing
    assert (cost.draft_token_s, cost.step_s) == (0.003, 0.001)
    assert (
        key["dtype"] == "float32"
        and json.loads(path.read_text())["key"]["version"] == measured_costs.COST_MODEL_VERSION
    )
    # one file per pair, whatever the machine; another pair has another file
    assert measured_costs.cache_file({**key, "torch": "0.0"}, tmp_path) == path
    assert measured_costs.cache_file({**key, "draft_identity": "eeee"}, tmp_path) != path


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"draft_identity": "eeee"},
            "measured for target tttt with draft dddd (float32, cpu), but this run pairs target tttt with draft eeee",
        ),
        ({"dtype": "bfloat16"}, "but this run pairs"),
        ({"torch": "0.0"}, "is stale: measured with torch"),
        ({"processor": "another CPU"}, "is stale: measured with processor"),
    ],
)
def test_a_cost_file_for_another_pair_or_machine_is_refused_in_one_line(tmp_path, change, words):
    key = measured_costs.full_key(PAIR)
    path = measured_costs.write_costs(tmp_path / "costs.json", key, MEASURED)
    with pytest.raises(InputError) as info:
        measured_costs.read_costs(path, {**key, **change})
    assert "\n" not in str(info.value) and words in str(info.value) and "pacer costs" in str(info.value)


def test_an_old_version_missing_or_damaged_cost_file_is_refused(tmp_path):
    key = measured_costs.full_key(PAIR)
    path = measured_costs.write_costs(tmp_path / "costs.json", key, MEASURED)
    data = json.loads(path.read_text())
    data["key"]["version"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="cost-model version 0, this code reads version 1"):
        measured_costs.read_costs(path, key)
    with pytest.raises(InputError, match="no cost model at .* measure one with `pacer costs`"):
        measured_costs.read_costs(tmp_path / "nothing.json", key)
    path.write_text("{")
    with pytest.raises(InputError, match="is not valid JSON"):
        measured_costs.read_costs(path, key)
    path.write_text(json.dumps({"verify_s": [0.01]}))
    with pytest.raises(InputError, match="not a cost file"):
        measured_costs.read_costs(path, key)


def pacer_engine(tmp_path, extra: str, digest="tttt"):
    target, draft = adapter(tiny_llama(0)), adapter(tiny_llama(1))
    target.digest, draft.digest = digest, "dddd"
    folder = write_checkpoint(tmp_path / "mb", 32)
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            f"strategy.stop=[{{name: pacer, rule: throughput, checkpoint: '{folder}'{extra}}}]",
        ],
        require_models=False,
    )
    return Engine.build(target, draft=draft, cfg=cfg)


def test_the_stop_reads_the_cached_or_given_cost_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(InputError, match=r"no cost model at .*cache/costs/.* for target tttt with draft dddd"):
        pacer_engine(tmp_path, "")
    key = measured_costs.full_key(measured_costs.pair("tttt", "dddd", torch.float32, "cpu"))
    measured_costs.write_costs(measured_costs.cache_file(key), key, MEASURED)
    engine = pacer_engine(tmp_path, "")
    stop = next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.stop"))
    assert stop.cost.draft_token_s == 0.003
    with pytest.raises(InputError, match="no cost model"):  # the cache holds nothing for another target
        pacer_engine(tmp_path, "", digest="uuuu")
    given = measured_costs.write_costs(tmp_path / "given.json", key, {**MEASURED, "draft_token_s": 0.005})
    engine = pacer_engine(tmp_path, f", cost_file: '{given}'")
    assert next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.stop")).cost.draft_token_s == 0.005
    with pytest.raises(InputError, match="measured for target tttt .* but this run pairs target uuuu"):
        pacer_engine(tmp_path, f", cost_file: '{given}'", digest="uuuu")


def test_pacer_costs_measures_and_caches_a_tiny_pair(tmp_path, capsys, monkeypatch):
    from pacer_core import cli

    target, draft = adapter(tiny_llama(0)), adapter(tiny_llama(1))
    target.digest, draft.digest = "tttt", "dddd"
    built = []

    def build(plan):
        built.append(plan.config)
        return Engine.build(target, draft=draft, plan=plan)

    monkeypatch.setattr(cli, "build_engine", build)
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    with single_thread():
        code, out, err = run_cli(
            ["costs", "--max-k", "4", "--repeats", "1", "--tokens", "8", "strategy.drafter={name: draft_model}"], capsys
        )
    assert code == 0, err
    assert [s["name"] for s in built[0].strategy.stop] == ["fixed"] and built[0].sampling.temperature == 0
    key = measured_costs.full_key(measured_costs.engine_pair(Engine.build(target, draft=draft, cfg=built[0])))
    cost = measured_costs.read_costs(measured_costs.cache_file(key), key)
    assert len(cost.verify_s) == 4 and min(cost.verify_s) > 0 and cost.draft_token_s > 0
    assert "tttt" in out and str(measured_costs.cache_file(key)) in out
    assert "--tokens: must be from 1 to 4096, not 0" in one_line_error(capsys, ["costs", "--tokens", "0"])


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--profile-max-k", "0"], "--profile-max-k: must be from 1 to 512, not 0"),
        (["--profile-max-k", "100000"], "--profile-max-k: must be from 1 to 512"),
        (["--context", "-5"], "--context: must be from 1 to 1048576, not -5"),
        (["--context", str(10**12)], "--context: must be from 1 to 1048576"),
        (["--context", "many"], "--context: must be a whole number from 1 to 1048576, not 'many'"),
        (["--max-k", "0"], "--max-k: must be from 1 to 512"),
        (["--repeats", "-1"], "--repeats: must be from 1 to 100"),
        (["--gamma", "1000"], "--gamma: must be from 1 to 64"),
    ],
)
def test_pacer_costs_numeric_options_have_ranges(capsys, monkeypatch, argv, needle):
    from pacer_core import cli

    monkeypatch.setattr(cli, "build_engine", lambda plan: pytest.fail("built before checking the options"))
    assert needle in one_line_error(capsys, ["costs", *argv])


def test_pacer_costs_refuses_forwards_beyond_the_targets_context_before_measuring(tmp_path, capsys, monkeypatch):
    from pacer_core import cli

    target, draft = adapter(tiny_llama(0)), adapter(tiny_llama(1))
    monkeypatch.setattr(cli, "build_engine", lambda plan: Engine.build(target, draft=draft, plan=plan))
    monkeypatch.setattr(measured_costs, "measure_costs", lambda *a: pytest.fail("measured before checking --context"))
    error = one_line_error(
        capsys,
        [
            "costs",
            "--profile",
            str(tmp_path / "p.yaml"),
            "--context",
            str(target.max_length),
            "--profile-max-k",
            "8",
            "strategy.drafter={name: draft_model}",
        ],
    )
    assert f"--context plus --profile-max-k come to {target.max_length + 8} tokens" in error
    assert f"the target's context of {target.max_length}" in error


def tiny_costs_cli(tmp_path, monkeypatch) -> None:
    """`pacer costs` run in-process on two tiny models (the target's digest "tttt"), its cache under tmp_path."""
    from pacer_core import cli

    target, draft = adapter(tiny_llama(0)), adapter(tiny_llama(1))
    target.digest = "tttt"
    monkeypatch.setattr(cli, "build_engine", lambda plan: Engine.build(target, draft=draft, plan=plan))
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))


def tiny_costs_argv(tmp_path) -> list[str]:
    """A quick `pacer costs` of the tiny pair's `draft_model` stack: short curves, the cost file in tmp_path."""
    return [
        "costs",
        *("--max-k", "2", "--repeats", "1", "--profile-max-k", "4", "--context", "16"),
        *("--out", str(tmp_path / "costs.json"), "strategy.drafter={name: draft_model}"),
    ]


def test_pacer_costs_says_when_it_replaces_the_machine_wide_profile(tmp_path, capsys, monkeypatch):
    """`pacer costs --profile` copies the profile to the cache every later `nodes: auto` tree on the
    device reads: it says so (wrote / replaced), and --no-cache leaves the cache alone."""
    from pacer_core.cost_profiles import measured_profile_path

    tiny_costs_cli(tmp_path, monkeypatch)
    argv = [*tiny_costs_argv(tmp_path), "--tokens", "4"]
    cached = measured_profile_path("cpu", "tttt")
    with single_thread():
        code, out, err = run_cli([*argv, "--profile", str(tmp_path / "a.yaml")], capsys)
        assert code == 0, err
        assert f"wrote the machine-wide profile {cached}" in out and "every later `nodes: auto` tree" in out
        code, out, err = run_cli([*argv, "--profile", str(tmp_path / "b.yaml")], capsys)
        assert code == 0 and f"replaced the machine-wide profile {cached}" in out, err
        before = cached.read_bytes()
        code, out, err = run_cli([*argv, "--profile", str(tmp_path / "c.yaml"), "--no-cache"], capsys)
        assert code == 0 and "left as it was (--no-cache)" in out, err
    assert cached.read_bytes() == before and (tmp_path / "c.yaml").is_file()


def test_pacer_costs_refuses_an_out_file_it_cannot_write_before_measuring(tmp_path, capsys, monkeypatch):
    from pacer_core import cli

    from helpers import bad_out_folders

    monkeypatch.setattr(cli, "build_engine", lambda plan: pytest.fail("measured before checking --out"))
    a_folder = tmp_path / "a-folder"
    a_folder.mkdir()
    for out in [a_folder, *(place / "costs.json" for place in bad_out_folders(tmp_path) if place.name != "a-file")]:
        assert "--out '" in one_line_error(capsys, ["costs", "--out", str(out)]), out


# -- the replay ------------------------------------------------------------------------------------
def synthetic_steps(count=300, window=8, seed=0):
    """Steps whose accepted count is drawn from falling acceptance; M_B knows the truth (p = 1 on the
    accepted prefix, 0 after), the draft's confidence is noisy."""
    g = torch.Generator().manual_seed(seed)
    steps = []
    for i in range(count):
        accepted = int((torch.rand(window, generator=g) < 0.75).long().cumprod(0).sum())
        truth = (torch.arange(window) < accepted).double()
        noisy = (0.6 + 0.3 * torch.rand(window, generator=g, dtype=torch.float64)).cumprod(0)
        steps.append(HeldOutStep(mb=truth, confidence=noisy, accepted=accepted, item=i // 20))
    return steps


def test_replaying_a_policy_charges_what_it_drafted_and_sent():
    steps = [
        HeldOutStep(
            mb=torch.tensor([0.9, 0.9, 0.1, 0.1], dtype=torch.float64),
            confidence=torch.ones(4, dtype=torch.float64),
            accepted=3,
            item=0,
        )
    ]
    config = PacerStopConfig(rule="throughput", b=1, max_draft=4, min_draft=0)
    replay = replay_policy(steps, config, RISING)
    assert (replay.emitted, replay.steps) == (3, 1)  # 3 drafted, 2 sent, both accepted, + 1
    assert replay.seconds == pytest.approx(RISING.step(3, sent=2))


def test_the_entropy_replay_stops_after_the_first_low_bound_and_calibrates_between_steps():
    # γ 1: bounds 1 − sqrt(H) = 0.9, 0.9, then negative; the draft is sure but the target rejects
    sure = torch.tensor([0.01, 0.01, 2.0, 2.0], dtype=torch.float64)
    steps = [
        HeldOutStep(
            mb=torch.zeros(4, dtype=torch.float64),
            confidence=torch.ones(4, dtype=torch.float64),
            accepted=0,
            item=0,
            entropy=sure,
        )
        for _ in range(2)
    ]
    fixed = replay_entropy_stop(steps, gamma=1.0, threshold=0.5, adapt=False, cost=RISING)
    assert (fixed.emitted, fixed.steps) == (2, 2)  # each step sends 3 tokens (the low bound's one included)
    assert fixed.seconds == pytest.approx(2 * RISING.step(3))
    # calibrated: the first step's rejection at bound 0.9 moves δ to 0.05 · (0 − 0.9), so λ rises to
    # 0.545; a rate of 1 makes δ = −0.9 and λ = 1 after one step, and the second step sends 1 token
    adapted = replay_entropy_stop(steps, gamma=1.0, threshold=0.5, adapt=True, cost=RISING, adapt_rate=1.0)
    assert adapted.seconds == pytest.approx(RISING.step(3) + RISING.step(1))
    assert replay_entropy_stop(steps, gamma=1.0, threshold=0.5, adapt=True, cost=RISING).seconds == pytest.approx(
        fixed.seconds
    )
    with pytest.raises(InputError, match="no draft entropies"):
        replay_entropy_stop([HeldOutStep(mb=sure, confidence=sure, accepted=0, item=0)], 1.0, 0.5, False, RISING)


def test_a_perfect_predictor_reaches_the_cost_optimal_oracle_and_beats_fixed_windows():
    steps = synthetic_steps()
    result = compare(
        steps, RISING, gammas=range(1, 9), blocks=[1], margins=[1.0], t0s=[0.5], confidences=[0.5], max_draft=8
    )
    mb = next(r for r in result["rows"] if r["family"] == "throughput / mb")
    # with p exact the first rejected token is the only waste: near the oracle, far above fixed γ
    assert mb["speedup"] > result["best_fixed_speedup"] and mb["captured"] > 0.5
    assert result["oracle_speedup"] >= mb["speedup"]
    # the same replay twice gives the same numbers (no clock)
    again = compare(
        steps, RISING, gammas=range(1, 9), blocks=[1], margins=[1.0], t0s=[0.5], confidences=[0.5], max_draft=8
    )
    assert again["rows"] == result["rows"]


def test_replay_stop_reads_a_run_folder(tmp_path, capsys):
    from pacer_train import atomic_save

    g = torch.Generator().manual_seed(0)
    (tmp_path / "run" / "samples").mkdir(parents=True)
    for item in range(1, 4):
        lengths = torch.tensor([6, 6, 4])
        n = int(lengths.sum())
        labels = torch.cat([torch.arange(int(k)) < torch.randint(0, int(k) + 1, (1,), generator=g) for k in lengths])
        atomic_save(
            tmp_path / "run" / "samples" / f"item_{item:05d}.pt",
            {
                "hidden": torch.randn(n, 32, generator=g).half(),
                "labels": labels,
                "confidence": torch.stack([torch.rand(n, generator=g).clamp_min(0.05).log(), torch.rand(n)], -1).half(),
                "lengths": lengths,
                "item": item,
            },
        )
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"verify_s": [0.01, 0.011, 0.012]}))
    checkpoint = write_checkpoint(tmp_path / "mb", 32)
    code, out, err = run_cli(
        [
            "replay-stop",
            str(tmp_path / "run"),
            "--costs",
            str(cost),
            "--checkpoint",
            str(checkpoint),
            "--heldout-every",
            "0",
            "--max-draft",
            "6",
            "--draft-token-s",
            "0.002",
            "--gammas",
            "1,2,6",
            "--b",
            "1,2",
            "--margins",
            "1",
            "--recalibrate",
            "4,null",
            "--t0",
            "0.5",
            "--confidence",
            "0.5",
            "--json",
            str(tmp_path / "out.json"),
        ],
        capsys,
    )
    assert code == 0, err
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["steps"] == 9 and set(saved["fixed"]) == {"1", "2", "6"}
    assert {r["family"] for r in saved["rows"]} == {
        "confidence stop",
        "throughput / mb",
        "throughput / draft_confidence",
        "paper / mb",
        "entropy stop",
        "entropy stop, no calibration (svip)",
    }
    assert len(saved["by_position"]["mb"]) == 6
    assert "| throughput / mb | b 1, margin 1.0, recalibrate 4.0 |" in out
    assert "| throughput / mb | b 1, margin 1.0, recalibrate null |" in out
    message = one_line_error(
        capsys,
        [
            "replay-stop",
            str(tmp_path / "run"),
            "--costs",
            str(cost),
            "--checkpoint",
            str(checkpoint),
            "--max-draft",
            "6",
        ],
    )
    assert "no held-out item" in message  # items 1..3: none divisible by the default 10
    assert "exceeds the simulated window" in one_line_error(
        capsys,
        [
            "replay-stop",
            str(tmp_path / "run"),
            "--costs",
            str(cost),
            "--checkpoint",
            str(checkpoint),
            "--heldout-every",
            "0",
            "--max-draft",
            "7",
        ],
    )
    bad = [*["replay-stop", str(tmp_path / "run"), "--costs", str(cost), "--heldout-every", "0"], "--recalibrate", "0"]
    assert "--recalibrate takes finite numbers > 0" in one_line_error(capsys, bad)


# -- per-position AUC and calibration --------------------------------------------------------------
def test_position_report_is_each_positions_own_metrics():
    g = torch.Generator().manual_seed(1)
    probs, labels = torch.rand(200, generator=g), (torch.rand(200, generator=g) < 0.5).double()
    positions = torch.arange(200) % 4
    rows = position_report(probs, labels, positions)
    assert [r["position"] for r in rows] == [0, 1, 2, 3] and sum(r["tokens"] for r in rows) == 200
    at = positions == 2
    assert rows[2]["auc"] == pytest.approx(roc_auc(probs[at], labels[at]))
    assert rows[2]["mean_prediction"] == pytest.approx(float(probs[at].mean()))
    perfect = position_report(labels, labels, positions)
    assert all(r["auc"] == 1.0 and r["ece"] == 0.0 for r in perfect)


def test_step_timer_times_a_draft_forward_apart_from_a_draft_token():
    """A block drafter drafts four tokens in one forward: its seconds per token are a quarter of its
    seconds per forward, the figure a cost profile's ``draft_s`` prices (a step without a forward, a
    plain one, adds to neither)."""
    from types import SimpleNamespace

    timer = measured_costs.StepTimer(iter([1.0, 1.1, 1.2]).__next__)
    for forwards, drafted in ((1, 4), (0, 0), (2, 2)):
        timer.pacer_observe_step(
            None, SimpleNamespace(draft_s=0.012, stop_s=0.002, verify_s=0.05, drafted=drafted, draft_forwards=forwards)
        )
    assert timer.per_token == pytest.approx([0.0025, 0.005])
    assert timer.per_forward == pytest.approx([0.010, 0.005])


def test_a_measured_profile_prices_the_drafters_forward_not_its_token(tmp_path, capsys, monkeypatch):
    """`pacer costs --profile` writes the seconds per draft forward as the drafter's ``draft_s`` (a block
    drafter's forward drafts several tokens: priced per token, a tree over a block looked four times
    cheaper to `nodes: auto` and the draft gate than it was)."""
    from pacer_core.cost_profiles import load_profile

    tiny_costs_cli(tmp_path, monkeypatch)
    measured = {"verify_s": [0.010, 0.012], "draft_token_s": 0.001, "draft_forward_s": 0.004, "step_s": 0.002}
    monkeypatch.setattr(measured_costs, "measure_costs", lambda *a: dict(measured))
    argv = [*tiny_costs_argv(tmp_path), "--no-cache", "--profile", str(tmp_path / "p.yaml")]
    with single_thread():
        code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "1.00 ms/token (4.00 ms/forward)" in out
    profile = load_profile(str(tmp_path / "p.yaml"))
    assert profile.draft_forward("token") == pytest.approx(0.004)


def test_a_cost_file_gives_its_tokens_per_forward():
    """A cost file's two draft figures give its cost model the tokens one forward yields: the gate
    then prices a block drafter's forward whole, the throughput rule its tokens a quarter each."""
    from pacer_core.cost_profiles import cost_model

    block = cost_model({"verify_s": [0.010, 0.012], "draft_token_s": 0.001, "draft_forward_s": 0.004})
    assert block.tokens_per_forward == pytest.approx(4) and block.draft_forward_s == pytest.approx(0.004)
    assert block.draft(4) == pytest.approx(0.004)
    for older in ({"draft_token_s": 0.001}, {"draft_forward_s": 0.004}, {}):  # a file without both: one a forward
        assert cost_model({"verify_s": [0.010], **older}).tokens_per_forward == 1
    with pytest.raises(ValueError, match="tokens_per_forward"):
        CostModel([0.01], tokens_per_forward=0.5)


def test_a_replays_draft_price_override_keeps_the_cost_files_tokens_per_forward(tmp_path):
    """`pacer replay-stop --draft-token-s` re-prices a draft token; the tokens one forward yields stay
    what the file measured (its own two figures), not the override's ratio to its forward."""
    from pacer_bench.replay.stop_rules import read_cost_file

    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"verify_s": [0.010, 0.012], "draft_token_s": 0.001, "draft_forward_s": 0.004}))
    cost = read_cost_file(path, draft_token_s=0.002, step_s=None)
    assert cost.draft_token_s == pytest.approx(0.002) and cost.tokens_per_forward == pytest.approx(4)
    assert cost.draft_forward_s == pytest.approx(0.008)
