"""The ``draft_quality`` observer (the draft's top-k agreement with the target per draft position)
and the bench report's "Draft quality" section.

The observer's tallies are checked against a recomputation from the committed text (the target's
plain greedy decoding), not from the verifier's rows, on a chain and on a token tree (where the
main path's rows are spread through the tree); a deliberately wrong row (the target's token one
position late) would not match.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from pacer_bench.report import quality_markdown
from pacer_bench.results import draft_topk
from pacer_core import Component, Engine, hookimpl, load_config
from pacer_core.testing import ScriptedLM
from pacer_plugins.pacer_builtins.observers import DraftQualityConfig, topk_hits

from helpers import DRAFT_TABLE, SCRIPTED_VOCAB, TARGET_TABLE, error_of, plain_greedy

KS = (1, 2, 3)
BUDGET = 30
PROMPT = [5, 1, 6, 2]


def scripted(table: torch.Tensor, seed: int = 0) -> ScriptedLM:
    return ScriptedLM(SCRIPTED_VOCAB, seed, order=2, table=table.clone())


@attrs.define
class NoOptions:
    pass


class Steps(list):
    """An observer keeping every step record."""

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self.append(step)


class Recorder:
    """The plugin offering the ``recorder`` observer; ``steps`` is the one it built."""

    def __init__(self):
        self.steps = Steps()

    @hookimpl
    def pacer_components(self):
        return [Component("observer", "recorder", NoOptions, lambda config, resources: self.steps, "test: keeps steps")]


def test_topk_hits_ranks_the_targets_token_and_ties_go_to_it():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2]])
    hits = topk_hits(probs, torch.tensor([1, 1, 1]), torch.tensor([1, 2]))
    assert hits.tolist() == [[False, True], [True, True], [True, True]]
    assert topk_hits(probs, torch.tensor([2, 0, 2]), torch.tensor([1, 3])).tolist() == [[False, True]] * 3


@pytest.mark.parametrize(
    "drafter",
    ["{name: draft_model}", "{name: draft_model, tree: {topk: 3, depth: 4, nodes: 8}}"],
    ids=["chain", "tree"],
)
def test_the_tallies_are_the_rank_of_the_committed_token_at_each_accepted_prefix(drafter):
    target, draft = scripted(TARGET_TABLE), scripted(DRAFT_TABLE, seed=1)
    recorder = Recorder()
    cfg = load_config(
        overrides=[
            f"strategy.drafter={drafter}",
            "strategy.stop=[{name: fixed, gamma: 3}]",
            "strategy.verifier={name: greedy}",
            "strategy.observers=[{name: metrics}, "
            f"{{name: recorder}}, {{name: draft_quality, ks: {list(KS)}, depth: 3}}]",
        ],
        extra_plugins=[recorder],
        require_models=False,
    )
    engine = Engine.build(target, draft=draft, cfg=cfg, extra_plugins=[recorder])
    prompt = PROMPT
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    text = list(prompt) + plain_greedy(scripted(TARGET_TABLE), prompt, BUDGET + 8)

    def recount(late: int = 0) -> torch.Tensor:
        """The tallies from the committed text; ``late`` shifts the target's token (a wrong row)."""
        counts = torch.zeros(3, 1 + len(KS), dtype=torch.long)
        for step in recorder.steps:
            d = step.draft
            for j in range(min(step.main_accepted + 1, len(d), 3) if len(d) else 0):
                truth = text[step.committed_before + j + late]  # the target's token after the draft's first j
                rank = int((d.draft_probs[j] > d.draft_probs[j, truth]).sum())
                counts[j] += torch.tensor([1, *(rank < k for k in KS)])
        return counts

    expected = recount()
    assert result.metrics["draft_topk"] == {"k": list(KS), "counts": expected.tolist()}
    assert not torch.equal(recount(late=1), expected)  # the check tells a row one position late apart
    # later positions, hits and misses
    assert expected[1:, 0].sum() > 0 and 0 < expected[:, 1].sum() < expected[:, 0].sum()
    # greedy: the draft's token at a position is its top 1, so top-1 agreement is acceptance
    steps = [s for s in recorder.steps if len(s.draft)]
    assert int(expected[0, 1]) == sum(s.main_accepted >= 1 for s in steps)


def test_a_drafter_without_draft_probs_and_bad_ks_are_refused():
    assert "which drafter 'prompt_lookup' does not provide" in error_of(
        overrides=["strategy.drafter={name: prompt_lookup}", "strategy.observers=[{name: draft_quality}]"]
    )
    with pytest.raises(ValueError, match="increasing positive integers"):
        DraftQualityConfig(ks=[4, 2])


def test_the_report_sums_the_tallies_and_shows_the_first_positions():
    records = [
        {"metrics": {"draft_topk": {"k": [1, 4], "counts": [[10, 4, 8], [4, 1, 3]]}}},
        {"metrics": {"draft_topk": {"k": [1, 4], "counts": [[10, 6, 9], [6, 2, 5], [2, 1, 2]]}}},
        {"metrics": {"accepted": 3}},
    ]  # a record of a stack without the observer
    quality = draft_topk(records)
    assert quality == {"k": [1, 4], "judged": [20, 10, 2], "agreement": [[0.5, 0.85], [0.3, 0.8], [0.5, 1.0]]}
    assert draft_topk([{"metrics": {}}]) is None
    with pytest.raises(ValueError, match="different ks"):
        draft_topk([records[0], {"metrics": {"draft_topk": {"k": [1, 2], "counts": [[1, 1, 1]]}}}])
    lines = quality_markdown(
        {
            "prompt_sets": ["gsm8k"],
            "table": {
                "gsm8k": {"plain": {"draft_topk": None}, "eagle": {"draft_topk": quality}},
                "all": {"eagle": {"draft_topk": quality}},
            },
        }
    )
    assert "| gsm8k | eagle | 0.50 / 0.85 (20) | 0.30 / 0.80 (10) | 0.50 / 1.00 (2) |" in lines
    assert lines[0] == "## Draft quality" and not any("plain" in line for line in lines)
