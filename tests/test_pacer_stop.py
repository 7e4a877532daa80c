"""PACER's ``pacer`` stop policy and ``pacer train-preverify`` (plugins/pacer_stop).

The stop rule with a scripted M_B (stops exactly when a block's mean falls below t, t grows by rho
and is capped, min/max lengths, trimming, blocks counted in tokens); M_B itself (a packed forward
with the block-diagonal mask equals separate forwards; incremental decoding equals a full forward);
checkpoints (round trip, another pair refused in one line, a missing default explained); the
metrics against brute force; losslessness with ``pacer`` in the stack (greedy equality with the
target's own decoding, the exact-distribution test of tests/test_distribution.py); and the trainer
(simulated labels are what the verifier decided, a tiny training run lowers the loss and resumes).
M_B checkpoints are randomly initialised and written to tmp_path.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer_core import ConfigError, Draft, DraftBlock, Engine, InputError, StepRecord, Stop, Verdict, load_config
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs
from pacer_plugins.pacer_stop import train as trainer
from pacer_plugins.pacer_stop.metrics import accuracy, expected_calibration_error, prediction_report, roc_auc
from pacer_plugins.pacer_stop.model import IncrementalPredictor, PreVerifier, pack, packing_mask
from pacer_plugins.pacer_stop.policy import PacerStop, PacerStopConfig
from pacer_train import load_run_file  # what train-preverify writes reads back with weights_only=True

from helpers import (
    DRAFT_TABLE,
    LENGTH,
    PASS_P,
    PROMPT,
    SAMPLINGS,
    TARGET_TABLE,
    adapter,
    build_engine,
    make_draft,
    reference_greedy,
    single_thread,
    small_arch,
    tiny_llama,
    write_checkpoint,
)
from helpers import INLINE_COSTS as COSTS  # the throughput rule's cost model, inline
from helpers import SCRIPTED_VOCAB as VOCAB
from helpers import sample_outputs as run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


# -- helpers -------------------------------------------------------------------------------------
class ScriptedPredictor:
    """A fake M_B: the probability of draft position i is ``probs[i]``. Records its calls."""

    def __init__(self, probs):
        self.probs = list(probs)
        self.calls: list[tuple[int, torch.Tensor]] = []  # (start, hidden rows given)
        self.resets = 0

    def reset(self):
        self.resets += 1

    def __call__(self, hidden, start, confidence=None):
        self.calls.append((start, hidden.clone()))
        return torch.tensor(self.probs[start : start + len(hidden)], dtype=torch.float64)


def drafted(policy: PacerStop, available: int, chunk=None, hidden_size: int = 3) -> int:
    """The engine's drafting loop with this policy alone: the drafter offers what is asked (or
    ``chunk`` tokens per call), up to ``available`` tokens; returns the length sent to the target.
    Hidden state row i is filled with i, so the rows M_B is given can be checked."""
    draft = Draft()
    while True:
        answer = policy.pacer_draft_more(state=None, draft=draft)
        if isinstance(answer, Stop):
            return len(draft) if answer.keep is None else min(answer.keep, len(draft))
        n = len(draft)
        k = min(chunk or answer, available - n)
        if k <= 0:
            return n  # the drafter ran out
        rows = torch.arange(n, n + k, dtype=torch.float32)[:, None].expand(k, hidden_size)
        draft = draft.extend(DraftBlock(tokens=torch.zeros(k, dtype=torch.long), hidden_states=rows.clone()))


def scripted(probs, **options) -> PacerStop:
    return PacerStop(PacerStopConfig(**options), ScriptedPredictor(probs))


def reference_length(probs, b, t0, rho, t_max, min_draft, max_draft, send_failed_block) -> int:
    """The rule as docs/pacer.md states it, block by block (the drafter offers what is asked)."""
    t, n = t0, 0
    while n < max_draft:
        end = min(n + b, max_draft)
        if end == max_draft and send_failed_block:
            return max_draft  # the last block is sent whatever M_B says
        mean = float(torch.tensor(probs[n:end], dtype=torch.float64).mean())  # rounded as the policy does
        if mean < t and end >= min_draft:
            return end if send_failed_block else max(n, min_draft)
        if mean >= t:
            t = min(t * rho, t_max)
        n = end
    return max_draft


# -- the stop rule with a scripted M_B -------------------------------------------------------------
def test_stops_exactly_when_the_block_mean_falls_below_t():
    probs = [0.9, 0.8, 0.6, 0.5, 0.4, 0.5, 0.9, 0.9]  # block means 0.85, 0.55, 0.45, 0.9
    assert drafted(scripted(probs, b=2, t0=0.5, rho=1.0, max_draft=8), 8) == 6
    assert drafted(scripted(probs, b=2, t0=0.46, rho=1.0, max_draft=8), 8) == 6
    assert drafted(scripted(probs, b=2, t0=0.44, rho=1.0, max_draft=8), 8) == 8  # 0.45 passes
    assert drafted(scripted(probs, b=2, t0=0.56, rho=1.0, max_draft=8), 8) == 4  # 0.55 fails
    # a mean equal to t passes (stop only below)
    assert drafted(scripted([0.5] * 6, b=2, t0=0.5, rho=1.0, max_draft=6), 6) == 6


def test_the_threshold_grows_by_rho_and_is_capped():
    policy = scripted([0.95] * 10, b=1, t0=0.5, rho=1.5, t_max=0.9, max_draft=6)
    assert drafted(policy, 10) == 6  # 0.95 beats the capped threshold forever
    assert [round(t, 6) for *_, t in policy.blocks_judged] == [0.5, 0.75, 0.9, 0.9, 0.9]
    policy = scripted([0.8] * 10, b=1, t0=0.5, rho=1.5, t_max=1.0, max_draft=6)
    assert drafted(policy, 10) == 3  # thresholds 0.5, 0.75, 1.0: the third token fails
    assert [round(t, 6) for *_, t in policy.blocks_judged] == [0.5, 0.75, 1.0]
    # rho = 1: no growth (the ablation)
    policy = scripted([0.8] * 10, b=1, t0=0.5, rho=1.0, t_max=1.0, max_draft=6)
    assert drafted(policy, 10) == 6 and {t for *_, t in policy.blocks_judged} == {0.5}


def test_min_and_max_draft_hold():
    for send in (True, False):
        assert drafted(scripted([0.1] * 9, b=1, min_draft=3, send_failed_block=send), 9) == 3
        assert drafted(scripted([0.1] * 9, b=2, min_draft=3, send_failed_block=send), 9) == (4 if send else 3)
    policy = scripted([0.99] * 9, b=2, max_draft=5)
    assert drafted(policy, 9) == 5
    assert [start for start, _ in policy.predictor.calls] == [0, 2]  # the last, partial block is not judged
    assert drafted(scripted([0.1] * 9, b=2, min_draft=0, send_failed_block=False), 9) == 0


def test_a_failed_block_is_trimmed_when_not_sent():
    probs = [0.9, 0.9, 0.9, 0.2, 0.3, 0.9, 0.9, 0.2]
    options = dict(t0=0.6, rho=1.0, max_draft=8)
    assert drafted(scripted(probs, b=3, send_failed_block=True, **options), 8) == 6  # [0.2, 0.3, 0.9] fails
    assert drafted(scripted(probs, b=3, send_failed_block=False, **options), 8) == 3
    assert drafted(scripted(probs, b=2, send_failed_block=False, **options), 8) == 2  # [0.9, 0.2] fails
    # at max_draft a trimming policy judges the last (partial) block too
    policy = scripted([0.9, 0.9, 0.9, 0.9, 0.1], b=2, send_failed_block=False, max_draft=5)
    assert drafted(policy, 8) == 4 and [s for s, _ in policy.predictor.calls] == [0, 2, 4]
    policy = scripted([0.9, 0.9, 0.9, 0.9, 0.1], b=2, send_failed_block=True, max_draft=5)
    assert drafted(policy, 8) == 5 and [s for s, _ in policy.predictor.calls] == [0, 2]


def test_blocks_count_tokens_when_the_drafter_returns_more():
    policy = scripted([0.9, 0.9, 0.9, 0.6, 0.2, 0.2, 0.9], b=2, t0=0.5, rho=1.0, max_draft=7)
    assert drafted(policy, 7, chunk=3) == 6  # checks after 3 and 6 tokens: means 0.9, 0.33
    assert [(start, len(rows)) for start, rows in policy.predictor.calls] == [(0, 3), (3, 3)]
    policy = scripted([0.9] * 9, b=2, max_draft=4)
    assert drafted(policy, 9, chunk=3) == 4  # cut at max_draft


def test_m_b_reads_the_rows_drafted_since_the_last_check():
    policy = scripted([0.9] * 8, b=2, max_draft=8)
    drafted(policy, 8, chunk=1)
    for start, rows in policy.predictor.calls:
        assert torch.equal(rows[:, 0], torch.arange(start, start + 2, dtype=torch.float32))


def test_each_step_starts_at_t0_with_a_fresh_m_b_context():
    """A step ends when its outcome is observed (as the engine's pacer_observe_step tells it): the next
    draft is judged from t₀ with a fresh M_B context."""
    policy = scripted([0.95] * 8, b=1, t0=0.5, rho=1.5, t_max=0.9, max_draft=4)
    sent = drafted(policy, 8)
    assert policy.threshold > 0.5 and policy.checked == 3  # grown within the step (the last token: sent unjudged)
    resets = policy.predictor.resets
    policy.observe_outcome(sent, 2, 3)
    assert policy.predictor.resets == resets + 1 and policy.threshold == 0.5 and policy.checked == 0
    drafted(policy, 8)
    assert policy.blocks_judged[0][3] == 0.5 and policy.blocks_judged[0][0] == 0


@settings(max_examples=150, deadline=None)
@given(
    probs=st.lists(st.sampled_from([0.05, 0.3, 0.5, 0.6, 0.75, 0.9, 1.0]), min_size=12, max_size=12),
    b=st.integers(1, 4),
    t0=st.sampled_from([0.0, 0.3, 0.5, 0.7]),
    rho=st.sampled_from([1.0, 1.1, 1.5]),
    t_max=st.sampled_from([0.7, 0.95, 1.0]),
    min_draft=st.integers(0, 4),
    max_draft=st.integers(4, 12),
    send=st.booleans(),
)
def test_the_rule_matches_its_statement(probs, b, t0, rho, t_max, min_draft, max_draft, send):
    options = dict(
        b=b, t0=t0, rho=rho, t_max=max(t_max, t0), min_draft=min_draft, max_draft=max_draft, send_failed_block=send
    )
    assert drafted(scripted(probs, **options), 12) == reference_length(probs, **options)


def test_the_policy_reports_its_work_and_calibration():
    policy = scripted([0.9, 0.9, 0.2, 0.2, 0.9, 0.9], b=2, t0=0.5, max_draft=6)
    policy.pacer_start(state=None)
    length = drafted(policy, 6)
    draft = Draft().extend(DraftBlock(tokens=torch.zeros(length, dtype=torch.long)))
    record = StepRecord(
        index=0,
        draft=draft,
        verdict=Verdict(1, 0, "recovered"),
        emitted=(0, 0),
        committed_before=5,
        draft_s=0.0,
        verify_s=0.0,
        draft_forwards=length,
    )
    policy.pacer_observe_step(state=None, step=record)
    metrics = policy.pacer_finish(state=None, result=None)
    assert metrics["pacer_checks"] == 2 and metrics["pacer_early_stops"] == 1
    assert metrics["pacer_judged_tokens"] == 4 and metrics["pacer_judged_accept_rate"] == 0.25
    assert metrics["pacer_mean_prediction"] == pytest.approx(0.55) and metrics["pacer_mb_s"] >= 0.0


# -- M_B ---------------------------------------------------------------------------------------------
PRIOR = {"draft_confidence": True, "confidence_prior": True}


def with_a_correction(net: PreVerifier) -> PreVerifier:
    """A confidence_prior M_B's head starts at zero: give it a correction to check."""
    if net.arch.confidence_prior:
        with torch.no_grad():
            net.head.weight.normal_(std=0.5)
            net.head.bias.fill_(0.3)
            net.prior_scale.fill_(0.8)
    return net


@pytest.mark.parametrize(
    "options",
    [{}, {"positional": False}, {"layers": 2, "ffn_size": 0}, {"draft_confidence": True}, PRIOR],
    ids=["default", "no-pos", "2-layers", "conf", "prior"],
)
def test_a_packed_forward_equals_separate_forwards(options):
    torch.manual_seed(3)
    net = with_a_correction(PreVerifier(small_arch(8, **options))).eval()
    lengths = [3, 5, 1, 4, 2]
    steps = [torch.randn(n, 8) for n in lengths]
    confs = [torch.randn(n, 2) for n in lengths]
    separate = [net(h, torch.arange(len(h)), confidence=c) for h, c in zip(steps, confs)]
    # two packed sequences of 9 rows: [3, 5, 1] and [4, 2] + 3 padding rows
    sequences = [[0, 1, 2], [3, 4]]
    hidden, conf = torch.zeros(2, 9, 8), torch.zeros(2, 9, 2)
    positions = torch.zeros(2, 9, dtype=torch.long)
    segments = torch.full((2, 9), -1)
    for row, seq in enumerate(sequences):
        at = 0
        for segment, s in enumerate(seq):
            n = lengths[s]
            hidden[row, at : at + n], conf[row, at : at + n] = steps[s], confs[s]
            positions[row, at : at + n], segments[row, at : at + n] = torch.arange(n), segment
            at += n
    hidden[1, 6:] = 100.0  # padding must not leak into real rows
    conf[1, 6:] = -50.0
    packed = net(hidden, positions, packing_mask(segments), conf)
    for row, seq in enumerate(sequences):
        at = 0
        for s in seq:
            assert torch.allclose(packed[row, at : at + lengths[s]], separate[s], atol=1e-5)
            at += lengths[s]
    if options.get("layers", 1):  # a plain causal mask over the packed rows lets steps see each other
        wrong = net(hidden, positions, torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 9, 9), conf)
        assert not torch.allclose(wrong[0, 3:8], separate[1], atol=1e-3)


def test_the_packing_mask_is_block_diagonal_and_causal():
    mask = packing_mask(torch.tensor([[0, 0, 1, 1, 1, -1]]))[0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]


def test_pack_fills_sequences_in_order():
    assert pack([3, 5, 1, 4, 2, 9], [0, 1, 2, 3, 4, 5], 9) == [[0, 1, 2], [3, 4], [5]]
    assert pack([3, 5, 1], [2, 1, 0], 6) == [[2, 1], [0]]


@pytest.mark.parametrize(
    "options",
    [{}, {"positional": False}, {"layers": 2}, {"draft_confidence": True}, {"max_positions": 4}, PRIOR],
    ids=["default", "no-pos", "2-layers", "conf", "few-pos", "prior"],
)
@pytest.mark.parametrize("blocks", [[1] * 7, [2, 2, 3], [3, 4], [7]], ids=str)
def test_incremental_decoding_equals_a_full_forward(options, blocks):
    torch.manual_seed(4)
    net = with_a_correction(PreVerifier(small_arch(8, **options))).eval()
    hidden = torch.randn(7, 8)
    conf = torch.stack([-torch.rand(7) * 3, torch.rand(7) * 4], dim=-1)  # log q(x) <= 0, H(q) >= 0
    with torch.no_grad():
        full = torch.sigmoid(net(hidden, torch.arange(7), confidence=conf))
    predictor = IncrementalPredictor(net)
    for _ in range(2):  # a second draft after reset gives the same
        predictor.reset()
        start, parts = 0, []
        for k in blocks:
            parts.append(predictor(hidden[start : start + k], start, conf[start : start + k]))
            start += k
        assert torch.allclose(torch.cat(parts), full, atol=1e-5)
    # re-judging from token 2 with other tokens 2.. forgets the old ones, their confidence included
    other = conf.clone()
    other[2:, 0] -= 1.0
    with torch.no_grad():
        expected = torch.sigmoid(net(hidden, torch.arange(7), confidence=other))[2:]
    assert torch.allclose(predictor(hidden[2:], 2, other[2:]), expected, atol=1e-5)


def test_an_untrained_confidence_prior_predicts_the_drafts_cumulative_confidence():
    from pacer_plugins.pacer_stop.rules import cumulative_confidence

    torch.manual_seed(6)
    net = PreVerifier(small_arch(8, **PRIOR)).eval()
    log_q = -torch.rand(6) * 2
    conf = torch.stack([log_q, torch.rand(6)], dim=-1)
    with torch.no_grad():
        p = torch.sigmoid(net(torch.randn(6, 8), torch.arange(6), confidence=conf))
    assert torch.allclose(p.double(), cumulative_confidence(log_q), atol=1e-5)
    assert torch.allclose(
        IncrementalPredictor(net)(torch.randn(6, 8), 0, conf).double(), cumulative_confidence(log_q), atol=1e-5
    )
    with pytest.raises(ValueError, match="confidence_prior starts from the draft's confidence: set draft_confidence"):
        small_arch(8, confidence_prior=True)


def test_a_checkpoint_of_another_layout_is_refused_in_one_line(tmp_path):
    folder = write_checkpoint(tmp_path / "mb", 8, draft_confidence=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "draft_confidence": False}))
    with pytest.raises(InputError, match=r"does not match the layout .*: train the checkpoint again") as info:
        PreVerifier.load(folder)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "config,needle",
    [
        ({"layers": 1_000_000}, "layers is 1000000, but"),
        ({"width": 2**30, "heads": 1}, "width is 1073741824, but tensor 'proj.weight' has shape (16, 8)"),
        ({"ffn_size": 10**12}, "ffn_size is 1000000000000, but tensor 'blocks.0.up.weight'"),
        ({"max_positions": 10**12}, "max_positions is 1000000000000, but tensor 'position.weight'"),
        ({"input_size": 10**9}, "input_size is 1000000000, but tensor 'proj.weight'"),
    ],
)
def test_a_checkpoint_config_size_its_weights_do_not_hold_is_refused_before_anything_is_built(
    tmp_path, monkeypatch, config, needle
):
    """An M_B checkpoint's config.json is compared with its weights' header before the network is
    built from it (building one here fails the test)."""
    from pacer_plugins.pacer_stop import model

    def never_built(self, arch):
        raise AssertionError("an M_B was built from a config its weights were not checked against")

    folder = write_checkpoint(tmp_path / "mb", 8)
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **config}))
    monkeypatch.setattr(model.PreVerifier, "__init__", never_built)
    with pytest.raises(InputError) as info:
        PreVerifier.load(folder)
    assert needle in str(info.value) and "config.json" in str(info.value) and "\n" not in str(info.value)


def test_checkpoints_round_trip(tmp_path):
    folder = write_checkpoint(tmp_path / "mb", 8, seed=5, target_digest="t1", draft_identity="d1", layers=2)
    loaded = PreVerifier.load(folder)
    torch.manual_seed(5)
    original = PreVerifier(small_arch(8, layers=2)).eval()
    hidden = torch.randn(6, 8)
    with torch.no_grad():
        assert torch.equal(loaded(hidden, torch.arange(6)), original(hidden, torch.arange(6)))
    assert loaded.arch == original.arch
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest == {"target_digest": "t1", "draft_identity": "d1"}


# -- metrics -------------------------------------------------------------------------------------
def brute_force_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 1.0]), st.booleans()), min_size=2, max_size=30
    )
)
def test_auc_matches_brute_force(pairs):
    scores, labels = zip(*pairs)
    auc = roc_auc(torch.tensor(scores), torch.tensor(labels))
    if all(labels) or not any(labels):
        assert auc != auc  # NaN
    else:
        assert auc == pytest.approx(brute_force_auc(scores, labels))


def test_accuracy_and_ece_by_hand():
    probs = torch.tensor([0.05, 0.05, 0.95, 0.95, 0.55, 0.55])
    labels = torch.tensor([0, 0, 1, 1, 1, 0])
    assert accuracy(probs, labels) == pytest.approx(5 / 6)
    # bins (15 equal): {0.05: 2 tokens, rate 0}, {0.95: 2, rate 1}, {0.55: 2, rate 0.5}
    expected = (2 * 0.05 + 2 * 0.05 + 2 * 0.05) / 6
    assert expected_calibration_error(probs, labels) == pytest.approx(expected)
    report = prediction_report(probs, labels)
    assert report["auc"] == pytest.approx(brute_force_auc(probs.tolist(), labels.tolist()))
    assert report["tokens"] == 6 and report["accepted_rate"] == pytest.approx(0.5)


# -- config and checkpoint errors ------------------------------------------------------------------
def error_of(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides, require_models=False)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(
    "entry, words",
    [
        ("{name: pacer, b: 0}", "'b' must be >= 1"),
        ("{name: pacer, t0: 1.5}", "'t0' must be in [0, 1]"),
        ("{name: pacer, rho: 0.9}", "'rho' must be >= 1.0"),
        ("{name: pacer, t0: 0.8, t_max: 0.7}", "t_max (0.7) must not be below t0 (0.8)"),
        ("{name: pacer, min_draft: 5, max_draft: 4}", "min_draft (5) must not exceed max_draft (4)"),
        ("{name: pacer, block: 4}", "unknown option 'block'"),
    ],
)
def test_bad_options_fail_in_load_config(entry, words):
    assert words in error_of(["strategy.drafter={name: draft_model}", f"strategy.stop=[{entry}]"])


def test_a_drafter_without_hidden_states_is_refused():
    message = error_of(["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: pacer}]"])
    assert "'pacer' reads the draft's hidden states" in message and "prompt_lookup" in message


def test_the_shipped_config_validates_without_its_checkpoint():
    cfg = load_config(CONFIGS / "pacer.yaml")  # the checkpoint is checked when the engine is built
    assert cfg.strategy.drafter["name"] == "eagle" and [s["name"] for s in cfg.strategy.stop] == ["pacer"]
    assert (CONFIGS / "pacer.yaml").read_text().startswith("#")


def pair_engine(folder, target_digest="aaaa", draft_digest="dddd", extra=""):
    target, draft = adapter(tiny_llama(0)), adapter(tiny_llama(1))
    target.digest, draft.digest = target_digest, draft_digest
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            f"strategy.stop=[{{name: pacer, checkpoint: '{folder}'{extra}}}]",
        ],
        require_models=False,
    )
    return Engine.build(target, draft=draft, cfg=cfg)


def test_a_checkpoint_for_another_pair_fails_in_one_line(tmp_path):
    folder = write_checkpoint(tmp_path / "mb", 32, target_digest="aaaa", draft_identity="eeee")
    with pytest.raises(InputError) as info:
        pair_engine(folder)
    message = str(info.value)
    assert "\n" not in message and "aaaa" in message and "eeee" in message and "dddd" in message
    assert "train-preverify" in message and "allow_other_pair=true" in message
    with pytest.raises(InputError, match="target bbbb"):
        pair_engine(folder, target_digest="bbbb", draft_digest="eeee")
    pair_engine(folder, draft_digest="eeee")  # the right pair
    pair_engine(folder, extra=", allow_other_pair: true")  # the expert override
    pair_engine(folder, target_digest=None, draft_digest=None)  # in-memory models: nothing to compare


def test_the_eagle_drafters_identity_reaches_the_stop(tmp_path):
    from pacer_plugins.eagle.drafter import draft_identity

    target_model = tiny_llama(0)
    eagle = make_draft(target_model, tmp_path / "eagle", digest="aaaa")
    identity = draft_identity(eagle)
    assert identity.startswith("eagle:aaaa:")

    def build(trained_for):
        folder = write_checkpoint(
            tmp_path / trained_for.replace(":", "_"), 32, target_digest="aaaa", draft_identity=trained_for
        )
        target = adapter(target_model)
        target.digest = "aaaa"
        cfg = load_config(
            overrides=[
                f"strategy.drafter={{name: eagle, path: '{eagle}'}}",
                f"strategy.stop=[{{name: pacer, checkpoint: '{folder}'}}]",
            ],
            require_models=False,
        )
        return Engine.build(target, cfg=cfg)

    build(identity).generate([1, 7, 9, 7], max_new_tokens=8)
    with pytest.raises(InputError, match=f"this run pairs target aaaa with draft {identity}"):
        build("eagle:aaaa:0123456789abcdef")


def test_missing_or_mismatched_checkpoints_are_explained(tmp_path, monkeypatch):
    import pacer_plugins.pacer_stop.policy

    pair_engine_default = load_config(
        overrides=["strategy.drafter={name: draft_model}", "strategy.stop=[{name: pacer}]"], require_models=False
    )
    # the shipped checkpoint is trained for the embedded pair: a tiny pair's hidden size differs
    with pytest.raises(InputError, match="size 576, but this draft's have size 32.*train-preverify"):
        Engine.build(adapter(tiny_llama(0)), draft=adapter(tiny_llama(1)), cfg=pair_engine_default)
    monkeypatch.setattr(pacer_plugins.pacer_stop.policy, "DEFAULT_CHECKPOINT", tmp_path / "not-shipped")
    with pytest.raises(InputError, match="shipped PACER checkpoint .* does not exist yet.*train-preverify"):
        Engine.build(adapter(tiny_llama(0)), draft=adapter(tiny_llama(1)), cfg=pair_engine_default)
    with pytest.raises(InputError, match="not a PACER checkpoint folder"):
        pair_engine(tmp_path / "nowhere")
    with pytest.raises(InputError, match="size 8, but this draft's have size 32"):
        pair_engine(write_checkpoint(tmp_path / "small", 8))


def test_the_shipped_checkpoint_for_the_run_pair_is_chosen(tmp_path, monkeypatch):
    import pacer_plugins.pacer_stop.policy as policy

    first = write_checkpoint(tmp_path / "a", 32, draft_identity="draft-a")
    second = write_checkpoint(tmp_path / "b", 32, seed=1, draft_identity="draft-b")
    monkeypatch.setattr(policy, "SHIPPED_CHECKPOINTS", (first, second))
    assert policy.shipped_for_pair("draft-b") == str(second)
    assert policy.shipped_for_pair("draft-a") == str(first)
    assert policy.shipped_for_pair("draft-c") is None and policy.shipped_for_pair(None) is None
    draft = adapter(tiny_llama(1))
    draft.digest = "draft-b"
    cfg = load_config(
        overrides=["strategy.drafter={name: draft_model}", "strategy.stop=[{name: pacer}]"], require_models=False
    )
    engine = Engine.build(adapter(tiny_llama(0)), draft=draft, cfg=cfg)
    stop = next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.stop"))
    assert torch.equal(stop.predictor.w["head.weight"], PreVerifier.load(second).head.weight.float())
    assert policy.checkpoint_folder("shipped:default") == policy.DEFAULT_CHECKPOINT
    with pytest.raises(InputError, match="not a PACER checkpoint folder"):
        policy.checkpoint_folder("shipped:nothing-here")


# -- losslessness ----------------------------------------------------------------------------------
BUDGET = 40
PROMPTS = [[5, 9, 13, 5, 9, 21, 7], [1, 2, 3, 4, 5, 6, 7, 8], [30, 31, 30, 31, 30]]
GREEDY_SCALE = 6.0  # the tiny target of greedy_models


@pytest.mark.parametrize(
    "stack",
    [
        "{name: pacer, b: 1, t0: 0.55, rho: 1.05, t_max: 0.7}",
        "{name: pacer, b: 2, t0: 0.55, rho: 1.1, t_max: 0.7, send_failed_block: false}",
        "{name: pacer, b: 1, t0: 0.55, rho: 1.05, t_max: 0.7, min_draft: 0, send_failed_block: false}",
        "{name: pacer, b: 2, t0: 0.5}, {name: fixed, gamma: 3}",
        f"{{name: pacer, rule: throughput, b: 1, {COSTS}}}",
        f"{{name: pacer, rule: throughput, b: 2, predictor: draft_confidence, {COSTS}}}",
        f"{{name: pacer, rule: throughput, b: 1, margin: 0.003, predictor: draft_confidence, {COSTS}}}",
    ],
    ids=[
        "send",
        "trim",
        "trim-to-zero",
        "with-fixed",
        "throughput",
        "throughput-confidence-b2",
        "throughput-confidence-long",
    ],
)
@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
def test_greedy_output_is_the_targets_greedy_decoding(tmp_path, greedy_models, stack, verifier):
    target, draft, references = greedy_models
    folder = write_checkpoint(tmp_path / "mb", 32)
    stops = stack if "draft_confidence" in stack else stack.replace("pacer,", f"pacer, checkpoint: '{folder}',")
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            f"strategy.verifier={{name: {verifier}}}",
            f"strategy.stop=[{stops}]",
        ],
        require_models=False,
    )
    engine = Engine.build(adapter(target, eos=False), draft=adapter(draft, eos=False), cfg=cfg)
    with single_thread():
        results = [engine.generate(prompt, max_new_tokens=BUDGET) for prompt in PROMPTS]
    assert [r.tokens for r in results] == references
    if "throughput" in stack:  # the rule learns its rate from the outcomes
        assert all(r.metrics["pacer_rate"] > 0 for r in results)
    else:
        assert sum(r.metrics["pacer_early_stops"] for r in results) >= 3, "M_B never cut a draft"
    lengths = {n for r in results for n in r.metrics["drafted_per_step"]}
    assert len(lengths) >= 2, "draft lengths never varied"
    if "fixed" in stack:
        assert max(lengths) <= 3


# A random M_B's predictions on the scripted draft's hidden states lie around 0.45-0.65, so t0 = 0.55
# cuts the 3-token generations' drafts at varying lengths.
DISTRIBUTION_CASES = [
    pytest.param("b: 1, t0: 0.55, rho: 1.05, t_max: 0.7, max_draft: 3, send_failed_block: false", 5_000, id="trim"),
    pytest.param("b: 1, t0: 0.55, rho: 1.05, t_max: 0.7, max_draft: 3", 20_000, id="send", marks=pytest.mark.slow),
    pytest.param("b: 2, t0: 0.55, rho: 1.0, t_max: 0.7, max_draft: 3", 20_000, id="block2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("options, samples", DISTRIBUTION_CASES)
def test_speculative_sampling_with_pacer_matches_the_target_distribution(tmp_path, options, samples):
    folder = write_checkpoint(tmp_path / "mb", 16)  # ScriptedLM's hidden size
    with single_thread():
        target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
        draft = ScriptedLM(VOCAB, seed=1, table=DRAFT_TABLE.clone())
        engine = build_engine(
            target, draft, "draft_model", f"{{name: pacer, checkpoint: '{folder}', {options}}}", SAMPLINGS["t1"]
        )
        outputs, steps = run(engine, PROMPT, samples)
        expected = exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling)
        p_value = chisquare_pvalue(outputs, expected)
    print(f"{options}: p = {p_value:.4g}, steps/generation = {steps:.2f}")
    assert p_value > PASS_P
    assert 1.2 < steps < LENGTH - 0.2  # drafts were cut at varying lengths and also rejected


# -- train-preverify ---------------------------------------------------------------------------------
def tiny_train_config(tmp_path, **data) -> trainer.TrainPreverifyConfig:
    cfg = trainer.TrainPreverifyConfig(out=str(tmp_path), drafter={"name": "draft_model"}, verifier={"name": "greedy"})
    cfg.data.window, cfg.data.max_new_tokens = 6, 24
    for key, value in data.items():
        setattr(cfg.data, key, value)
    cfg.model.width, cfg.model.heads, cfg.model.ffn_size, cfg.model.max_positions = 16, 2, 32, 8
    cfg.train.pack_len, cfg.train.batch_size, cfg.train.checkpoint_every, cfg.train.warmup = 24, 4, 3, 2
    return cfg


def test_simulated_labels_are_what_the_verifier_decided(tmp_path, greedy_models):
    target_model, draft_model, _ = greedy_models
    cfg = tiny_train_config(tmp_path)
    recorder = trainer.StepRecorder()
    target = adapter(target_model)
    engine = Engine.build(target, draft=adapter(draft_model), plan=trainer.simulation_plan(cfg, [recorder]))
    items = [{"source": "test", "prompt": p} for p in PROMPTS]
    with single_thread():
        trainer.simulate(engine, recorder, items, tmp_path / "samples", 24, seed=0)
    checked = rejected = 0
    for i, prompt in enumerate(PROMPTS):
        sample = load_run_file(tmp_path / "samples" / f"item_{i:05d}.pt")
        assert sample["generated"] == reference_greedy(target_model, prompt, 24)  # SD is still lossless
        sequence = prompt + sample["generated"]
        offsets = [0] + sample["lengths"].cumsum(0).tolist()
        assert sample["hidden"].shape == (offsets[-1], 32) and max(sample["lengths"]) <= 6
        for s, before in enumerate(sample["committed_before"].tolist()):
            tokens = sample["tokens"][offsets[s] : offsets[s + 1]]
            labels = sample["labels"][offsets[s] : offsets[s + 1]]
            # independently: the target's greedy choices after the committed context + draft prefix
            with torch.no_grad():
                logits = target_model(torch.tensor([sequence[:before] + tokens.tolist()])).logits[0]
            greedy = logits[before - 1 : before - 1 + len(tokens)].argmax(-1)
            expected = torch.cumprod((greedy == tokens).long(), 0).bool()  # accepted prefix, then rejected
            assert torch.equal(labels, expected)
            checked += 1
            rejected += int(not expected.all())
    assert checked >= 10 and rejected >= 3  # both outcomes occur
    # resumable: a missing item is simulated again, finished ones are kept
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "samples").glob("*.pt")}
    first = load_run_file(tmp_path / "samples" / "item_00001.pt")
    (tmp_path / "samples" / "item_00001.pt").unlink()
    with single_thread():
        trainer.simulate(engine, recorder, items, tmp_path / "samples", 24, seed=0)
    again = load_run_file(tmp_path / "samples" / "item_00001.pt")
    assert torch.equal(again["labels"], first["labels"]) and again["generated"] == first["generated"]
    for name in ("item_00000.pt", "item_00002.pt"):
        assert (tmp_path / "samples" / name).stat().st_mtime_ns == stamps[name]


def synthetic_steps(count: int, seed: int) -> trainer.StepData:
    """Steps whose labels follow the hidden states: token i is accepted while feature 0 of every
    token up to i is positive (so M_B can learn it)."""
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for item in range(count):
        lengths = torch.randint(2, 7, (3,), generator=generator)
        hidden = torch.randn(int(lengths.sum()), 8, generator=generator) + 0.8
        labels, at = [], 0
        for n in lengths.tolist():
            labels.append(torch.cumprod((hidden[at : at + n, 0] > 0).long(), 0).bool())
            at += n
        samples.append(
            {
                "item": item,
                "lengths": lengths,
                "hidden": hidden.half(),
                "labels": torch.cat(labels),
                "confidence": torch.zeros(len(hidden), 2).half(),
            }
        )
    return trainer.StepData.from_samples(samples)


def test_training_lowers_the_loss_and_resumes(tmp_path):
    cfg = tiny_train_config(tmp_path)
    cfg.train.lr, cfg.model.dropout, cfg.train.checkpoint_every = 1e-2, 0.0, 4
    data = synthetic_steps(40, seed=0)
    train_steps, heldout_steps = trainer.split_steps(data, cfg.data.heldout_every)
    assert set(data.step_item[heldout_steps].tolist()) == {0, 10, 20, 30}
    checkpoint = tmp_path / "checkpoint.pt"
    cfg.train.epochs, cfg.train.threads = 2, 1
    with single_thread():  # restores the thread count train() sets
        net, metrics, info = trainer.train(cfg, checkpoint, data, train_steps, heldout_steps)
    first = info["history"]
    assert info["steps"] == 2 * info["steps_per_epoch"] and checkpoint.exists()
    cfg.train.epochs = 8  # resume the same run for longer
    with single_thread():
        net, metrics, info = trainer.train(cfg, checkpoint, data, train_steps, heldout_steps)
    assert info["steps"] == 8 * info["steps_per_epoch"] and info["history"][: len(first)] == first
    assert info["history"][-1]["loss"] < first[0]["loss"]
    assert info["history"][-1]["heldout_log_loss"] < first[0]["heldout_log_loss"]
    assert metrics["auc"] > 0.8 and 0.0 <= metrics["ece"] <= 1.0 and 0.0 <= metrics["accuracy"] <= 1.0
    assert [p["position"] for p in metrics["by_position"]] == list(range(6))


def test_the_checkpoint_tag_changes_with_the_recipe_but_not_with_what_a_resumed_run_may_change():
    def tag(*overrides):
        return trainer.shape_tag(trainer.load_train_config(None, list(overrides)))

    base = tag()
    for same in (["train.epochs=60"], ["train.threads=1"], ["train.checkpoint_every=7"], ["export=runs/x"]):
        assert tag(*same) == base, same  # continuing, or only how the work is run
    others = [
        tag(*o)
        for o in (
            ["train.lr=0.0005"],
            ["train.weight_decay=0.1"],
            ["model.width=32"],
            ["model.draft_confidence=true"],
            ["seed=1"],
            ["train.batch_size=8"],
        )
    ]
    assert base not in others and len(set(others)) == len(others)


def test_train_preverify_plans_its_simulation_once(tmp_path, monkeypatch, resolutions, capsys):
    """``pacer train-preverify`` end to end on tiny models (the prompts given): the simulation's stack
    is resolved once, and the draft, the drafter's folder and the engine all come from that plan."""
    import pacer_core.hf as hf
    from pacer_core import cli

    target = tiny_llama(0, scale=6.0)
    monkeypatch.setattr(hf, "load_section", lambda section, role: (adapter(target), None, None))
    monkeypatch.setattr(hf, "load_draft", lambda section, tokenizer: adapter(tiny_llama(1)))
    out = tmp_path / "run"
    out.mkdir()
    (out / "items.json").write_text(json.dumps([{"source": "test", "prompt": [5, 9, 13, 5, 9, 21, 7]}]))
    argv = [
        "train-preverify",
        f"out={out}",
        f"draft.path={tmp_path / 'draft'}",
        "drafter={name: draft_model}",
        "verifier={name: greedy}",
        "data.window=6",
        "data.max_new_tokens=12",
        "data.heldout_every=2",
        "model.width=16",
        "model.heads=2",
        "model.ffn_size=32",
        "model.max_positions=8",
        "train.pack_len=24",
        "train.batch_size=4",
        "train.epochs=1",
        "train.threads=1",
    ]
    with single_thread():
        assert cli.main(argv) == 0, capsys.readouterr().err
    assert resolutions == {"plugin_managers": 1, "resolutions": 1}


def test_train_config_errors_are_one_line():
    for overrides, words in [
        (["model.max_positions=8"], "max_positions (8) must be >= data.window (16)"),
        (["model.width=30"], "multiple of heads"),
        (["model.confidence_prior=true"], "set draft_confidence too"),
        (["data.windw=3"], "unknown option 'data.windw'"),
    ]:
        with pytest.raises(ConfigError) as info:
            trainer.load_train_config(None, overrides)
        assert words in str(info.value) and "\n" not in str(info.value)
    # the simulation's stack, checked when the run plans it (before anything is written or loaded)
    for overrides, words in [
        (["drafter={name: prompt_lookup}"], "does not provide hidden states"),
        (["drafter={name: draft_model}", "target.path=/my/target"], "needs a draft model"),
        (["drafter={name: nope}"], "unknown drafter 'nope'"),
    ]:
        with pytest.raises(ConfigError) as info:
            trainer.simulation_plan(trainer.load_train_config(None, overrides))
        assert words in str(info.value) and "\n" not in str(info.value)
    cfg = trainer.load_train_config(None, ["drafter.path=/my/draft", "model.positional=false"])
    assert cfg.drafter == {"name": "eagle", "path": "/my/draft"} and cfg.model.positional is False


class ByteTokenizer:
    """Text → UTF-8 bytes (a stand-in for the target's tokenizer; the chat template adds a marker)."""

    def encode(self, text, chat_template=True):
        return ([1] if chat_template else []) + list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(i for i in ids if i > 1).decode("utf-8", errors="replace")


def distill_record(stdlib_tokens=20_000, docs_tokens=20_000, answers=512, seed=0):
    """The ``corpus_sources`` record `pacer distill` writes for a corpus of these sizes (byte tokens)."""
    from pacer_train.corpus.sources import CorpusConfig, corpus_sources

    corpus = CorpusConfig(stdlib_tokens=stdlib_tokens, docs_tokens=docs_tokens, chat_answers=answers)
    return corpus_sources(corpus, seed, ByteTokenizer())


def small_items_config() -> trainer.TrainPreverifyConfig:
    cfg = trainer.TrainPreverifyConfig()
    d = cfg.data
    d.chat_prompts, d.stdlib_passages, d.docs_passages, d.passage_tokens = 40, 5, 6, 64
    return cfg


def assert_items_avoid(items, used, tokenizer):
    from pydoc_data.topics import topics

    from pacer_train.corpus.instructions import instructions
    from pacer_train.corpus.sources import stdlib_root, text_digest

    asked = {bytes(tokenizer.encode(q)[1:]).decode() for q in instructions(len(used["instructions"]), used["seed"])}
    assert {text_digest(q) for q in asked} == set(used["instructions"])
    chat = [bytes(i["prompt"][1:]).decode() for i in items if i["source"] == "chat"]
    assert chat and not asked.intersection(chat)
    used_text = b"".join((stdlib_root() / e["path"]).read_bytes() for e in used["stdlib"])
    used_text += b"".join(topics[e["topic"]].encode() for e in used["docs"])
    for item in items:
        if item["source"] in ("stdlib", "docs"):
            assert bytes(item["prompt"]) not in used_text


def test_the_corpus_avoids_what_the_draft_was_distilled_on():
    cfg, tokenizer = small_items_config(), ByteTokenizer()
    _, used = distill_record()
    items = trainer.build_items(cfg, tokenizer, used)
    sources = [i["source"] for i in items]
    assert (sources.count("chat"), sources.count("stdlib"), sources.count("docs")) == (40, 5, 6)
    chat = [bytes(i["prompt"][1:]).decode() for i in items if i["source"] == "chat"]
    assert len(set(chat)) == 40
    assert all(len(i["prompt"]) == 64 for i in items if i["source"] != "chat")
    assert_items_avoid(items, used, tokenizer)
    assert trainer.build_items(cfg, tokenizer, used) == items  # deterministic


def write_draft_manifest(folder: Path, **manifest) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_train_preverify_follows_the_drafts_recorded_corpus(tmp_path):
    """A change in distill's corpus sources reaches train-preverify through the draft's manifest."""
    cfg, tokenizer = small_items_config(), ByteTokenizer()
    _, small = distill_record(stdlib_tokens=20_000, docs_tokens=20_000, answers=64)
    _, large = distill_record(stdlib_tokens=60_000, docs_tokens=60_000, answers=128)
    assert len(large["stdlib"]) > len(small["stdlib"]) and len(large["docs"]) > len(small["docs"])
    chosen = {}
    for name, used in (("small", small), ("large", large)):
        folder = write_draft_manifest(tmp_path / name, corpus_sources=used)
        record = trainer.draft_corpus(folder, trainer.draft_manifest(folder), tokenizer)
        assert record == used
        chosen[name] = trainer.build_items(cfg, tokenizer, record)
        assert_items_avoid(chosen[name], used, tokenizer)
    assert chosen["small"] != chosen["large"]
    # what only the larger corpus read may be used after the smaller one, not after the larger one
    newly = {e["path"] for e in large["stdlib"]} - {e["path"] for e in small["stdlib"]}
    assert newly


def test_a_draft_made_before_the_record_is_re_derived_from_its_recipe(tmp_path):
    from pacer_plugins.eagle.distill import DistillConfig

    tokenizer = ByteTokenizer()
    counts, used = distill_record()
    recipe = attrs_asdict(DistillConfig())
    recipe["corpus"].update(stdlib_tokens=20_000, docs_tokens=20_000)
    old = write_draft_manifest(tmp_path / "old", recipe=recipe, corpus={**counts, "chat": 1234, "sequences": 9})
    assert trainer.draft_corpus(old, trainer.draft_manifest(old), tokenizer) == used
    # counts the recipe does not reproduce (another tokenizer or Python): refused in one line
    wrong = write_draft_manifest(tmp_path / "wrong", recipe=recipe, corpus={**counts, "stdlib": counts["stdlib"] + 1})
    with pytest.raises(InputError) as info:
        trainer.draft_corpus(wrong, trainer.draft_manifest(wrong), tokenizer)
    assert "other token counts" in str(info.value) and "\n" not in str(info.value)
    for folder, words in [
        (tmp_path / "none", "has no manifest.json"),
        (
            write_draft_manifest(tmp_path / "foreign", family="someone's draft"),
            "neither corpus_sources nor a distill recipe",
        ),
    ]:
        folder.mkdir(exist_ok=True)
        with pytest.raises(InputError) as info:
            trainer.draft_manifest(folder)
        message = str(info.value)
        assert words in message and "data.skip_draft_corpus=false" in message and "\n" not in message


def corpus_answering_with(folder: Path, texts: list[str]) -> Path:
    """A `pacer corpus` folder (fake target, byte ids) whose first answers are ``texts``."""
    from pacer_train.corpus.command import Backend, CorpusConfig, run_corpus
    from pacer_train.corpus.guard import BenchmarkGuard
    from pacer_train.corpus.stream import Stream

    queue = list(texts)

    def generate(prompts, max_new_tokens, rows, on_answer):
        answers = [list((queue.pop(0) if queue else "short answer").encode()) + [0] for _ in prompts]
        for index, answer in enumerate(answers):
            if on_answer is not None:
                on_answer(index, answer)
        return answers

    backend = Backend(
        encode=lambda text: list(text.encode()[:200]),
        generate=generate,
        vocab_size=256,
        target={"path": "fake", "digest": "f00d", "dtype": "float32", "device": "cpu"},
        eos=[0],
    )
    run_corpus(
        CorpusConfig(out=str(folder), tokens=10, shard_size=4, batch_size=4),
        "pacer corpus test",
        backend=backend,
        stream=Stream(0),
        guard=BenchmarkGuard([]),
    )
    return folder


def test_prompts_the_draft_saw_in_its_self_distillation_corpus_or_its_inits_are_skipped(tmp_path):
    """M_B's prompts avoid every corpus the draft's weights saw: its own self-distillation corpus (a
    13-word run shared with any prompt or answer there) and, through ``init``, the corpus of the draft
    it continued."""
    cfg, tokenizer = small_items_config(), ByteTokenizer()
    cfg.data.passage_tokens = 400  # bytes: passages long enough to hold 13-word runs
    _, used = distill_record()
    plain = trainer.build_items(cfg, tokenizer, used)
    taken = [next(i for i in plain if i["source"] == source) for source in ("stdlib", "docs")]
    corpus = corpus_answering_with(tmp_path / "corpus", [tokenizer.decode(i["prompt"]) for i in taken])
    record = {
        **distill_record(answers=0)[1],
        "selfdistill": {"path": str(corpus), "records": 1},
        "init": used,
    }  # its own corpus (no chat answers) continued from a draft that saw `used`
    assert trainer.seen_sources(record)["instructions"] == used["instructions"]
    guard = trainer.CorpusGuard(trainer.selfdistill_folders(trainer.seen_sources(record)), tokenizer)
    items = trainer.build_items(cfg, tokenizer, record, guard)
    sources = [i["source"] for i in items]
    assert (sources.count("chat"), sources.count("stdlib"), sources.count("docs")) == (40, 5, 6)
    assert guard.skipped >= 2 and not any(i["prompt"] == t["prompt"] for i in items for t in taken)
    assert_items_avoid(items, used, tokenizer)  # the init's instructions, files and topics too
    # without the init's record its 512 answered instructions would come back
    assert trainer.build_items(cfg, tokenizer, {**record, "init": None}, guard) != items
    # a corpus the record names but this machine lacks: refused in one line, before any model loads
    with pytest.raises(InputError) as info:
        trainer.selfdistill_folders(trainer.seen_sources({**record, "selfdistill": {"path": str(tmp_path / "gone")}}))
    assert "not here" in str(info.value) and "data.skip_draft_corpus=false" in str(info.value)
    assert "\n" not in str(info.value)


def attrs_asdict(value):
    import attrs

    return json.loads(json.dumps(attrs.asdict(value)))


def test_the_shipped_drafts_record_their_corpus():
    """Each shipped draft records what its weights saw (its init chain included), and a
    self-distillation corpus it names is the committed one, shard for shard."""
    from pacer_core.draft_model_helpers import shipped_draft
    from pacer_plugins.eagle.drafter import DEFAULT_DRAFT
    from pacer_train.corpus.loaders import recorded_corpus
    from pacer_train.corpus.shards import CorpusStore

    token_draft = Path(shipped_draft())
    seen = {}
    for folder in (DEFAULT_DRAFT, token_draft):
        manifest = json.loads((folder / "manifest.json").read_text())
        record = manifest["corpus_sources"]
        assert record["seed"] == manifest["recipe"]["seed"] == 0
        assert len(record["instructions"]) == manifest["corpus"]["instructions"]
        assert record["stdlib"] and record["docs"] and record["extra"] == []
        seen[folder] = trainer.seen_sources(record)
        for corpus in seen[folder]["selfdistill"]:
            first = corpus.get("first_shard", 0)  # corpus.selfdistill_from
            found = recorded_corpus(corpus)
            read = CorpusStore(found, create=False).shards[first : first + len(corpus["shards"])]
            assert corpus["shards"] == [{"name": e["name"], "sha256": e["sha256"][:16]} for e in read]
            shard_json = [json.loads((found / f"{e['name']}.json").read_text()) for e in read]
            assert corpus["records"] == sum(len(shard["records"]) for shard in shard_json)
    # both continue the one corpus of 512 target-written chat answers the first drafts were made from
    assert len(seen[token_draft]["instructions"]) == 512
    for key in ("instructions", "stdlib", "docs"):
        assert all(entry in seen[DEFAULT_DRAFT][key] for entry in seen[token_draft][key])


def test_a_recorded_corpus_is_found_where_recorded_else_shipped_by_its_shards(tmp_path, monkeypatch):
    """A draft records the corpus path distill was given (relative to where it ran): from elsewhere,
    the shipped corpus holding every recorded shard with its checksum is that corpus; a record whose
    shards no shipped corpus holds finds nothing (and train-preverify refuses it in one line)."""
    from pacer_core.registry import shipped_folder
    from pacer_train.corpus.loaders import OPEN_CHAT_CORPUS, SELFDISTILL_CORPUS, recorded_corpus
    from pacer_train.corpus.shards import CorpusStore

    shipped = shipped_folder(SELFDISTILL_CORPUS)
    shards = [{"name": e["name"], "sha256": e["sha256"][:16]} for e in CorpusStore(shipped, create=False).shards[3:5]]
    record = {"path": "plugins/eagle/corpus", "shards": shards}
    monkeypatch.chdir(tmp_path)  # the recorded relative path is not here
    assert recorded_corpus(record) == shipped
    open_chat = shipped_folder(OPEN_CHAT_CORPUS)
    first = CorpusStore(open_chat, create=False).shards[0]
    assert (
        recorded_corpus({"path": "gone", "shards": [{"name": first["name"], "sha256": first["sha256"][:16]}]})
        == open_chat
    )
    assert recorded_corpus({**record, "shards": [{**shards[0], "sha256": "0" * 16}]}) is None
    assert recorded_corpus({"path": "gone", "shards": []}) is None  # nothing recorded to match
    local = tmp_path / "plugins" / "eagle" / "corpus"
    local.mkdir(parents=True)
    (local / "manifest.json").write_text("{}")
    assert recorded_corpus(record) == Path("plugins/eagle/corpus")  # where recorded comes first
