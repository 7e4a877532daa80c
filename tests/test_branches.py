"""The multi-branch target pass: draft + candidate branches scored in one forward with a tree mask.

First the model adapter alone: one forward over [pending, draft, branch_1, branch_2, ...] with the
engine's positions and tree mask (``engine._branch_layout``) must give the logits of separate plain
forwards, one per branch. Then the engine with a test drafter (registered through
``extra_plugins``) that drafts from the target's known greedy output with scheduled mistakes and
attaches right and wrong branches: the output must stay equal to ``generate``, the verdicts must
be the scheduled ones (longest matching branch, first on ties, none after a rejected draft), and
the target cache must hold the committed prefix with 1 + accepted branch tokens pending.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from pacer_core import Component, DraftBlock, Engine, hookimpl, load_config
from pacer_core.engine import _branch_layout
from helpers import VOCAB, adapter, reference_greedy, tiny_llama

BUDGET = 30
GAMMA = 3
PROMPTS = {"plain": [5, 9, 13, 7, 22], "one_token": [17], "repetitive": [5, 9, 13, 5, 9, 13, 5, 9]}


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(0)


def plain_logits(model, prefix: list[int], tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and last hidden states of ``tokens`` after ``prefix``, one causal forward, fresh cache."""
    lm = adapter(model, eos=False)
    if prefix:
        lm.forward(prefix, logits_from=len(prefix))
    out = lm.forward(tokens, hidden=True)
    return out.logits, out.hidden_states


@pytest.mark.parametrize("prefix, pending", [
    pytest.param([], [17], id="empty-cache"),
    pytest.param([5, 9, 13, 7], [22], id="one-pending"),
    pytest.param([5, 9, 13], [7, 22, 40], id="three-pending"),
])
def test_tree_forward_matches_separate_forwards(target_model, prefix, pending):
    draft = [3, 4, 5]
    branches = [[10, 11, 12], [20, 21], [30]]
    positions, tree_mask = _branch_layout(len(pending), len(draft), [torch.tensor(b) for b in branches])
    lm = adapter(target_model, eos=False)
    if prefix:
        lm.forward(prefix, logits_from=len(prefix))
    feed = pending + draft + [t for b in branches for t in b]
    out = lm.forward(feed, positions=positions, tree_mask=tree_mask, hidden=True)  # [k, vocab]
    main = len(pending) + len(draft)
    logits, hidden = plain_logits(target_model, prefix, pending + draft)
    assert torch.allclose(out.logits[:main], logits, atol=1e-5)
    assert torch.allclose(out.hidden_states[:main], hidden, atol=1e-5)
    start = main
    for branch in branches:
        logits, hidden = plain_logits(target_model, prefix, pending + draft + branch)
        rows = slice(start, start + len(branch))
        assert torch.allclose(out.logits[rows], logits[main:], atol=1e-5)
        assert torch.allclose(out.hidden_states[rows], hidden[main:], atol=1e-5)
        start += len(branch)
    # the committed part of the cache is intact once the branches are cropped away
    lm.crop(len(prefix) + main)
    assert list(lm.cached_tokens) == prefix + pending + draft
    after = lm.forward([8, 9]).logits
    assert torch.allclose(after, plain_logits(target_model, prefix, pending + draft + [8, 9])[0][main:], atol=1e-5)


# -- the engine with a branch-attaching test drafter -----------------------------------------

SCHEDULE = ("longest_wins", "tie_first_wins", "draft_rejected", "all_branches_wrong", "one_token_branch")


def wrong(token: int, shift: int = 1) -> int:
    return (token + shift) % VOCAB


class BranchDrafter:
    """Drafts the target's greedy continuation (known in advance) with scheduled mistakes and
    attaches candidate branches; logs the verdict each step must get."""

    def __init__(self, sequence: list[int]):
        self.sequence = sequence  # prompt + the target's greedy continuation, longer than the budget
        self.expected: dict[int, tuple[int, int | None, int]] = {}  # step → (accepted, branch, branch_accepted)

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens):
        start = len(state.tokens) + len(draft)
        tokens = self.sequence[start: start + num_tokens]
        after = self.sequence[start + len(tokens):]  # what the target says after a correct draft
        kind = SCHEDULE[state.step_index % len(SCHEDULE)]
        if kind == "longest_wins":
            branches = [[wrong(after[0])] + after[1:3], after[:3], after[:2] + [wrong(after[2])]]
            expected = (len(tokens), 1, 3)
        elif kind == "tie_first_wins":
            branches = [after[:2] + [wrong(after[2])], after[:2] + [wrong(after[2], 2), after[3]]]
            expected = (len(tokens), 0, 2)
        elif kind == "draft_rejected":
            tokens = tokens[:-1] + [wrong(tokens[-1])]
            branches = [after[:3], after[:1]]  # would match, but the draft is not fully accepted
            expected = (len(tokens) - 1, None, 0)
        elif kind == "all_branches_wrong":
            branches = [[wrong(after[0])] + after[1:2], [wrong(after[0], 2)]]
            expected = (len(tokens), None, 0)
        else:
            branches = [after[:1]]
            expected = (len(tokens), 0, 1)
        self.expected[state.step_index] = expected
        return DraftBlock(tokens=torch.tensor(tokens, dtype=torch.long),
                          branches=tuple(torch.tensor(b, dtype=torch.long) for b in branches))


class BranchInvariants:
    """Observer: the verdict is the scheduled one, the emitted tokens are draft + branch + next,
    and the target cache holds the committed prefix with 1 + accepted branch tokens pending."""

    def __init__(self, resources, drafter: BranchDrafter):
        self.target, self.drafter = resources.target, drafter
        self.records = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.records = []

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self.records.append(step)
        verdict = step.verdict
        assert (verdict.accepted, verdict.branch, verdict.branch_accepted) == self.drafter.expected[step.index]
        branch = [] if verdict.branch is None else step.draft.branches[verdict.branch][: verdict.branch_accepted].tolist()
        untruncated = step.draft.tokens[: verdict.accepted].tolist() + branch + [verdict.next_token]
        assert list(step.emitted) == untruncated[: len(step.emitted)]
        assert list(step.emitted) == state.tokens[step.committed_before:]
        cached = list(self.target.cached_tokens)
        assert cached == state.tokens[: len(cached)]
        assert len(cached) == min(step.committed_before + verdict.accepted, len(state.tokens))
        if state.budget_left > 0:
            assert len(state.tokens) - len(cached) == 1 + verdict.branch_accepted


@attrs.define
class NoOptions:
    pass


class BranchPlugin:
    """An extra plugin offering the ``branch_script`` drafter and the ``branch_invariants`` observer."""

    def __init__(self, sequence: list[int]):
        self.drafter = BranchDrafter(sequence)
        self.observer = None

    @hookimpl
    def pacer_components(self):
        return [
            Component("drafter", "branch_script", NoOptions, lambda config, resources: self.drafter),
            Component("observer", "branch_invariants", NoOptions, self._observer),
        ]

    def _observer(self, config, resources):
        self.observer = BranchInvariants(resources, self.drafter)
        return self.observer


@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_engine_with_branches_equals_generate(target_model, prompt_name, verifier):
    prompt = PROMPTS[prompt_name]
    reference = reference_greedy(target_model, prompt, BUDGET + 16, eos=False)
    plugin = BranchPlugin(prompt + reference)
    cfg = load_config(overrides=[
        "strategy.drafter={name: branch_script}",
        f"strategy.stop=[{{name: fixed, gamma: {GAMMA}}}]",
        f"strategy.verifier={{name: {verifier}}}",
        "strategy.observers=[{name: metrics}, {name: branch_invariants}]",
    ], extra_plugins=[plugin], require_models=False)
    engine = Engine.build(adapter(target_model, eos=False), cfg=cfg, extra_plugins=[plugin])
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == reference[:BUDGET]
    records = plugin.observer.records
    won = [r for r in records if r.verdict.branch is not None]
    assert won and sum(r.verdict.branch_accepted for r in won) >= len(won)  # branch tokens accepted
    assert any(r.verdict.branch is None and r.draft.branches for r in records)  # and branches refused
    m = result.metrics
    assert m["emitted"] == len(result.tokens) == sum(len(r.emitted) for r in records)
    assert m["mean_accepted_length"] == pytest.approx(BUDGET / m["steps"])
    assert m["target_forwards"] == m["steps"] + (1 if len(prompt) > 1 else 0)
    # branches make steps emit more than γ + 1 tokens
    assert max(len(r.emitted) for r in records) > GAMMA + 1


class HiddenRows:
    """Observer needing the target's hidden states: checks each step's rows against a plain forward."""

    def __init__(self, resources, model):
        self.target, self.model = resources.target, model
        self.checked = 0

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        cached = len(self.target.cached_tokens)
        rows = step.target_hidden  # [k, hidden]
        assert rows.shape[0] == cached - step.target_hidden_start  # the committed tokens just computed
        with torch.no_grad():
            out = self.model(torch.tensor([state.tokens[:cached]]), output_hidden_states=True)
        expected = out.hidden_states[-1][0, step.target_hidden_start: cached]
        assert torch.allclose(rows.float(), expected, atol=1e-5)
        self.checked += 1


def test_target_hidden_rows_follow_the_committed_tokens_with_branches(target_model):
    prompt = PROMPTS["plain"]
    reference = reference_greedy(target_model, prompt, BUDGET + 16, eos=False)
    plugin = BranchPlugin(prompt + reference)
    hidden_rows = []

    class HiddenPlugin:
        @hookimpl
        def pacer_components(self):
            def factory(config, resources):
                hidden_rows.append(HiddenRows(resources, target_model))
                return hidden_rows[-1]
            return [Component("observer", "hidden_rows", NoOptions, factory, needs={"target_hidden"})]

    extra = [plugin, HiddenPlugin()]
    cfg = load_config(overrides=[
        "strategy.drafter={name: branch_script}",
        f"strategy.stop=[{{name: fixed, gamma: {GAMMA}}}]",
        "strategy.verifier={name: greedy}",
        "strategy.observers=[{name: branch_invariants}, {name: hidden_rows}]",
    ], extra_plugins=extra, require_models=False)
    engine = Engine.build(adapter(target_model, eos=False), cfg=cfg, extra_plugins=extra)
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == reference[:BUDGET]
    assert hidden_rows[0].checked == len(plugin.observer.records)
