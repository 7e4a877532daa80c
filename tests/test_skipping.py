"""The draft gate: a cost-aware stack decodes a step plainly when drafting does not pay
(pacer_core/skipping.py, docs/costs.md#skipping-drafting).

The pure rules on worked numbers; the gate's back-off on scripted steps; its config refused in one
line; then through the engine: every cost-aware stack (eagle, dflash and draft_model trees with
``nodes: auto``, the ``pacer`` stop's throughput rule) with skipping forced stays token for token
the target's greedy decoding, and sampled decoding keeps the target's exact distribution with the
gate skipping (a variant deciding from the current step's draft fails that test); the engine's
decisions are reproduced from the earlier steps' records alone, and no draft hook runs in a skipped
step.
"""

from __future__ import annotations

import types

import attrs
import pytest

from pacer_core import Component, ConfigError, Engine, InputError, Stop, hookimpl, load_config
from pacer_core.cost_profiles import CostModel, load_profile
from pacer_core.skipping import (
    DraftGate,
    SkipConfig,
    draft_gate,
    drafted_step_seconds,
    drafting_loses,
    next_wait,
    step_gain,
)
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs

from helpers import (
    DRAFT_TABLE,
    INLINE_COSTS,
    LENGTH,
    PASS_P,
    PROMPT,
    TARGET_TABLE,
    adapter,
    block_engine,
    build_engine,
    engine_for,
    make_block_draft,
    make_draft,
    plain_greedy,
    reference_greedy,
    sample_outputs,
    single_thread,
    tiny_llama,
)
from helpers import SCRIPTED_VOCAB as VOCAB

COST = CostModel([0.020, 0.021, 0.022, 0.023, 0.024], draft_token_s=0.002, step_s=0.001, plain_host_s=0.0005)
# the gate on, drafting never paying: skip whenever the back-off allows
FORCED = [
    "generation.skip_drafting.enabled=true",
    "generation.skip_drafting.margin=100",
    "generation.skip_drafting.min_steps=1",
]
PACER = f"{{name: pacer, rule: throughput, b: 1, max_draft: 3, predictor: draft_confidence, {INLINE_COSTS}}}"


def step(index: int, emitted: int, forwards: int = 2, nodes: int = 2, chain: bool = True):
    """A committed step as the gate reads it (``StepRecord``'s fields it uses)."""
    tree = types.SimpleNamespace(is_chain=chain)
    return types.SimpleNamespace(
        index=index,
        emitted=(0,) * emitted,
        draft_forwards=forwards,
        draft=types.SimpleNamespace(num_nodes=nodes, tree=tree),
    )


# -- the rules -------------------------------------------------------------------------------------
def test_a_steps_gain_is_its_tokens_less_what_plain_decoding_emits_in_its_time():
    # 1.5 tokens in 30 ms; plain decoding emits 1 token in 20 ms, so 1.5 in 30 ms: a tie gains nothing
    assert step_gain(1.5, 0.030, 0.020) == pytest.approx(0.0)
    assert step_gain(1, 0.030, 0.020) == pytest.approx(-0.5)
    assert step_gain(1.5, 0.030, 0.020, margin=1.05) == pytest.approx(-0.075)  # must be 5% faster
    assert step_gain(4, 0.040, 0.020) == pytest.approx(2.0)


def test_drafting_loses_only_when_the_mean_gain_is_below_zero_by_the_confidence():
    assert not drafting_loses([-1.0, -1.0, -1.0], 0.5)  # fewer than min_steps (4): no verdict yet
    assert drafting_loses([-1.0], 0.5, min_steps=1)  # one gain has no spread
    assert drafting_loses([-1.0, -1.0, -1.0, -1.0], 0.5)  # no spread: the mean alone
    # mean -0.25, sample standard deviation 0.5, standard error 0.25
    gains = [-0.5, 0.5, -0.5, -0.5]
    assert drafting_loses(gains, 0.0) and drafting_loses(gains, 0.5)  # -0.25 + 0.5 · 0.25 < 0
    assert not drafting_loses(gains, 1.0)  # -0.25 + 1.0 · 0.25 is not below 0
    assert not drafting_loses([0.0] * 8, 0.0)  # a tie is not a loss


def test_a_drafted_step_is_priced_by_its_forwards_and_nodes():
    # a chain: step_s + forwards · draft + verify(nodes + 1)
    assert drafted_step_seconds(COST, 3, 2, chain=True) == pytest.approx(0.001 + 0.006 + 0.022)
    # a trimmed chain pays the forwards of tokens it did not send
    assert drafted_step_seconds(COST, 3, 0, chain=True) == pytest.approx(0.001 + 0.006 + 0.020)
    # a tree: its host time by nodes and a tree-masked forward over them
    tree_cost = attrs.evolve(COST, tree_k=(2, 8), tree_verify_s=(0.03, 0.05))
    assert drafted_step_seconds(tree_cost, 2, 4, chain=False) == pytest.approx(0.001 + 0.004 + 0.04)
    # a block drafter: a draft token costs a quarter of a forward, and one forward drafts the whole block
    block = attrs.evolve(COST, draft_token_s=0.0005, tokens_per_forward=4)
    assert drafted_step_seconds(block, 1, 4, chain=True) == pytest.approx(0.001 + 0.002 + 0.024)
    assert drafted_step_seconds(block, 2, 4, chain=True) == pytest.approx(0.001 + 0.004 + 0.024)  # a second block
    assert COST.plain_step() == pytest.approx(0.0205)  # one one-token forward and a plain step's host time
    assert CostModel([0.02], step_s=0.001).plain_step() == pytest.approx(0.021)  # without it: step_s
    profile = load_profile("cpu-2core-smollm2-fp32")
    assert profile.cost_model("feature").plain_step() == pytest.approx(profile.plain_step())


def test_the_back_off_doubles_up_to_its_cap_and_ends_when_drafting_stops_losing():
    waits, wait = [], 0
    for _ in range(7):
        wait = next_wait(wait, True, 16)
        waits.append(wait)
    assert waits == [1, 2, 4, 8, 16, 16, 16]
    assert next_wait(8, False, 16) == 0


# -- the gate on scripted steps --------------------------------------------------------------------------
def test_the_gate_skips_with_back_off_and_drafts_again_once_drafting_pays():
    gate = DraftGate(COST, SkipConfig())
    # a drafted step of 2 forwards and 2 nodes costs 0.027 s, plain decoding 0.0205 s a token: a step
    # emitting one token gains 1 - 0.027 / 0.0205 = -0.317, one emitting four +2.683
    decisions = []

    def run(emitted):
        drafts = gate.drafts()
        decisions.append(drafts)
        gate.observe(step(len(decisions), emitted if drafts else 1, *((2, 2) if drafts else (0, 0))))

    gate.drafts()
    gate.observe(step(0, 1))  # the prefill teaches nothing
    assert not gate.gains and gate.wait == 0
    for _ in range(19):
        run(1)  # one token per drafted step: never pays
    # four drafted steps before a verdict, then waits of 1, 2, 4 and 8 between probes
    assert decisions == [True] * 4 + [False, True] + [False] * 2 + [True] + [False] * 4 + [True] + [False] * 5
    assert (
        gate.skipped == decisions.count(False)
        and gate.wait == 8
        and list(gate.gains) == pytest.approx([-0.317] * 7, abs=1e-3)
    )
    for _ in range(3):
        run(1)  # the rest of the 8-step wait
    decisions.clear()
    for _ in range(6):
        run(4)  # the text got easy: one probe lifts the mean gain above 0 (7 × -0.317 + 2.683 > 0)
    assert decisions == [True] * 6 and gate.wait == 0
    gate.restart()
    assert (len(gate.gains), gate.skipped, gate.wait, gate.skip_left) == (0, 0, 0, 0)


def test_one_losing_step_among_paying_ones_is_noise_not_a_verdict():
    gate = DraftGate(COST, SkipConfig())
    for emitted in (3, 1, 3, 1, 1, 3, 1, 1):  # mean gain +0.43: drafting pays on average
        assert gate.drafts()
        gate.learn(emitted, 0.027)
    strict = DraftGate(COST, SkipConfig(window=4, confidence=0.0))  # the latest four, their mean alone
    for emitted in (3, 1, 1, 1, 1):  # (3, 1, 1, 1): 1.5 tokens a step against plain decoding's 1.317
        assert strict.drafts()
        strict.learn(emitted, 0.027)
    assert not strict.drafts()  # the latest four emitted one token each: the window's mean loses


def test_steps_that_drafted_nothing_teach_the_gate_nothing():
    gate = DraftGate(COST, SkipConfig())
    assert gate.drafts()
    gate.observe(step(1, 1, forwards=0, nodes=0))  # a drafter without target states yet
    assert not gate.gains and gate.drafts()


def test_the_first_cost_model_prices_the_gate_and_enabled_decides_when_there_is_none():
    other = CostModel([1.0])
    assert draft_gate(SkipConfig(), [None, COST, other]).cost is COST  # the default: on for a cost-aware stack
    assert draft_gate(SkipConfig(), [None]) is None
    assert draft_gate(SkipConfig(enabled=None), [None]) is None  # auto: a stack without a cost model never skips
    assert draft_gate(SkipConfig(enabled=False), [COST]) is None
    with pytest.raises(InputError, match="needs a cost-aware stack"):
        draft_gate(SkipConfig(enabled=True), [None])


# -- configuration ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        ("margin=0", "skip_drafting.margin must be a number in (0, 100]"),
        ("margin=-1.5", "skip_drafting.margin must be a number in (0, 100]"),
        ("window=0", "skip_drafting.window must be a whole number of drafted steps in 1..4096"),
        ("min_steps=40", "skip_drafting.min_steps=40 exceeds skip_drafting.window=32"),
        ("window=2.5", "skip_drafting.window"),
        ("confidence=-1", "skip_drafting.confidence must be a number in [0, 10]"),
        ("decay=0.25", "unknown option"),
        ("max_wait=0", "skip_drafting.max_wait must be a whole number of steps"),
        ("enabled=maybe", "enabled"),
        ("wait=3", "unknown option"),
    ],
)
def test_bad_skip_options_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=[f"generation.skip_drafting.{override}"], require_models=False)
    text = str(caught.value)
    assert message in text and "\n" not in text


def test_forcing_the_gate_on_a_stack_without_costs_is_refused_in_one_line():
    target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
    draft = ScriptedLM(VOCAB, seed=1, table=DRAFT_TABLE.clone())
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            "strategy.stop=[{name: fixed, gamma: 3}]",
            "generation.skip_drafting.enabled=true",
        ],
        require_models=False,
    )
    with pytest.raises(InputError, match="enabled=true needs a cost-aware stack") as caught:
        Engine.build(target, draft=draft, cfg=cfg)
    assert "\n" not in str(caught.value)


# -- greedy: every cost-aware stack, skipping forced, is the target's own decoding --------------------
AUTO = "{topk: 3, depth: 4, nodes: auto, profile: cpu-2core-smollm2-fp32}"


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(0, scale=3.0)


def greedy_engines(llama, folder, skip):
    """(name, engine) of each cost-aware stack on the tiny target, with random drafts."""
    make_draft(llama, folder / "eagle")
    make_block_draft(llama, folder / "dflash")
    yield "eagle-tree(auto)", engine_for(llama, folder / "eagle", tree=AUTO, extra=skip, eos=False)
    yield (
        "eagle-tree(auto)+pacer",
        engine_for(
            llama,
            folder / "eagle",
            tree=AUTO,
            eos=False,
            extra=[*skip, f"strategy.stop=[{PACER.replace('max_draft: 3', 'max_draft: 4')}]"],
        ),
    )
    yield "dflash-tree(auto)", block_engine(llama, folder / "dflash", tree=AUTO, extra=skip, eos=False)


@pytest.mark.parametrize("skip", [FORCED, ["generation.skip_drafting.enabled=null"]], ids=["forced", "auto"])
def test_cost_aware_stacks_skipping_drafting_equal_greedy_decoding(llama, tmp_path, skip):
    prompts = [[5, 9, 13, 7, 21], [3, 3, 40, 12]]
    references = [reference_greedy(llama, p, 24, eos=False) for p in prompts]
    skipped = 0
    for name, engine in greedy_engines(llama, tmp_path, skip):
        assert engine.gate is not None, name  # enabled null: on, since the stack declares a cost model
        for prompt, reference in zip(prompts, references):  # one engine, several prompts
            result = engine.generate(prompt, max_new_tokens=24)
            assert result.tokens == reference, name
            skipped += result.metrics["skipped_steps"]
    assert skipped > 0  # the random drafts never pay: the gate skips


def test_scripted_draft_model_trees_and_the_throughput_rule_skipping_equal_greedy_decoding():
    target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
    draft = ScriptedLM(VOCAB, seed=1, table=DRAFT_TABLE.clone())
    prompt = [5, 1, 6, 2]
    reference = plain_greedy(ScriptedLM(VOCAB, table=TARGET_TABLE.clone()), prompt, 30)
    for drafter, stop in ((f"draft_model, tree: {AUTO}", "{name: fixed, gamma: 3}"), ("draft_model", PACER)):
        for skip in (FORCED, ["generation.skip_drafting.enabled=false"]):
            cfg = load_config(
                overrides=[
                    f"strategy.drafter={{name: {drafter}}}",
                    f"strategy.stop=[{stop}]",
                    "sampling.temperature=0",
                    *skip,
                ],
                require_models=False,
            )
            result = Engine.build(target, draft=draft, cfg=cfg).generate(prompt, max_new_tokens=30)
            assert result.tokens == reference, (drafter, skip)
            assert (result.metrics.get("skipped_steps", 0) > 0) == (skip is FORCED)


# -- sampled: the target's exact distribution with the gate skipping ---------------------------------------
class ScheduledGate(DraftGate):
    """The real gate's bookkeeping with its decisions forced: skip the steps in ``skip`` (a function of
    the step number alone, known before the step)."""

    def __init__(self, cost, skip):
        super().__init__(cost, SkipConfig())
        self.schedule, self.step = skip, 0

    def restart(self):
        super().restart()
        self.step = 0

    def drafts(self):
        self._drafting = self.step not in self.schedule
        self.step += 1
        self.skipped += not self._drafting
        return self._drafting


def sampled_engine(skip):
    """A sampled draft_model chain with the throughput rule (a cost-aware stack), its gate forced:
    ``FORCED`` = the real gate at margin 100 (drafting never pays), else a ``ScheduledGate``."""
    target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
    draft = ScriptedLM(VOCAB, seed=1, table=DRAFT_TABLE.clone())
    engine = build_engine(target, draft, "draft_model", PACER, {"temperature": 1.0})
    cost = engine.pm.hook.pacer_step_costs()[0]  # the throughput rule's, declared through pacer_step_costs
    forced = SkipConfig(margin=100.0, min_steps=1)  # a verdict from the first drafted step
    engine.gate = DraftGate(cost, forced) if skip is FORCED else ScheduledGate(cost, skip)
    return target, engine


def skipping_share(engine, samples: int = 300) -> float:
    skipped = steps = 0
    for seed in range(samples):
        result = engine.generate(PROMPT, max_new_tokens=LENGTH, seed=seed)
        skipped += result.metrics["skipped_steps"]
        steps += result.metrics["target_forwards"]
    return skipped / steps


@pytest.mark.parametrize("skip", [FORCED, {0}, {1, 3}], ids=["margin", "prefill", "odd-steps"])
def test_sampled_decoding_with_the_gate_skipping_keeps_the_target_distribution(skip):
    with single_thread():
        target, engine = sampled_engine(skip)
        assert skipping_share(engine) > 0.05  # the gate does skip
        outputs, _ = sample_outputs(engine, PROMPT, 6_000)
        p_value = chisquare_pvalue(outputs, exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling))
    assert p_value > PASS_P


@attrs.define
class PeekConfig:
    pass


class SkipsAfterPeeking:
    """WRONG: decides after drafting, from the current step's draft: one token is drafted, and the
    step decodes plainly (``Stop(keep=0)``) unless the draft was confident in it."""

    def __init__(self, config, resources):
        pass

    @hookimpl
    def pacer_draft_more(self, state, draft):
        if len(draft) == 0:
            return 1
        return Stop() if float(draft.draft_probs[0, int(draft.tokens[0])]) >= 0.5 else Stop(keep=0)


class PeekPlugin:
    @hookimpl
    def pacer_components(self):
        return [Component("stop", "peek", PeekConfig, SkipsAfterPeeking)]


def test_deciding_from_the_current_steps_draft_fails_the_distribution_test():
    with single_thread():
        target = ScriptedLM(VOCAB, table=TARGET_TABLE.clone())
        draft = ScriptedLM(VOCAB, seed=1, table=DRAFT_TABLE.clone())
        engine = build_engine(
            target, draft, "draft_model", "{name: peek}", {"temperature": 1.0}, plugins=[PeekPlugin()]
        )
        outputs, _ = sample_outputs(engine, PROMPT, 2_000)
        p_value = chisquare_pvalue(outputs, exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling))
    assert p_value < 1e-6


# -- the decision comes before the draft, from earlier steps only ------------------------------------------
@attrs.define
class LogConfig:
    pass


class CallLog:
    """Records which hooks ran in each step, and each step's record."""

    def __init__(self, config, resources):
        self.calls: list[set[str]] = []
        self.records: list = []

    @hookimpl
    def pacer_start(self, state):
        self.calls, self.records = [set()], []

    @hookimpl
    def pacer_draft_more(self, state, draft):
        self.calls[-1].add("pacer_draft_more")

    @hookimpl
    def pacer_select_nodes(self, state, draft):
        self.calls[-1].add("pacer_select_nodes")

    @hookimpl
    def pacer_observe_step(self, state, step):
        self.records.append(step)
        self.calls.append(set())


class LogPlugin:
    def __init__(self):
        self.built: list[CallLog] = []

    @hookimpl
    def pacer_components(self):
        def build(config, resources):
            self.built.append(CallLog(config, resources))
            return self.built[-1]

        return [Component("observer", "call_log", LogConfig, build)]


def test_the_engines_decisions_are_replayed_from_earlier_steps_and_skipped_steps_call_no_draft_hook(llama, tmp_path):
    plugin = LogPlugin()
    make_draft(llama, tmp_path / "eagle")
    cfg = load_config(
        overrides=[
            f"strategy.drafter={{name: eagle, path: '{tmp_path / 'eagle'}', tree: {AUTO}}}",
            "strategy.stop=[{name: fixed, gamma: 3}]",
            "strategy.observers=[{name: call_log}]",
            "generation.ignore_eos=true",
            "generation.skip_drafting.enabled=null",
        ],
        extra_plugins=[plugin],
        require_models=False,
    )
    engine = Engine.build(adapter(llama, eos=False), cfg=cfg, extra_plugins=[plugin])
    log = plugin.built[0]
    result = engine.generate([5, 9, 13, 7, 21], max_new_tokens=40)
    assert result.metrics["skipped_steps"] > 0
    replay = DraftGate(engine.gate.cost, engine.gate.config)  # a fresh gate sees step i only after deciding i
    skipped = 0
    for calls, record in zip(log.calls, log.records):
        drafted = replay.drafts()
        assert drafted == ("pacer_draft_more" in calls), record.index
        if not drafted:  # no stop policy asked, nothing proposed, no node chosen: a plain step
            skipped += 1
            assert not calls and record.draft.num_nodes == 0 and record.draft_forwards == 0
        replay.observe(record)
    assert skipped == result.metrics["skipped_steps"]


def test_the_pacer_stop_prices_a_skipped_step_as_a_plain_one():
    from pacer_plugins.pacer_stop.policy import PacerStop, PacerStopConfig

    predictor = types.SimpleNamespace(reset=lambda: None)  # never consulted here
    policy = PacerStop(PacerStopConfig(rule="throughput", b=1, max_draft=3), predictor, cost=COST)
    policy.start_generation(greedy=True)
    policy.drafted = 3  # the last drafted step drafted 3 tokens
    policy.observe_outcome(sent=3, accepted=1, emitted=2)
    seconds = policy.rate.seconds
    policy.observe_outcome(sent=0, accepted=0, emitted=1)  # a step the gate decoded plainly
    decay = policy.config.rate_decay
    assert policy.rate.seconds == pytest.approx(seconds + decay * (COST.step(0, sent=0) - seconds))
    assert policy.pacer_step_costs() is COST
    assert PacerStop(PacerStopConfig(), predictor=None).pacer_step_costs() is None  # the paper rule has none


def test_the_drafters_declare_their_auto_budgets_cost_model(llama, tmp_path):
    make_draft(llama, tmp_path / "eagle")
    on = ["generation.skip_drafting.enabled=null"]  # on where a component declares a cost model (the default)
    off = ["generation.skip_drafting.enabled=false"]
    assert engine_for(llama, tmp_path / "eagle", tree=AUTO, extra=off).gate is None
    assert engine_for(llama, tmp_path / "eagle", tree=AUTO).gate is not None  # on by default
    auto = engine_for(llama, tmp_path / "eagle", tree=AUTO, extra=on)
    fixed = engine_for(llama, tmp_path / "eagle", tree="{topk: 3, depth: 4, nodes: 8}", extra=on)
    profile = load_profile("cpu-2core-smollm2-fp32")
    assert auto.gate is not None and auto.gate.cost == profile.cost_model("feature")
    assert auto.gate.plain_seconds == pytest.approx(profile.plain_step())
    assert fixed.gate is None  # a fixed budget prices nothing: speculative decoding as before
    both = engine_for(llama, tmp_path / "eagle", tree=AUTO, extra=[*on, f"strategy.stop=[{PACER}]"])
    assert both.gate.cost == auto.gate.cost  # the drafter's, the first in the stack (not the stop's inline one)
