"""The ``hybrid`` drafter: several sources merged into one token tree, lossless in greedy and sampling.

Merge rule unit tests on ``pacer_core.trees.merge_phrases``; greedy equality with plain decoding on
scripted models (model member as a chain and as a tree, model-free members beside it, every stop ×
both verifiers); the exact-distribution chi-square test under sampling, and a deliberately wrong
hybrid (it tells the verifier its lookup tokens were drawn from the draft's distribution) that the
same test rejects; config refusals in one line.
"""

from __future__ import annotations

import pytest
import torch

from pacer_core import ConfigError, Engine, InputError, load_config
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs
from pacer_core.trees import merge_phrases

from helpers import (
    DRAFT_TABLE,
    LENGTH,
    PASS_P,
    PROMPT,
    SAMPLINGS,
    TARGET_TABLE,
    build_engine,
    lie_about_merged_nodes,
    sample_outputs,
)
from helpers import SCRIPTED_VOCAB as VOCAB

LOOKUP = "{name: prompt_lookup}"
MEMBERS = {
    "chain": f"[{{name: draft_model}}, {LOOKUP}]",
    "tree": f"[{{name: draft_model, tree: {{topk: 2, depth: 3, nodes: 6}}}}, {LOOKUP}]",
    "branches": "[{name: draft_model}, {name: prompt_lookup, branches: 3}]",
}


def hybrid(members: str, **options) -> str:
    extra = "".join(f", {k}: {v}" for k, v in options.items())
    return f"hybrid, members: {members}{extra}"


# -- the merge rule ------------------------------------------------------------------------------


def test_merge_reuses_shared_prefixes_and_existing_nodes():
    # existing tree: root -> 5 (node 0) -> 6 (node 1); root -> 7 (node 2)
    tokens, parents = [5, 6, 7], [-1, 0, -1]
    new, new_parents, paths = merge_phrases(tokens, parents, [[5, 6, 8], [5, 9], [7, 1, 2]], first=3, budget=10)
    assert new == [8, 9, 1, 2]
    assert new_parents == [1, 0, 2, 5]
    assert paths == [[0, 1, 3], [0, 4], [2, 5, 6]]


def test_merge_dedups_phrases_among_themselves_and_respects_the_budget():
    new, new_parents, paths = merge_phrases([], [], [[1, 2, 3], [1, 2, 4], [5, 6]], first=0, budget=4)
    assert new == [1, 2, 3, 4]  # [5, 6] does not fit
    assert new_parents == [-1, 0, 1, 1]
    assert paths == [[0, 1, 2], [0, 1, 3], []]


def test_merge_under_a_given_parent():
    new, new_parents, _ = merge_phrases([4], [-1], [[4, 4]], first=1, budget=5, parent=0)
    assert new == [4, 4] and new_parents == [0, 1]  # under node 0, not the root: nothing to reuse


# -- greedy equality -----------------------------------------------------------------------------


def scripted_pair():
    return ScriptedLM(VOCAB, table=TARGET_TABLE), ScriptedLM(VOCAB, table=DRAFT_TABLE)


def greedy_reference(target, prompt, budget):
    engine = build_engine(target, None, "autoregressive", "", {"temperature": 0.0}, verifier="greedy")
    return engine.generate(prompt, max_new_tokens=budget).tokens


PROMPTS = [PROMPT, [3, 5, 7], [6]]


@pytest.mark.parametrize("members", sorted(MEMBERS))
@pytest.mark.parametrize("stop", ["{name: fixed, gamma: 3}", "{name: heuristic, gamma: 2}", "{name: entropy}"])
@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
def test_hybrid_greedy_equals_plain_decoding(members, stop, verifier):  # temperature 0: both verify greedily
    target, draft = scripted_pair()
    engine = build_engine(target, draft, hybrid(MEMBERS[members]), stop, {"temperature": 0.0}, verifier=verifier)
    for prompt in PROMPTS:
        for budget in (1, 7, 24):
            result = engine.generate(prompt, max_new_tokens=budget)
            assert result.tokens == greedy_reference(target, prompt, budget)
            counted = sum(v for k, v in result.metrics.items() if k.startswith("hybrid_accepted_"))
            assert counted == result.metrics.get("accepted", counted)


def test_lookup_tokens_are_accepted_through_the_tree_and_counted():
    target, draft = scripted_pair()
    cfg = load_config(
        overrides=[
            f"strategy.drafter={{name: {hybrid(MEMBERS['chain'])}}}",
            "strategy.stop=[{name: fixed, gamma: 1}]",
            "strategy.verifier={name: greedy}",
            "generation.ignore_eos=true",
        ],
        require_models=False,
    )
    engine = Engine.build(target, draft=draft, cfg=cfg)  # with the metrics observer
    result = engine.generate(PROMPT, max_new_tokens=40)
    assert result.tokens == greedy_reference(target, PROMPT, 40)
    assert result.metrics["hybrid_accepted_prompt_lookup"] > 0  # the repetitive prompt: lookup wins steps
    assert result.metrics["hybrid_accepted_draft_model"] >= 0
    assert result.metrics["mean_nodes_per_step"] > result.metrics["mean_draft_length"]  # a real tree


# -- exact distribution --------------------------------------------------------------------------

SAMPLES = 3000  # the default cases; the slow grid takes 6000


def _pvalue(engine, samples: int = SAMPLES) -> float:
    target = ScriptedLM(VOCAB, table=TARGET_TABLE)
    samples, _ = sample_outputs(engine, PROMPT, samples)
    return chisquare_pvalue(samples, exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling))


@pytest.mark.parametrize(
    "members, sampling",
    [
        ("chain", "t1"),
        ("tree", "topk3"),
        pytest.param("chain", "topk3", marks=pytest.mark.slow),
        pytest.param("tree", "t1", marks=pytest.mark.slow),
        pytest.param("branches", "t0.6", marks=pytest.mark.slow),
        pytest.param("tree", "topp0.8", marks=pytest.mark.slow),
    ],
)
def test_hybrid_sampling_has_the_target_distribution(request, members, sampling):
    target, draft = scripted_pair()
    engine = build_engine(target, draft, hybrid(MEMBERS[members]), "{name: fixed, gamma: 2}", SAMPLINGS[sampling])
    slow = request.node.get_closest_marker("slow") is not None
    assert _pvalue(engine, 2 * SAMPLES if slow else SAMPLES) > PASS_P


def test_a_hybrid_lying_about_its_lookup_tokens_is_rejected():
    target, draft = scripted_pair()
    engine = build_engine(target, draft, hybrid(MEMBERS["chain"]), "{name: fixed, gamma: 2}", SAMPLINGS["t1"])
    lie_about_merged_nodes(engine)  # its lookup side nodes claimed drawn from the draft's distribution
    assert _pvalue(engine, 1500) < PASS_P


# -- config ----------------------------------------------------------------------------------------


def _error(overrides) -> str:
    with pytest.raises((ConfigError, InputError)) as info:
        target, draft = scripted_pair()
        cfg = load_config(overrides=overrides, require_models=False)
        Engine.build(target, draft=draft, cfg=cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_config_refusals_name_the_problem():
    assert "members must be a non-empty list" in _error(["strategy.drafter={name: hybrid}"])
    assert "strategy.drafter.members[1]: unknown drafter 'nope'" in _error(
        ["strategy.drafter={name: hybrid, members: [{name: prompt_lookup}, {name: nope}]}"]
    )
    assert "unknown option" in _error(["strategy.drafter={name: hybrid, members: [{name: prompt_lookup, gama: 2}]}"])
    assert "at most one member may use the draft model" in _error(
        ["strategy.drafter={name: hybrid, members: [{name: draft_model}, {name: draft_model}]}"]
    )


def test_a_nested_hybrid_is_refused_before_models_load():
    message = _error(
        [
            "strategy.drafter={name: hybrid, members: [{name: draft_model}, "
            "{name: hybrid, members: [{name: prompt_lookup}]}]}"
        ]
    )
    assert message == (
        "strategy.drafter.members[1]: a 'hybrid' cannot be a member of another: list its members in the outer one"
    )


def test_a_stop_policy_reading_draft_probs_needs_a_model_member():
    message = _error(
        [
            "strategy.drafter={name: hybrid, members: [{name: prompt_lookup}, {name: prompt_lookup, branches: 2}]}",
            "strategy.stop=[{name: entropy}]",
        ]
    )
    assert "strategy.stop[0]" in message and "draft" in message


@pytest.mark.parametrize("stop", ["{name: fixed, gamma: 3}", "{name: entropy}"])
def test_member_order_changes_nothing(stop):
    """The model member gives the main path wherever it stands, and nodes are sent by value, so the
    two orders decode the same steps (the stop reading draft probabilities works in either)."""
    runs = []
    for members in (
        f"[{{name: draft_model, tree: {{topk: 2, depth: 3}}}}, {LOOKUP}]",
        f"[{LOOKUP}, {{name: draft_model, tree: {{topk: 2, depth: 3}}}}]",
    ):
        target, draft = scripted_pair()
        cfg = load_config(
            overrides=[
                f"strategy.drafter={{name: {hybrid(members, nodes=6)}}}",
                f"strategy.stop=[{stop}]",
                "strategy.verifier={name: greedy}",
                "generation.ignore_eos=true",
            ],
            require_models=False,
        )
        engine = Engine.build(target, draft=draft, cfg=cfg)
        results = [engine.generate(prompt, max_new_tokens=24) for prompt in PROMPTS]
        for prompt, result in zip(PROMPTS, results):
            assert result.tokens == greedy_reference(target, prompt, 24)
        runs.append(
            [
                (r.metrics["accept_lengths"], r.metrics["nodes_per_step"], r.metrics["hybrid_accepted_prompt_lookup"])
                for r in results
            ]
        )
    assert runs[0] == runs[1]


def test_phrase_nodes_are_ranked_by_their_members_learned_rate():
    """A member whose phrases were always accepted outranks unlikely model nodes under the budget;
    one whose phrases always failed is left out first."""
    from pacer_core import Draft, DraftBlock, SideNodes

    target, draft = scripted_pair()
    cfg = load_config(
        overrides=[
            f"strategy.drafter={{name: {hybrid(MEMBERS['chain'], nodes=2)}}}",
            "strategy.stop=[{name: fixed, gamma: 2}]",
            "strategy.verifier={name: greedy}",
        ],
        require_models=False,
    )
    engine = Engine.build(target, draft=draft, cfg=cfg)
    plugin = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "Hybrid")
    probs = torch.zeros(2, VOCAB)
    probs[0, 1], probs[1, 2] = 0.3, 0.3  # the model's chain 1 -> 2, cumulative 0.3 and 0.09
    block = DraftBlock(
        tokens=torch.tensor([1, 2]),
        draft_probs=probs,
        side=SideNodes(torch.tensor([5]), torch.tensor([-1]), torch.zeros(1, VOCAB), sampled=False),
    )
    plugin._sources = {(5,): "prompt_lookup"}
    plugin.trials = {("prompt_lookup", 1): [50, 50]}  # lookup's first tokens: always accepted so far
    assert plugin.pacer_select_nodes(state=None, draft=Draft((block,))) == [0, 2]  # 1 (0.3) and 5 (~0.98)
    plugin.trials = {("prompt_lookup", 1): [0, 50]}
    assert plugin.pacer_select_nodes(state=None, draft=Draft((block,))) == [0, 1]  # the model's 1 -> 2


def test_the_cost_kind_is_the_drafters_declaration_and_a_hybrids_is_its_main_members():
    """How profiles price draft forwards is declared once, on the drafter's Component; a hybrid is
    priced as its main member; a kind no profile knows is refused when the component is made."""
    from pacer_core import Component, load_config
    from pacer_core.config import plan_run

    def kind(strategy: str):
        cfg = load_config(overrides=[f"strategy.drafter={strategy}"], require_models=False)
        return plan_run(cfg, require_models=False).stack.drafter.cost_kind

    assert kind("{name: eagle}") == "feature"
    assert kind("{name: draft_model}") == "token"
    assert kind("{name: dflash}") == kind("{name: pard}") == "block"
    assert kind("{name: prompt_lookup}") is None
    assert kind("{name: hybrid, members: [{name: prompt_lookup}, {name: dflash}]}") == "block"
    assert kind("{name: hybrid, members: [{name: eagle}, {name: prompt_lookup}]}") == "feature"
    with pytest.raises(ValueError, match="cost_kind"):
        Component("drafter", "x", object, object, cost_kind="gpu")


def test_members_are_read_only_through_what_they_declare():
    """The hybrid calls its members' hooks as the engine calls a component's (a plugin manager of
    their own: each gets the arguments it declares, a misspelled hook is refused, not silently never
    called) and sizes its tree by the main member's declared ``DraftInfo.tree``, never by reading a
    member's config."""
    import types

    import attrs

    from pacer_core import Component, DraftInfo, hookimpl
    from pacer_core.errors import UnknownHookError

    target, draft = scripted_pair()
    members = "[{name: draft_model, tree: {topk: 2, depth: 3, nodes: 5}}, {name: prompt_lookup}]"
    engine = build_engine(target, draft, hybrid(members), "{name: fixed, gamma: 2}", {"temperature": 0.0})
    plugin = next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.drafter"))
    assert DraftInfo.of(plugin.members[0]).tree.nodes == 5 and plugin.budget.nodes == 5
    assert DraftInfo.of(plugin.members[1]).tree is None
    assert engine.generate(PROMPT, max_new_tokens=6).tokens == greedy_reference(target, PROMPT, 6)

    @attrs.define
    class NoOptions:
        pass

    class Misspelled:
        def __init__(self, config, resources):
            pass

        @hookimpl
        def pacer_propse(self, state, draft, num_tokens):  # a typo of pacer_propose
            return None

    module = types.ModuleType("misspelled_member")
    module.pacer_components = hookimpl(lambda: [Component("drafter", "misspelled", NoOptions, Misspelled)])
    with pytest.raises(UnknownHookError, match="pacer_propse.*did you mean 'pacer_propose'"):
        build_engine(
            target,
            draft,
            hybrid("[{name: draft_model}, {name: misspelled}]"),
            "{name: fixed, gamma: 2}",
            {"temperature": 0.0},
            plugins=[module],
        )
