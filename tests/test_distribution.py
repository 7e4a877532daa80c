"""Exact-distribution tests of sampled speculative decoding.

On a tiny vocabulary the target's exact distribution over the first three sampled tokens is
enumerated (``pacer_core.testing.exact_continuation_probs``: 8**3 = 512 outcomes) and the engine's
generations (fixed seeds; 6,000 in the default suite, 20,000 in the slow grid) are tested against it
with a chi-square test, for every
drafter × stop policy with the ``speculative_sampling`` verifier. Deliberately wrong verifiers must
fail the same test, so the test can tell. The models are ``ScriptedLM`` tables (pure torch, about
0.3-0.6 ms per generation); one test runs tiny real Llamas through the HF adapter.

Default suite: draft_model × every stop at temperature 1, the other drafters with one stop each
(autoregressive: its output does not depend on the stop policy, which a quick test checks;
prompt_lookup with the heuristic window), each sampling variant (temperature 0.6, top-k 3, top-p
0.8) on draft_model × fixed γ=3, a draft equal to the target, one wrong verifier and the HF adapter
(2,000 samples). Everything else of the grid (prompt_lookup × fixed γ among it) is marked slow.
6,000 samples keep the default suite's power: the wrong verifier's p-value is about 1e-189 at 5,000.

The runs are independent, so they are computed ahead in spawned processes, one per core this test
process has (``helpers.PROCESS_CORES``: all of them, or its share under the suite's pytest-xdist
workers), while the tests read their results in order; with one core each runs in the test itself.
"""

from __future__ import annotations

import time

import attrs
import pytest
import torch

from pacer_core import Component, Resources, SamplingParams, Verdict, hookimpl
from pacer_core.acceptance import residual_distribution
from pacer_core.sampling import logits_to_probs, sample
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs

from helpers import (
    DRAFT_TABLE,
    LENGTH,
    PASS_P,
    PROMPT,
    SAMPLINGS,
    TARGET_TABLE,
    adapter,
    build_engine,
    precomputed,
    single_thread,
    tiny_llama,
)
from helpers import SCRIPTED_VOCAB as VOCAB
from helpers import sample_outputs as run

SAMPLES = 20_000  # the slow grid
FAST_SAMPLES = 6_000  # the default suite's cases
FAIL_P = 1e-6  # a wrong verifier must fall below this one

DRAFTERS = ("autoregressive", "draft_model", "prompt_lookup")
STOPS = {
    "fixed2": "{name: fixed, gamma: 2}",
    "fixed3": "{name: fixed, gamma: 3}",
    "heuristic": "{name: heuristic, gamma: 2}",
}
BASE_SAMPLING = "t1"
VARIANT_COMBINATION = ("draft_model", "fixed3")
ONE_STOP = {("autoregressive", "fixed2"), ("prompt_lookup", "heuristic")}  # the default suite's other drafters

HF_VOCAB = 16
HF_PROMPT = [3, 7, 11, 5]
HF_SAMPLES = 2_000


# -- deliberately wrong verifiers ----------------------------------------------------------------
@attrs.define
class WrongConfig:
    pass


class _ScriptedVerifier:
    """The loop the test verifiers share: draft token i (x) is rejected when ``recover`` returns the
    distribution to sample its replacement from; after n accepted tokens, the bonus token comes from p."""

    def __init__(self, config: WrongConfig, resources: Resources):
        self.sampling = resources.sampling

    def recover(self, u: float, i: int, x: int, draft, target_probs: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError

    @hookimpl
    def pacer_verify(self, state, draft, target_logits) -> Verdict:
        target_probs = logits_to_probs(target_logits, self.sampling)  # [n + 1, vocab]
        for i, x in enumerate(draft.tokens.tolist()):
            recovered = self.recover(float(torch.rand(1, generator=state.generator)), i, x, draft, target_probs)
            if recovered is not None:
                return Verdict(i, int(sample(recovered, state.generator)), "recovered")
        n = len(draft)
        return Verdict(n, int(sample(target_probs[n], state.generator)), "bonus")


class RecoverFromTarget(_ScriptedVerifier):
    """WRONG: accepts with min(1, p/q) but samples the recovered token from p, not the residual."""

    def recover(self, u, i, x, draft, target_probs):
        q_x = 1.0 if draft.draft_probs is None else float(draft.draft_probs[i, x])
        return target_probs[i] if u * q_x >= float(target_probs[i, x]) else None


class AcceptIgnoringDraftProbs(_ScriptedVerifier):
    """WRONG: accepts with p(x), ignoring q, then samples from the residual max(0, p - q)."""

    def recover(self, u, i, x, draft, target_probs):
        if u >= float(target_probs[i, x]):
            return residual_distribution(target_probs[i], draft.draft_probs[i])
        return None


class PointMassVerifier(_ScriptedVerifier):
    """Right, though it ignores q: accept x with p(x), else sample from normalize(max(0, p - δx)).

    Conditioned on the drafted token x this emits y with p(x)·[y = x] + (1 - p(x))·p(y)/(1 - p(x))
    for y ≠ x, i.e. exactly p(y): point-mass verification is lossless for any drafter (it only
    accepts less often than speculative sampling). A positive control for the wrong verifiers.
    """

    def recover(self, u, i, x, draft, target_probs):
        if u >= float(target_probs[i, x]):
            point_mass = torch.nn.functional.one_hot(torch.tensor(x), target_probs.shape[-1]).float()
            return residual_distribution(target_probs[i], point_mass)
        return None


class TestVerifiers:
    """A plugin module offering the test verifiers (registered through ``extra_plugins``)."""

    __test__ = False  # not a pytest test class

    @hookimpl
    def pacer_components(self) -> list[Component]:
        return [
            Component(
                "verifier",
                "test_recover_from_target",
                WrongConfig,
                RecoverFromTarget,
                "WRONG: recovered token drawn from p, not the residual",
            ),
            Component(
                "verifier",
                "test_accept_ignoring_q",
                WrongConfig,
                AcceptIgnoringDraftProbs,
                "WRONG: accepts with p(x), ignoring q",
            ),
            Component(
                "verifier",
                "test_point_mass",
                WrongConfig,
                PointMassVerifier,
                "point-mass verification (lossless for any drafter)",
            ),
        ]


TEST_PLUGINS = (TestVerifiers(),)


# -- running one case ----------------------------------------------------------------------------
def hf_models():
    """A tiny Llama target (peaky: scaled lm_head) and a draft that is a noisy copy of it."""
    target = tiny_llama(0, vocab=HF_VOCAB, scale=25.0)
    draft = tiny_llama(0, vocab=HF_VOCAB, scale=25.0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        weight = draft.lm_head.weight
        weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * 0.5)
    return adapter(target, eos=False), adapter(draft, eos=False)


@attrs.frozen
class Case:
    """One distribution test: ``draft`` is "mixed" (DRAFT_TABLE), "target" (a copy of the target's
    table) or "hf" (tiny Llamas; then the prompt is HF_PROMPT)."""

    drafter: str
    stop: str
    sampling: str = BASE_SAMPLING
    verifier: str = "speculative_sampling"
    draft: str = "mixed"
    samples: int = SAMPLES

    def __str__(self) -> str:
        return f"{self.drafter}-{self.stop}-{self.sampling}-{self.verifier}-{self.draft}-{self.samples}"


def measure(case: Case) -> tuple[float, float, float]:
    """Run ``case``; returns (chi-square p-value, steps per generation, CPU seconds)."""
    start = time.process_time()
    with single_thread():
        if case.draft == "hf":
            (target, draft), prompt = hf_models(), HF_PROMPT
        else:
            draft_table = TARGET_TABLE if case.draft == "target" else DRAFT_TABLE
            target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
            draft, prompt = ScriptedLM(VOCAB, seed=1, table=draft_table.clone()), PROMPT
        engine = build_engine(
            target, draft, case.drafter, STOPS[case.stop], SAMPLINGS[case.sampling], case.verifier, plugins=TEST_PLUGINS
        )
        outputs, steps = run(engine, prompt, case.samples)
        expected = exact_continuation_probs(target, prompt, LENGTH, engine.sampling)
        p_value = chisquare_pvalue(outputs, expected)
    return p_value, steps, time.process_time() - start


@pytest.fixture(scope="module")
def measured(request):
    """``measured(case)`` → (p-value, steps per generation, CPU s), computed ahead in spawned
    workers (``helpers.precomputed``); the HF cases are the longest (and import transformers), so
    they start first to balance the workers."""
    with precomputed(request, measure, first=lambda case: case.draft == "hf") as get:
        yield get


# -- the scripted model and the helpers themselves ------------------------------------------------
def test_scripted_model_rows_match_their_context_and_tree_mask():
    model = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
    model.forward([5, 6, 7])
    out = model.forward([1, 2, 3], logits_from=1, hidden=True)
    assert out.logits.shape == (2, VOCAB) and out.hidden_states.shape == (3, model.hidden_size)
    assert torch.equal(out.logits[0], model.next_logits([1, 2]))
    assert torch.equal(out.logits[1], model.next_logits([2, 3]))
    assert list(model.cached_tokens) == [5, 6, 7, 1, 2, 3] and model.num_forwards == 2
    model.crop(4)
    # rows 0-1 are a chain [4, 0]; row 2 is a branch [6] that sees row 0 only
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    out = model.forward([4, 0, 6], positions=torch.tensor([0, 1, 1]), tree_mask=mask)
    assert torch.equal(out.logits[0], model.next_logits([1, 4]))
    assert torch.equal(out.logits[1], model.next_logits([4, 0]))
    assert torch.equal(out.logits[2], model.next_logits([4, 6]))
    assert list(model.cached_tokens) == [5, 6, 7, 1, 4, 0, 6]
    out.logits.add_(1.0)  # the caller owns the returned rows: the table must not change
    assert torch.equal(model.next_logits([4, 0]), TARGET_TABLE[model.key([4, 0])])
    model.reset()
    assert model.forward([3], logits_from=0).logits[0].equal(model.next_logits([3]))
    assert not model.next_logits([3]).equal(model.next_logits([2, 3]))  # padded short context


def test_exact_probs_sum_to_one_and_follow_the_chain_rule():
    target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
    params = SamplingParams(temperature=0.7, top_k=4)
    probs = exact_continuation_probs(target, PROMPT, LENGTH, params)
    assert probs.shape == (VOCAB,) * LENGTH and abs(float(probs.sum()) - 1.0) < 1e-9
    first = logits_to_probs(target.next_logits(PROMPT), params).double()
    second = logits_to_probs(target.next_logits(PROMPT + [2]), params).double()
    third = logits_to_probs(target.next_logits(PROMPT + [2, 3]), params).double()
    assert torch.allclose(probs[2, 3, 0], first[2] * second[3] * third[0], rtol=1e-5)
    assert int((probs > 0).sum()) == 4**3  # top-k 4 at each of the three positions


def test_chisquare_accepts_exact_samples_and_rejects_biased_ones():
    generator = torch.Generator().manual_seed(0)
    expected = torch.softmax(torch.randn(VOCAB * VOCAB, generator=generator), -1).reshape(VOCAB, VOCAB)
    draws = torch.multinomial(expected.reshape(-1), 5000, replacement=True, generator=generator).tolist()
    exact = [(d // VOCAB, d % VOCAB) for d in draws]
    assert chisquare_pvalue(exact, expected) > PASS_P
    biased = [(0, 0) if i % 20 == 0 else s for i, s in enumerate(exact)]  # 5% extra mass on one pair
    assert chisquare_pvalue(biased, expected) < FAIL_P
    impossible = expected.clone()
    impossible[0, 0] = 0.0
    assert chisquare_pvalue(exact[:500] + [(0, 0)], impossible) == 0.0  # a sample the model cannot emit


def test_autoregressive_output_does_not_depend_on_the_stop_policy():
    """Why the default suite tests the autoregressive drafter with one stop policy only."""
    outputs = []
    with single_thread():
        for stop in STOPS.values():
            target, draft = ScriptedLM(VOCAB, table=TARGET_TABLE.clone()), None
            engine = build_engine(target, draft, "autoregressive", stop, SAMPLINGS[BASE_SAMPLING])
            outputs.append(run(engine, PROMPT, 300)[0])
    assert outputs[0] == outputs[1] == outputs[2]


# -- the distribution tests -----------------------------------------------------------------------
def grid():
    for sampling in SAMPLINGS:
        for drafter in DRAFTERS:
            for stop in STOPS:
                fast = (sampling == BASE_SAMPLING and (drafter == "draft_model" or (drafter, stop) in ONE_STOP)) or (
                    drafter,
                    stop,
                ) == VARIANT_COMBINATION
                yield pytest.param(
                    Case(drafter, stop, sampling, samples=FAST_SAMPLES if fast else SAMPLES),
                    marks=() if fast else (pytest.mark.slow,),
                    id=f"{drafter}-{stop}-{sampling}",
                )


@pytest.mark.parametrize("case", list(grid()))
def test_speculative_sampling_matches_target_distribution(case, measured):
    p_value, steps, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, steps/generation = {steps:.2f}, {seconds:.1f} s CPU")
    assert p_value > PASS_P
    # the drafter really drafted, and its tokens were both accepted and rejected
    if case.drafter == "autoregressive":
        assert steps == LENGTH
    else:
        assert 1.2 < steps < LENGTH - 0.2


@pytest.mark.parametrize(
    "case",
    [
        Case("draft_model", "fixed2", draft="target", samples=5_000),
        pytest.param(Case("draft_model", "heuristic", draft="target"), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_draft_equal_to_target_matches_target_distribution(case, measured):
    """p == q: every draft token is accepted (no 0/0 in the residual), bonus tokens only."""
    p_value, steps, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, steps/generation = {steps:.2f}, {seconds:.1f} s CPU")
    assert p_value > PASS_P
    assert steps < 1.01  # γ ≥ 2 accepted + the bonus: the whole budget in (almost always) one step


@pytest.mark.parametrize(
    "case",
    [
        Case("draft_model", "fixed3", verifier="test_recover_from_target", samples=FAST_SAMPLES),
        pytest.param(Case("prompt_lookup", "fixed3", verifier="test_recover_from_target"), marks=pytest.mark.slow),
        pytest.param(Case("draft_model", "fixed3", verifier="test_accept_ignoring_q"), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_wrong_verifier_fails_the_distribution_test(case, measured):
    p_value, _, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, {seconds:.1f} s CPU")
    assert p_value < FAIL_P


@pytest.mark.slow
@pytest.mark.parametrize("case", [Case("draft_model", "fixed3", verifier="test_point_mass")], ids=str)
def test_point_mass_verification_ignoring_q_is_still_lossless(case, measured):
    """The control for ``test_accept_ignoring_q``: ignoring q is fine with the matching residual."""
    p_value, _, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, {seconds:.1f} s CPU")
    assert p_value > PASS_P


# -- tiny real Llamas through the HF adapter -----------------------------------------------------
@pytest.mark.parametrize(
    "case",
    [
        Case("draft_model", "fixed2", draft="hf", samples=HF_SAMPLES),
        pytest.param(Case("draft_model", "heuristic", draft="hf", samples=SAMPLES), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_hf_draft_model_matches_target_distribution(case, measured):
    p_value, steps, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, steps/generation = {steps:.2f}, {seconds:.1f} s CPU")
    assert p_value > PASS_P
    assert 1.2 < steps < LENGTH - 0.2
