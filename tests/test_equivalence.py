"""Greedy speculative decoding equals the target's own greedy decoding, token for token.

Every built-in drafter × stop policy × verifier (``speculative_sampling`` at temperature 0 included)
is run on tiny seeded Llama models (fp32, built from configs) and compared with transformers'
``generate(do_sample=False)`` of the target (``helpers.reference_greedy``). Drafts: the target itself
(every draft token accepted), a differently seeded model (almost none accepted) and a perturbed copy
(some accepted). Edge cases: EOS inside the draft, the token budget ending inside the draft,
one-token prompts, repetitive prompts (prompt lookup hits). An observer plugin registered through
``extra_plugins`` checks the KV-cache invariants after every step. Also: seeded determinism of
sampled decoding, and the metrics' bookkeeping.
"""

from __future__ import annotations

import functools
import math

import attrs
import pytest

from pacer_core import Component, Engine, hookimpl, load_config

from helpers import EOS, adapter, perturbed, reference_greedy, tiny_llama, with_eos_bias

BUDGET = 22
PROMPTS = {"plain": [5, 9, 13, 7, 22], "one_token": [17], "repetitive": [5, 9, 13, 5, 9, 13, 5, 9]}
EOS_BIAS = 0.03  # added to the target's EOS logit: EOS becomes its argmax after a few tokens
EOS_PROMPTS = {"one_token": [17], "repetitive": [5, 9, 13, 5, 9, 13, 5, 9]}

STOPS = {
    "fixed1": "{name: fixed, gamma: 1}",
    "fixed3": "{name: fixed, gamma: 3}",
    "fixed4": "{name: fixed, gamma: 4}",
    "fixed6": "{name: fixed, gamma: 6}",
    "heuristic": "{name: heuristic, gamma: 2}",
}
FIXED_GAMMA = {"fixed1": 1, "fixed3": 3, "fixed4": 4, "fixed6": 6}
MAIN_STOPS = ("fixed1", "fixed3", "fixed6", "heuristic")
VERIFIERS = ("greedy", "speculative_sampling")
# (drafter, draft model); the draft models are "same" (== target), "partial", "random"
DRAFT_SETUPS = [
    pytest.param("autoregressive", None, id="autoregressive"),
    pytest.param("prompt_lookup", None, id="prompt_lookup"),
    pytest.param("draft_model", "same", id="draft_model-same"),
    pytest.param("draft_model", "partial", id="draft_model-partial"),
    pytest.param("draft_model", "random", id="draft_model-random"),
]


# -- models ----------------------------------------------------------------------------------


@functools.cache
def model(kind: str):
    """Tiny seeded Llamas, built once per session. Each kind is its own module object."""
    builders = {
        "target": lambda: tiny_llama(0),
        "same": lambda: tiny_llama(0),  # equal weights, separate object (and KV cache)
        "partial": lambda: perturbed(tiny_llama(0), std=0.1, seed=123),
        "random": lambda: tiny_llama(1),
        "eos_target": lambda: with_eos_bias(tiny_llama(0), EOS_BIAS),
        "eos_same": lambda: with_eos_bias(tiny_llama(0), EOS_BIAS),
    }
    return builders[kind]()


@functools.cache
def reference(kind: str, prompt: tuple[int, ...], budget: int, eos: bool = True) -> tuple[int, ...]:
    return tuple(reference_greedy(model(kind), list(prompt), budget, eos=eos))


# -- the invariant-checking observer plugin --------------------------------------------------


@attrs.define
class NoOptions:
    pass


class CacheInvariants:
    """Observer: nothing is cached before step 0 (its forward prefills the prompt); after every
    step, the target's cache holds exactly the committed prefix minus the one pending token, and
    the draft model's cache holds a prefix of committed + draft tokens."""

    def __init__(self, config: NoOptions, resources):
        self.target, self.draft = resources.target, resources.draft
        self.fixed_gamma = None  # set by a test: every draft must have exactly this many tokens
        self.records = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.records = []
        assert list(self.target.cached_tokens) == []  # step 0's forward prefills the prompt

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self.records.append(step)
        cached = list(self.target.cached_tokens)
        assert cached == state.tokens[: len(cached)]
        assert len(cached) == min(step.committed_before + step.verdict.accepted, len(state.tokens))
        # the rollback keeps the accepted draft; on the last step the budget may cut the emitted
        # tokens inside it, and then the cache holds every committed token (nothing is pending)
        last_step = state.budget_left == 0 or step.emitted[-1] in state.eos_token_ids
        if not last_step:
            assert len(state.tokens) - len(cached) == 1
        assert step.verdict.nodes(step.draft) == step.draft.path_nodes[: step.verdict.accepted]
        assert list(step.emitted) == state.tokens[step.committed_before :]
        kept = min(step.verdict.accepted, len(step.emitted))
        assert list(step.emitted[:kept]) == step.draft.tokens[:kept].tolist()
        budget_before = state.max_new_tokens - (step.committed_before - state.prompt_length)
        assert len(step.draft) <= budget_before
        if self.fixed_gamma is not None:
            assert len(step.draft) == min(self.fixed_gamma, budget_before)  # never silently shortened
        if self.draft is not None:
            context = state.tokens[: step.committed_before] + step.draft.tokens.tolist()
            draft_cached = list(self.draft.cached_tokens)
            assert len(draft_cached) <= len(context)
            assert draft_cached == context[: len(draft_cached)]


class InvariantsPlugin:
    """An extra plugin (a class instance) offering the ``cache_invariants`` observer."""

    def __init__(self):
        self.built: list[CacheInvariants] = []

    @hookimpl
    def pacer_components(self):
        return [Component("observer", "cache_invariants", NoOptions, self._build, "test: cache invariants")]

    def _build(self, config, resources):
        checker = CacheInvariants(config, resources)
        self.built.append(checker)
        return checker


def build(
    drafter: str, draft_kind, stop: str, verifier: str, *, target_kind: str = "target", overrides=()
) -> tuple[Engine, CacheInvariants]:
    """An engine on the tiny models with the invariant checker; ``stop`` names an entry of STOPS."""
    plugin = InvariantsPlugin()
    cfg = load_config(
        overrides=[
            f"strategy.drafter={{name: {drafter}}}",
            f"strategy.stop=[{STOPS[stop]}]",
            f"strategy.verifier={{name: {verifier}}}",
            "strategy.observers=[{name: metrics}, {name: cache_invariants}]",
            *overrides,
        ],
        extra_plugins=[plugin],
        require_models=False,
    )
    draft = adapter(model(draft_kind)) if draft_kind else None
    engine = Engine.build(adapter(model(target_kind)), draft=draft, cfg=cfg, extra_plugins=[plugin])
    (checker,) = plugin.built
    if drafter == "draft_model" and stop in FIXED_GAMMA:
        checker.fixed_gamma = FIXED_GAMMA[stop]
    return engine, checker


def check_metrics(result, prompt: list[int], records) -> None:
    m = result.metrics
    assert m["emitted"] == len(result.tokens) == m["new_tokens"] == sum(len(r.emitted) for r in records)
    assert m["steps"] == len(records)
    drafted = sum(r.drafted for r in records)
    accepted = sum(r.verdict.accepted for r in records)
    assert (m["drafted"], m["accepted"]) == (drafted, accepted)
    assert m["acceptance_rate"] == pytest.approx(accepted / drafted if drafted else 0.0)
    longest = max((r.drafted for r in records), default=0)
    per_position = [
        sum(r.verdict.accepted > i for r in records) / sum(r.drafted > i for r in records) for i in range(longest)
    ]
    assert m["per_position_acceptance"] == pytest.approx(per_position)
    assert m["mean_accepted_length"] == pytest.approx(len(result.tokens) / m["steps"])
    assert m["target_forwards"] == m["steps"]  # one per step: step 0's also prefills the prompt
    assert m["draft_forwards"] == sum(r.draft_forwards for r in records)


# -- greedy equivalence ----------------------------------------------------------------------


@pytest.mark.parametrize("verifier", VERIFIERS)
@pytest.mark.parametrize("stop", MAIN_STOPS)
@pytest.mark.parametrize("drafter, draft_kind", DRAFT_SETUPS)
def test_greedy_sd_equals_generate(drafter, draft_kind, stop, verifier):
    engine, checker = build(drafter, draft_kind, stop, verifier)
    drafted = accepted = 0
    for name, prompt in PROMPTS.items():  # one engine, several prompts: state must not leak
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == list(reference("target", tuple(prompt), BUDGET)), name
        assert result.finish_reason == "length"
        check_metrics(result, prompt, checker.records)
        drafted += result.metrics["drafted"]
        accepted += result.metrics["accepted"]
        if drafter == "draft_model" and draft_kind == "same":
            assert result.metrics["acceptance_rate"] == 1.0
            if stop in FIXED_GAMMA:
                assert result.metrics["steps"] == math.ceil(BUDGET / (FIXED_GAMMA[stop] + 1))
        if drafter == "autoregressive":
            assert result.metrics["steps"] == BUDGET and result.metrics["drafted"] == 0
        if drafter == "prompt_lookup" and name == "repetitive":
            assert checker.records[0].drafted > 0  # the prompt's own n-grams are drafted at once
    if draft_kind == "random":
        assert accepted / drafted < 0.2
    if draft_kind == "partial":
        assert 0.2 < accepted / drafted < 0.95
    if drafter == "prompt_lookup":
        assert accepted > 0


@pytest.mark.parametrize("budget", [1, 2, 4, 7, 11])
@pytest.mark.parametrize(
    "drafter, draft_kind",
    [
        pytest.param("draft_model", "same", id="draft_model-same"),
        pytest.param("draft_model", "partial", id="draft_model-partial"),
        pytest.param("prompt_lookup", None, id="prompt_lookup"),
    ],
)
def test_budget_ending_inside_the_draft(drafter, draft_kind, budget):
    """γ = 4 drafts emit up to 5 tokens; budgets that are not multiples of 5 end inside a step."""
    engine, checker = build(drafter, draft_kind, "fixed4", "speculative_sampling")
    prompt = PROMPTS["repetitive"]
    result = engine.generate(prompt, max_new_tokens=budget)
    assert result.tokens == list(reference("target", tuple(prompt), budget))
    assert len(result.tokens) == budget and result.finish_reason == "length"
    check_metrics(result, prompt, checker.records)
    if draft_kind == "same":
        last = checker.records[-1]
        assert last.drafted == min(4, budget - 5 * (len(checker.records) - 1))
        assert last.verdict.accepted == last.drafted  # all accepted, the bonus cut by the budget
        assert len(last.emitted) == last.drafted


# -- EOS -------------------------------------------------------------------------------------


def test_eos_target_ends_early():
    """Precondition of the EOS tests: the biased target emits EOS after a few tokens."""
    for prompt in EOS_PROMPTS.values():
        tokens = reference("eos_target", tuple(prompt), 30)
        assert tokens[-1] == EOS and EOS not in tokens[:-1] and 3 <= len(tokens) < 30
    unbiased = reference("target", tuple(EOS_PROMPTS["one_token"]), 30)
    assert EOS not in unbiased


EOS_DRAFT_SETUPS = [
    pytest.param("autoregressive", None, id="autoregressive"),
    pytest.param("prompt_lookup", None, id="prompt_lookup"),
    pytest.param("draft_model", "eos_same", id="draft_model-same"),  # drafts EOS, then more
    pytest.param("draft_model", "target", id="draft_model-unbiased"),  # drafts past the EOS
    pytest.param("draft_model", "random", id="draft_model-random"),
]


@pytest.mark.parametrize("verifier", VERIFIERS)
@pytest.mark.parametrize("stop", MAIN_STOPS)
@pytest.mark.parametrize("drafter, draft_kind", EOS_DRAFT_SETUPS)
def test_eos_inside_the_draft_stops_like_generate(drafter, draft_kind, stop, verifier):
    engine, checker = build(drafter, draft_kind, stop, verifier, target_kind="eos_target")
    eos_accepted_inside_draft = False
    for name, prompt in EOS_PROMPTS.items():
        result = engine.generate(prompt, max_new_tokens=30)
        expected = list(reference("eos_target", tuple(prompt), 30))
        assert result.tokens == expected, name
        assert result.finish_reason == "eos"
        check_metrics(result, prompt, checker.records)
        last = checker.records[-1]
        eos_accepted_inside_draft |= EOS in last.draft.tokens[: last.verdict.accepted].tolist()
        if draft_kind == "eos_same":
            assert result.metrics["acceptance_rate"] == 1.0
    if draft_kind == "eos_same" and stop in ("fixed3", "fixed6"):
        assert eos_accepted_inside_draft  # EOS drafted and accepted, the tokens after it dropped


def test_ignore_eos_decodes_the_whole_budget():
    engine, checker = build(
        "draft_model",
        "eos_same",
        "fixed3",
        "greedy",
        target_kind="eos_target",
        overrides=["generation.ignore_eos=true"],
    )
    prompt = EOS_PROMPTS["repetitive"]
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == list(reference("eos_target", tuple(prompt), BUDGET, eos=False))
    assert EOS in result.tokens[:-1] and result.finish_reason == "length"
    check_metrics(result, prompt, checker.records)


# -- sampled decoding: seeded determinism ----------------------------------------------------

SAMPLING = ["sampling.temperature=0.8", "sampling.top_k=20", "sampling.top_p=0.9"]


@pytest.mark.parametrize(
    "drafter, draft_kind",
    [
        pytest.param("autoregressive", None, id="autoregressive"),
        pytest.param("prompt_lookup", None, id="prompt_lookup"),
        pytest.param("draft_model", "partial", id="draft_model-partial"),
    ],
)
def test_seeded_sampling_is_deterministic(drafter, draft_kind):
    prompt = PROMPTS["repetitive"]
    engine, checker = build(drafter, draft_kind, "fixed3", "speculative_sampling", overrides=SAMPLING)
    first = engine.generate(prompt, max_new_tokens=BUDGET, seed=5)
    check_metrics(first, prompt, checker.records)
    assert engine.generate(prompt, max_new_tokens=BUDGET, seed=5).tokens == first.tokens
    fresh, _ = build(drafter, draft_kind, "fixed3", "speculative_sampling", overrides=SAMPLING + ["sampling.seed=5"])
    assert fresh.generate(prompt, max_new_tokens=BUDGET).tokens == first.tokens  # the config's seed
    others = {tuple(engine.generate(prompt, max_new_tokens=BUDGET, seed=s).tokens) for s in (6, 7)}
    assert tuple(first.tokens) not in others
    assert len(others) == 2
