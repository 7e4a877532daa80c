"""Ouroboros phrase drafting (plugins/ouroboros): the pool, the draft model's tree forward, and
greedy decoding through the engine.

- The phrase pool: key lookup, per-key capacity, least-recently-used eviction, replacement of a
  corrected phrase, the JSON warm-start round trip, and the target's argmax chains.
- The draft forward's layout (main tokens + lookahead window + guess phrases, one tree-masked
  pass) gives the logits of separate plain forwards, one per window column and per phrase.
- Decoding: ouroboros × every installed stop policy (fixed, heuristic, and entropy / pacer when
  their plugins are installed) on tiny seeded Llamas equals the target's own greedy decoding, on
  prompts with heavy repetition (pool hits: multi-token draft forwards and accepted candidate
  suffixes are asserted) and without. Candidate suffixes are side nodes of the draft tree, a trie
  hanging off each block's last token; the verifier may accept a path through a suffix hanging
  off any accepted main-path node (asserted with one-token blocks). An observer checks after
  every step: the KV caches of both models hold committed prefixes, the draft's main path is the
  draft model's own greedy chain with its hidden states and probabilities, the side nodes are
  tries of whole pool phrases, and ``StepRecord.target_argmax`` agrees with the verdict.
- The pool's learning from a crafted tree step (corrected suffixes, argmax chains).
- Many short runs on scripted models (``pacer_core.testing.ScriptedLM``) for breadth.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import attrs
import pytest
import torch

from pacer_core import (
    Component,
    ConfigError,
    DecodeState,
    Draft,
    DraftBlock,
    Engine,
    InputError,
    Resources,
    SamplingParams,
    SideNodes,
    StepRecord,
    Stop,
    Verdict,
    hookimpl,
    load_config,
)
from pacer_core.registry import components, new_plugin_manager
from pacer_core.testing import ScriptedLM, random_table
from pacer_plugins.ouroboros.plugin import Ouroboros, OuroborosConfig, lookahead_layout
from pacer_plugins.ouroboros.pool import PhrasePool, argmax_chains

from helpers import EOS, adapter, perturbed, reference_greedy, tiny_llama, with_eos_bias

BUDGET = 30
PROMPTS = {
    "plain": [5, 9, 13, 7, 22],
    "one_token": [17],
    "repetitive": [5, 9, 13, 40, 5, 9, 13, 40, 5, 9, 13, 40, 5, 9, 13, 40, 5, 9],
}
DRAFTER = "{name: ouroboros, window_size: 4, level: 4, guess_set_size: 6, topk: 3}"


# -- the phrase pool -----------------------------------------------------------------------------
def test_pool_lookup_is_by_key_and_newest_first():
    pool = PhrasePool(phrase_length=2, capacity=4)
    pool.add(7, (1, 2))
    pool.add(7, [3, 4])
    pool.add(8, (5, 6))
    assert pool.get(7) == [(3, 4), (1, 2)]
    assert pool.get(7, limit=1) == [(3, 4)]
    assert pool.get(8) == [(5, 6)]
    assert pool.get(9) == [] and 9 not in pool and 7 in pool
    assert len(pool) == 3 and sorted(pool.keys()) == [7, 8]


def test_pool_evicts_the_least_recently_used_phrase_per_key():
    pool = PhrasePool(phrase_length=1, capacity=3)
    for phrase in [(1,), (2,), (3,)]:
        pool.add(0, phrase)
    pool.add(0, (1,))  # re-adding refreshes: (2,) is now the least recently used
    pool.add(0, (4,))
    assert pool.get(0) == [(4,), (1,), (3,)]
    pool.add(0, (5,))
    assert pool.get(0) == [(5,), (4,), (1,)]
    pool.add(1, (9,))  # capacity is per key
    assert len(pool.get(0)) == 3 and pool.get(1) == [(9,)] and len(pool) == 4


def test_pool_ignores_phrases_of_another_length_and_replaces_corrected_ones():
    pool = PhrasePool(phrase_length=3, capacity=2)
    assert not pool.add(0, (1, 2)) and not pool.add(0, (1, 2, 3, 4)) and len(pool) == 0
    pool.add(0, (1, 2, 3))
    pool.add(0, (4, 5, 6))
    assert pool.replace(0, (1, 2, 3), (1, 2, 9))  # the guess is dropped, the correction is newest
    assert pool.get(0) == [(1, 2, 9), (4, 5, 6)]
    assert pool.replace(0, (7, 7, 7), (8, 8, 8))  # an unknown guess: the correction is just added
    assert pool.get(0) == [(8, 8, 8), (1, 2, 9)]
    assert not pool.replace(0, (8, 8, 8), (1,)) and pool.get(0)[0] == (8, 8, 8)


def test_pool_warm_start_round_trip(tmp_path):
    pool = PhrasePool(phrase_length=2, capacity=3)
    for key, phrase in [(1, (2, 3)), (1, (4, 5)), (2, (6, 7)), (1, (8, 9)), (1, (2, 3))]:
        pool.add(key, phrase)
    path = tmp_path / "sub" / "pool.json"
    pool.save(path)
    loaded = PhrasePool.load(path)
    assert loaded.to_dict() == pool.to_dict()
    assert loaded.get(1) == [(2, 3), (8, 9), (4, 5)]
    # the recency order survives: the same next insertion evicts the same phrase
    pool.add(1, (0, 0))
    loaded.add(1, (0, 0))
    assert loaded.get(1) == pool.get(1) == [(0, 0), (2, 3), (8, 9)]
    # a smaller capacity keeps each key's most recent phrases
    assert PhrasePool.load(path, capacity=1).get(1) == [(2, 3)]
    assert not list(tmp_path.glob("sub/*.partial"))


def test_pool_refuses_a_file_that_is_not_a_pool(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="phrase pool"):
        PhrasePool.load(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read phrase pool"):
        PhrasePool.load(bad)


def test_argmax_chains_follow_only_what_the_path_fed():
    # path 10 11 12 13 14; the model predicted 11 12 99 14 15 after each prefix: it disagrees at
    # 12 → 13 (it wanted 99), so a chain through that point ends with 99
    tokens, argmax = [10, 11, 12, 13, 14], [11, 12, 99, 14, 15]
    assert argmax_chains(tokens, argmax, 2) == [(10, (11, 12)), (11, (12, 99)), (13, (14, 15))]
    assert argmax_chains(tokens, argmax, 3) == [(10, (11, 12, 99))]
    assert argmax_chains(tokens, argmax, 6) == []
    with pytest.raises(ValueError):
        argmax_chains(tokens, argmax[:-1], 2)


# -- the draft model's tree forward ----------------------------------------------------------------
def last_rows(model, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and last-layer hidden state after ``context``: one plain forward, no cache."""
    with torch.no_grad():
        out = model(torch.tensor([context]), output_hidden_states=True)
    return out.logits[0, -1].float(), out.hidden_states[-1][0, -1].float()


@pytest.mark.parametrize(
    "prefix, main",
    [
        pytest.param([], [17], id="empty-cache"),
        pytest.param([5, 9, 13, 7], [22], id="one-main"),
        pytest.param([5, 9], [13, 7, 22], id="three-main"),
    ],
)
def test_lookahead_layout_matches_separate_forwards(prefix, main):
    model = tiny_llama(0)
    window = [[30, 31, 32], [40, 41, 42], [50, 51, 52]]  # rows × columns
    phrases = [[3, 4, 5], [6, 7], [8]]
    positions, tree_mask = lookahead_layout(len(main), 3, 3, [len(p) for p in phrases])
    lm = adapter(model, eos=False)
    if prefix:
        lm.forward(prefix, logits_from=len(prefix))
    feed = main + [t for row in window for t in row] + [t for p in phrases for t in p]
    out = lm.forward(feed, positions=positions, tree_mask=tree_mask, hidden=True)
    logits, hidden = out.logits, out.hidden_states  # [k, vocab], [k, hidden]
    context = prefix + main
    for i in range(1, len(main) + 1):
        expected = last_rows(model, prefix + main[:i])
        assert torch.allclose(logits[i - 1], expected[0], atol=1e-5)
    for level, row in enumerate(window):  # column i reads row0[: i + 1] + rows 1..level at column i
        for i in range(len(row)):
            column = window[0][: i + 1] + [window[m][i] for m in range(1, level + 1)]
            index = len(main) + level * len(row) + i
            expected = last_rows(model, context + column)
            assert torch.allclose(logits[index], expected[0], atol=1e-5), (level, i)
            assert torch.allclose(hidden[index], expected[1], atol=1e-5)
    start = len(main) + 9
    for phrase in phrases:
        for j in range(len(phrase)):
            expected = last_rows(model, context + phrase[: j + 1])
            assert torch.allclose(logits[start + j], expected[0], atol=1e-5)
        start += len(phrase)
    lm.crop(len(prefix) + len(main))  # the drafter keeps only the main chain
    assert torch.allclose(lm.forward([8]).logits[0], last_rows(model, context + [8])[0], atol=1e-5)


def test_the_draft_cache_keeps_only_the_main_chain_after_a_tree_forward():
    """The window and guess tokens are scored beside the main chain but must leave the draft
    model's cache: it holds exactly the context once a proposal returns."""
    drafter = Ouroboros(
        OuroborosConfig(window_size=4, level=4, guess_set_size=6),
        Resources(target=None, draft=adapter(model("partial"), eos=False), sampling=SamplingParams()),
    )
    prompt = PROMPTS["repetitive"]
    state = DecodeState(list(prompt), len(prompt), 20, SamplingParams(), torch.Generator(), frozenset())
    drafter.pacer_start(state=state)
    drafter.pool.add(prompt[-1], (13, 40, 5))  # a guess to score beside the window
    for _ in range(3):
        block = drafter.pacer_propose(state=state, draft=Draft(), num_tokens=1)
        assert list(drafter.model.cached_tokens) == state.tokens
        state.tokens.append(int(block.tokens[0]))
    assert drafter.stats["forwards"] == 3


def test_lookahead_layout_shapes_without_window_or_phrases():
    positions, mask = lookahead_layout(3, 0, 5, [])
    assert positions.tolist() == [0, 1, 2] and torch.equal(mask, torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    positions, mask = lookahead_layout(1, 2, 2, [2])
    assert positions.tolist() == [0, 1, 2, 2, 3, 1, 2]  # window (l, i) at 1 + i + l; phrase at 1, 2
    assert mask[5].tolist() == [True, False, False, False, False, True, False]  # phrase: main + itself


# -- decoding through the engine -------------------------------------------------------------------
@functools.cache
def model(kind: str):
    builders = {
        "target": lambda: tiny_llama(0),
        "same": lambda: tiny_llama(0),  # equal weights, own cache: every draft token accepted
        "partial": lambda: perturbed(tiny_llama(0), std=0.1, seed=123),
        "random": lambda: tiny_llama(1),
    }
    return builders[kind]()


@functools.cache
def reference(prompt: tuple[int, ...], budget: int) -> list[int]:
    return reference_greedy(model("target"), list(prompt), budget, eos=False)


BASE_STOPS = {"fixed": "{name: fixed, gamma: 4}", "heuristic": "{name: heuristic, gamma: 2}"}
# other stop plugins of the project, tested here once they are installed
OPTIONAL_STOPS = [name for name in ("entropy", "pacer") if name in components(new_plugin_manager())["stop"]]


@pytest.fixture(scope="module")
def stop_specs(tmp_path_factory) -> dict[str, str]:
    """Strategy entries by stop name; ``pacer`` gets an untrained M_B for the tiny draft (its
    predictions vary around the threshold, so drafts of many lengths are verified)."""
    specs = dict(BASE_STOPS, entropy="{name: entropy}")
    if "pacer" in OPTIONAL_STOPS:
        pacer_model = pytest.importorskip("pacer_plugins.pacer_stop.model")
        folder = tmp_path_factory.mktemp("pacer_checkpoint")
        torch.manual_seed(0)
        arch = pacer_model.PreVerifierArch(input_size=model("target").config.hidden_size)
        pacer_model.PreVerifier(arch).save(folder, {})
        specs["pacer"] = f"{{name: pacer, checkpoint: '{folder}', b: 2, max_draft: 8}}"
    return specs


@attrs.define
class NoOptions:
    pass


def off_main_path(step) -> int:
    """Accepted nodes of a step that are not on its draft's main path (candidate suffix nodes)."""
    return len(set(step.verdict.nodes(step.draft)) - set(step.draft.path_nodes))


def leaves_the_main_path_early(step) -> bool:
    """The accepted path leaves the main path through a side node hanging off a main-path node
    that is not the main path's last one (a later main token was rejected)."""
    nodes, main = step.verdict.nodes(step.draft), step.draft.path_nodes
    kept = [i for i in nodes if i in set(main)]
    return len(kept) < len(nodes) and len(kept) < len(main)


class StepChecks:
    """Observer: the invariants every step must keep (see the module docstring)."""

    def __init__(self, resources, draft_model=None):
        self.target, self.draft = resources.target, resources.draft
        self.draft_model = draft_model  # the draft's torch module: check the greedy chain too
        self.drafter = None  # the Ouroboros object (set by ouroboros_engine): its trie shapes
        self.records = []

    @hookimpl
    def pacer_start(self, state) -> None:
        self.records = []

    @hookimpl(trylast=True)  # after the drafter's own pacer_observe_step (its cache rollback)
    def pacer_observe_step(self, state, step) -> None:
        self.records.append(step)
        draft, verdict, n = step.draft, step.verdict, len(step.draft)
        tree, path = draft.tree, verdict.nodes(step.draft)
        # caches: the target holds the committed prefix (the accepted path's rows moved into place)
        # with the next token pending, or everything when EOS or the budget cut that token off
        cached = list(self.target.cached_tokens)
        pending = 1 if len(step.emitted) > verdict.accepted else 0
        assert cached == state.tokens[: len(state.tokens) - pending]
        draft_cached = list(self.draft.cached_tokens)
        assert draft_cached == state.tokens[: len(draft_cached)] and len(draft_cached) < len(state.tokens)
        # the target's argmax rows (one per tree node, + the root's) agree with the verdict
        argmax = step.target_argmax
        assert argmax.shape[0] == len(tree) + 1
        for node in path:
            assert int(argmax[int(tree.parents[node]) + 1]) == int(tree.tokens[node])
        assert int(argmax[(path[-1] if path else -1) + 1]) == verdict.next_token
        # what the drafter returns for each main-path token
        assert draft.hidden_states.shape == (n, self.draft.hidden_size)
        assert draft.draft_probs.argmax(-1).tolist() == draft.tokens.tolist()
        self.check_tries(draft)
        if self.draft_model is not None:  # the draft is the draft model's own greedy chain
            context = state.tokens[: step.committed_before]
            for i, token in enumerate(draft.tokens.tolist()):
                logits, hidden = last_rows(self.draft_model, context + draft.tokens[:i].tolist())
                assert int(logits.argmax()) == token, f"step {step.index}, draft token {i}"
                assert torch.allclose(draft.hidden_states[i], hidden, atol=1e-4)

    def check_tries(self, draft) -> None:
        """Side nodes are tries of at most ``topk`` pool phrases hanging off a block's last token:
        no two side siblings repeat a token, and each phrase is whole (level - 1 tokens) unless
        the tree was cut at its depth."""
        tree, main = draft.tree, draft.path_nodes
        block_ends = {main[start + len(b) - 1] for start, b in zip(draft.block_starts, draft.blocks) if len(b)}
        depths, parents, tokens = tree.depths.tolist(), tree.parents.tolist(), tree.tokens.tolist()
        leaves: dict[int, int] = {}  # anchor → phrases hanging off it
        for node in range(len(tree)):
            if node in set(main):
                continue
            anchor = node
            while anchor not in set(main):
                anchor = parents[anchor]
                assert anchor != -1, "a candidate suffix hangs off the root"
            assert anchor in block_ends
            siblings = [tokens[c] for c in tree.children[parents[node]] if c not in set(main)]
            assert len(siblings) == len(set(siblings))  # a trie: shared prefixes merged
            if not tree.children[node]:
                leaves[anchor] = leaves.get(anchor, 0) + 1
                length = depths[node] - depths[anchor]
                if self.drafter is not None:
                    whole = self.drafter.phrase_length
                    assert length == whole or (length < whole and depths[node] == max(depths))
        if self.drafter is not None:
            assert all(count <= self.drafter.config.topk for count in leaves.values())


class BlockStop:
    """A stop asking blocks of ``block`` tokens until the draft has ``limit`` tokens."""

    def __init__(self, block: int, limit: int):
        self.block, self.limit = block, limit

    @hookimpl
    def pacer_draft_more(self, state, draft):
        return self.block if len(draft) < self.limit else Stop()


class ChecksPlugin:
    """An extra plugin offering the ``step_checks`` observer and the ``blocks`` stop."""

    def __init__(self, draft_model=None, block: int = 2, limit: int = 8):
        self.draft_model, self.block, self.limit = draft_model, block, limit
        self.checks = None

    @hookimpl
    def pacer_components(self):
        return [
            Component("observer", "step_checks", NoOptions, self._checks),
            Component("stop", "blocks", NoOptions, lambda config, resources: BlockStop(self.block, self.limit)),
        ]

    def _checks(self, config, resources):
        self.checks = StepChecks(resources, self.draft_model)
        return self.checks


def ouroboros_engine(
    draft_kind: str, stop: str, drafter: str = DRAFTER, plugin=None, target=None, draft=None, eos: bool = False
):
    plugin = plugin or ChecksPlugin()
    cfg = load_config(
        overrides=[
            f"strategy.drafter={drafter}",
            f"strategy.stop=[{stop}]",
            "strategy.verifier={name: greedy}",
            "strategy.observers=[{name: metrics}, {name: step_checks}]",
        ],
        extra_plugins=[plugin],
        require_models=False,
    )
    target = adapter(target or model("target"), eos=eos)
    draft = adapter(draft or model(draft_kind), eos=eos)
    engine = Engine.build(target, draft=draft, cfg=cfg, extra_plugins=[plugin])
    plugin.checks.drafter = drafter_of(engine)
    return engine, plugin


@pytest.mark.parametrize("draft_kind", ["same", "partial", "random"])
@pytest.mark.parametrize("stop", list(BASE_STOPS) + OPTIONAL_STOPS)
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_ouroboros_equals_greedy(prompt_name, stop, draft_kind, stop_specs):
    prompt = PROMPTS[prompt_name]
    engine, plugin = ouroboros_engine(draft_kind, stop_specs[stop])
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == reference(tuple(prompt), BUDGET)
    records, m = plugin.checks.records, result.metrics
    assert m["emitted"] == BUDGET == sum(len(r.emitted) for r in records)
    assert m["draft_forwards"] == m["ouroboros_draft_forwards"] == sum(r.draft_forwards for r in records)
    assert m["ouroboros_branch_tokens"] == sum(off_main_path(r) for r in records)
    if draft_kind == "same":
        # a draft equal to the target: its main path's tokens are always accepted (possibly as a
        # duplicate side node carrying a longer accepted suffix), candidate suffixes after them
        for r in records:
            nodes = r.verdict.nodes(r.draft)
            assert r.draft.tree.tokens[list(nodes[: len(r.draft)])].tolist() == r.draft.tokens.tolist()
        assert m["accepted"] >= sum(len(r.draft) for r in records)


def test_repetition_fills_the_pool_and_pays_off():
    """With a draft equal to the target on a repetitive prompt, pool phrases agree with the draft
    model (several tokens per draft forward) and candidate suffixes are accepted by the target."""
    prompt = PROMPTS["repetitive"]
    engine, plugin = ouroboros_engine("same", "{name: fixed, gamma: 6}", plugin=ChecksPlugin(model("same")))
    result = engine.generate(prompt, max_new_tokens=40)
    assert result.tokens == reference(tuple(prompt), 40)
    m, records = result.metrics, plugin.checks.records
    assert m["ouroboros_multi_token_forwards"] > 0 and m["ouroboros_phrase_tokens"] > 0
    assert m["draft_forwards"] < m["drafted"]  # fewer draft forwards than draft tokens
    assert m["ouroboros_branch_tokens"] == sum(off_main_path(r) for r in records) > 0
    assert max(len(r.emitted) for r in records) > 6 + 1  # a suffix made a step emit more than γ + 1


@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_a_path_may_leave_the_main_path_through_an_earlier_blocks_suffix(prompt_name):
    """One-token blocks hang a suffix trie off every draft token: when a later draft token is
    rejected, the verifier may take a candidate suffix hanging off an accepted earlier token
    (suffixes are not tried only after a fully accepted draft)."""
    prompt = PROMPTS[prompt_name]
    plugin = ChecksPlugin(model("partial"), block=1, limit=6)
    engine, _ = ouroboros_engine("partial", "{name: blocks}", plugin=plugin)
    result = engine.generate(prompt, max_new_tokens=40)
    assert result.tokens == reference(tuple(prompt), 40)
    records = plugin.checks.records
    early = [r for r in records if leaves_the_main_path_early(r)]
    assert early, "no step left the main path before its end"
    assert result.metrics["ouroboros_branch_tokens"] == sum(off_main_path(r) for r in records)
    for r in early:  # the accepted main-path prefix, then the suffix's tokens, then the next token
        nodes = r.verdict.nodes(r.draft)
        main = [i for i in nodes if i in set(r.draft.path_nodes)]
        assert nodes[: len(main)] == r.draft.path_nodes[: len(main)]
        untruncated = r.draft.tree.tokens[list(nodes)].tolist() + [r.verdict.next_token]
        assert list(r.emitted) == untruncated[: 40 - (r.committed_before - len(prompt))]


def test_the_pool_learns_the_suffixes_hanging_off_accepted_nodes():
    """``pacer_observe_step`` on a crafted tree: the suffix hanging off an accepted node is
    replaced by the target's correction, a suffix off a rejected main-path node is not learned, and
    the target's argmax chains along the main and the accepted paths are added."""
    drafter = Ouroboros(
        OuroborosConfig(window_size=0, level=4, guess_set_size=6, topk=3),
        Resources(target=None, draft=ScriptedLM(16), sampling=SamplingParams()),
    )
    drafter.pool.add(4, (5, 6, 7))
    drafter.pool.add(4, (5, 8, 9))
    # main path 3 4 | 10; a trie off 4 (nodes 2-6: 5 6 7, 5 8 9) and a suffix off 10 (nodes 8-10)
    first = DraftBlock(torch.tensor([3, 4]), side=SideNodes.trie([(5, 6, 7), (5, 8, 9)], parent=1, first=2))
    second = DraftBlock(torch.tensor([10]), side=SideNodes.trie([(11, 12, 13)], parent=7, first=8))
    draft = Draft((first, second))
    tree = draft.tree
    assert tree.tokens.tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    # the target's argmax after the root and after each node: 3 4 | 5 (not 10) 8 (not 6) 9 | 14
    argmax = torch.tensor([3, 4, 5, 8, 15, 0, 9, 14, 11, 12, 2, 1])
    verdict = Verdict(5, 14, "bonus", (0, 1, 2, 5, 6))
    emitted = (3, 4, 5, 8, 9, 14)
    state = DecodeState([1, 2, *emitted], 2, 20, SamplingParams(), torch.Generator(), frozenset())
    drafter.pacer_start(state=DecodeState([1, 2], 2, 20, SamplingParams(), torch.Generator(), frozenset()))
    step = StepRecord(
        index=0,
        draft=draft,
        verdict=verdict,
        emitted=emitted,
        committed_before=2,
        draft_s=0.0,
        verify_s=0.0,
        draft_forwards=0,
        target_argmax=argmax,
    )
    drafter.pacer_observe_step(state=state, step=step)
    pool = drafter.pool
    assert drafter.stats["branch_tokens"] == 3  # nodes 2, 5, 6
    # 5 6 7 was corrected to 5 8 15; 5 8 9 confirmed (then refreshed by the accepted path's chain)
    assert pool.get(4) == [(5, 8, 9), (5, 8, 15)]
    assert 10 not in pool  # the suffix off the rejected main node 10 is not learned
    # the target's greedy chains along the accepted path 2 | 3 4 5 8 9 (and the main path's 2 | 3 4 10)
    assert pool.get(2) == [(3, 4, 5)] and pool.get(3) == [(4, 5, 8)] and pool.get(5) == [(8, 9, 14)]


@pytest.mark.parametrize("draft_kind", ["partial", "random"])
def test_the_draft_is_the_draft_models_greedy_chain(draft_kind):
    """Multi-token draft forwards must not change the draft: each draft token is the draft
    model's argmax after the tokens before it, with that forward's hidden state."""
    prompt = PROMPTS["repetitive"]
    engine, plugin = ouroboros_engine(draft_kind, "{name: fixed, gamma: 5}", plugin=ChecksPlugin(model(draft_kind)))
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == reference(tuple(prompt), BUDGET)
    assert result.metrics["ouroboros_phrase_tokens"] > 0  # phrases were used, so the check is not vacuous


def test_blocks_have_exactly_the_tokens_asked_and_the_surplus_is_served_next():
    """A stop asking 2-token blocks up to 8 tokens: every block has exactly 2 tokens, although a
    draft forward can produce more (the rest is served first to the next block)."""
    plugin = ChecksPlugin(model("same"), block=2, limit=8)
    engine, _ = ouroboros_engine("same", "{name: blocks}", plugin=plugin)
    prompt = PROMPTS["repetitive"]
    result = engine.generate(prompt, max_new_tokens=40)
    assert result.tokens == reference(tuple(prompt), 40)
    records = plugin.checks.records
    for r in records:
        starts = list(r.draft.block_starts) + [len(r.draft)]
        sizes = [b - a for a, b in zip(starts[:-1], starts[1:])]
        assert all(s == 2 for s in sizes[:-1]) and 1 <= sizes[-1] <= 2, sizes
    full = [r for r in records if len(r.draft) == 8]
    assert full and any(r.draft_forwards < 4 for r in full)  # some block cost no forward of its own


def test_gamma_caps_the_draft_whatever_the_stop_asks():
    engine, plugin = ouroboros_engine(
        "same", "{name: fixed, gamma: 5}", drafter="{name: ouroboros, gamma: 2, window_size: 4, level: 4}"
    )
    result = engine.generate(PROMPTS["plain"], max_new_tokens=BUDGET)
    assert result.tokens == reference(tuple(PROMPTS["plain"]), BUDGET)
    lengths = [len(r.draft) for r in plugin.checks.records]
    assert max(lengths) == 2 and lengths.count(2) >= len(lengths) - 1


def test_eos_inside_the_draft_ends_the_generation():
    target = with_eos_bias(tiny_llama(0), 0.03)
    prompt = PROMPTS["one_token"]
    expected = reference_greedy(target, prompt, BUDGET, eos=True)
    assert expected[-1] == EOS and len(expected) < BUDGET  # the bias makes EOS come early
    engine, plugin = ouroboros_engine(
        "same", "{name: fixed, gamma: 6}", target=target, draft=copy.deepcopy(target), eos=True
    )
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == expected and result.finish_reason == "eos"
    last = plugin.checks.records[-1].draft.tokens.tolist()
    assert EOS in last and last[-1] == EOS  # the drafter stopped at EOS, inside the γ = 6 window
    draft = plugin.checks.records[-1].draft
    assert len(last) < 6 and not draft.tree.children[draft.path_nodes[-1]]  # nothing hangs off EOS


# -- the pool across prompts -----------------------------------------------------------------------
def drafter_of(engine):
    return next(p for name, p in engine.pm.list_name_plugin() if name.endswith(":ouroboros"))


def test_the_pool_is_kept_across_prompts_unless_warm_start_is_off():
    engine, _ = ouroboros_engine("partial", "{name: fixed, gamma: 4}")
    engine.generate(PROMPTS["repetitive"], max_new_tokens=20)
    pool = drafter_of(engine).pool
    learned = {key: len(pool.get(key)) for key in pool.keys()}
    assert learned
    engine.generate(PROMPTS["plain"], max_new_tokens=1)
    assert all(len(pool.get(key)) >= count for key, count in learned.items())  # nothing was emptied
    drafter = DRAFTER[:-1] + ", warm_start: false}"
    cold, _ = ouroboros_engine("partial", "{name: fixed, gamma: 4}", drafter=drafter)
    cold.generate(PROMPTS["repetitive"], max_new_tokens=20)
    first = drafter_of(cold).pool.to_dict()
    cold.generate(PROMPTS["plain"], max_new_tokens=1)
    assert len(drafter_of(cold).pool) < len(PhrasePool.from_dict(first))  # emptied at the start
    cold.generate(PROMPTS["repetitive"], max_new_tokens=20)
    assert drafter_of(cold).pool.to_dict() == first  # the same generation from empty: the same pool


def test_pool_path_saves_after_each_generation_and_warm_starts_a_new_engine(tmp_path):
    path = tmp_path / "pool.json"
    drafter = f"{{name: ouroboros, window_size: 4, level: 4, guess_set_size: 6, pool_path: '{path}'}}"
    engine, _ = ouroboros_engine("partial", "{name: fixed, gamma: 4}", drafter=drafter)
    result = engine.generate(PROMPTS["repetitive"], max_new_tokens=BUDGET)
    assert path.exists() and PhrasePool.load(path).to_dict() == drafter_of(engine).pool.to_dict()
    warm, _ = ouroboros_engine("partial", "{name: fixed, gamma: 4}", drafter=drafter)
    assert drafter_of(warm).pool.to_dict() == drafter_of(engine).pool.to_dict()
    again = warm.generate(PROMPTS["repetitive"], max_new_tokens=BUDGET)
    assert again.tokens == result.tokens  # a warm pool changes the speed, never the output
    wrong_level = f"{{name: ouroboros, level: 6, pool_path: '{path}'}}"
    with pytest.raises(InputError, match="phrases of 3 tokens"):
        ouroboros_engine("partial", "{name: fixed, gamma: 4}", drafter=wrong_level)
    path.write_text("{broken")
    with pytest.raises(InputError, match="cannot read phrase pool"):
        ouroboros_engine("partial", "{name: fixed, gamma: 4}", drafter=drafter)


def test_prompt_phrases_seed_the_pool_from_the_prompt():
    drafter = "{name: ouroboros, window_size: 0, level: 3, guess_set_size: 4, prompt_phrases: true}"
    engine, _ = ouroboros_engine("random", "{name: fixed, gamma: 1}", drafter=drafter)
    engine.generate([5, 9, 13, 40, 5, 9, 11], max_new_tokens=1)
    pool = drafter_of(engine).pool
    assert {(9, 13), (9, 11)} <= set(pool.get(5)) and (40, 5) in pool.get(13)


# -- configuration -----------------------------------------------------------------------------
def test_sampling_is_refused_with_a_clear_error():
    with pytest.raises(ConfigError, match="'ouroboros' supports greedy decoding only"):
        load_config(overrides=["strategy.drafter={name: ouroboros}", "sampling.temperature=0.7"], require_models=False)


@pytest.mark.parametrize(
    "options, words",
    [
        ("topk: 5, guess_set_size: 4", "topk \\(5\\) must not exceed guess_set_size \\(4\\)"),
        ("level: 1", "'level' must be >= 2"),
        ("window: 3", "unknown option 'window'"),
    ],
)
def test_bad_options_fail_early(options, words):
    with pytest.raises(ConfigError, match=words):
        load_config(overrides=[f"strategy.drafter={{name: ouroboros, {options}}}"], require_models=False)


def test_the_shipped_yaml_stacks_ouroboros_with_fixed():
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "ouroboros_fixed.yaml", require_models=False)
    assert cfg.strategy.drafter["name"] == "ouroboros" and cfg.sampling.temperature == 0
    assert [(s["name"], s["gamma"]) for s in cfg.strategy.stop] == [("fixed", 4)]


def test_the_drafter_needs_a_draft_model():
    with pytest.raises(ConfigError, match="drafter 'ouroboros' needs a draft model"):
        load_config(overrides=["strategy.drafter={name: ouroboros}", "target.path=/my/target"])
    # the embedded target comes with a shipped draft
    assert load_config(overrides=["strategy.drafter={name: ouroboros}"])
    assert OuroborosConfig().level == 7 and OuroborosConfig().gamma == 0


# -- breadth: scripted models ------------------------------------------------------------------
def scripted_greedy(lm: ScriptedLM, prompt: list[int], budget: int) -> list[int]:
    context = list(prompt)
    for _ in range(budget):
        context.append(int(lm.next_logits(context).argmax()))
    return context[len(prompt) :]


@pytest.mark.parametrize("stop", ["{name: fixed, gamma: 5}", "{name: heuristic, gamma: 2}"])
def test_many_scripted_runs_equal_greedy(stop):
    """20 target/draft pairs of scripted bigram-like models over 6 tokens (greedy output cycles, so
    the pool is hit constantly), drafts correlated with their targets to varying degrees."""
    totals = {"multi": 0, "branch": 0}
    for seed in range(20):
        target_table = random_table(6, seed, order=2)
        mix = seed % 4 / 3  # 0: an unrelated draft … 1: the target itself
        draft_table = mix * target_table + (1 - mix) * random_table(6, 100 + seed, order=2)
        target, draft = ScriptedLM(6, seed, table=target_table), ScriptedLM(6, seed, table=draft_table)
        prompt = [seed % 6, (seed + 1) % 6, (seed * 7) % 6]
        drafter = "{name: ouroboros, window_size: 3, level: 3, guess_set_size: 4, topk: 2}"
        cfg = load_config(
            overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", "strategy.verifier={name: greedy}"],
            require_models=False,
        )
        result = Engine.build(target, draft=draft, cfg=cfg).generate(prompt, max_new_tokens=40)
        assert result.tokens == scripted_greedy(target, prompt, 40), seed
        totals["multi"] += result.metrics["ouroboros_multi_token_forwards"]
        totals["branch"] += result.metrics["ouroboros_branch_tokens"]
    assert totals["multi"] > 0 and totals["branch"] > 0


# -- what it shares with the draft_model drafter (pacer_core.draft_model_helpers) ---------------------------------
def test_both_draft_model_drafters_default_to_the_one_shipped_draft():
    from pacer_core.draft_model_helpers import shipped_draft

    table = components(new_plugin_manager())["drafter"]
    folder = Path(shipped_draft())
    assert table["ouroboros"].default_draft == table["draft_model"].default_draft == str(folder)
    assert folder.name == "default" and (folder / "manifest.json").exists()


def test_sync_cache_keeps_the_shared_prefix_and_feeds_at_least_the_last_token():
    from pacer_core.draft_model_helpers import sync_cache

    model = ScriptedLM(vocab_size=8)
    model.forward([1, 2, 3, 4])
    assert sync_cache(model, [1, 2, 5, 6]) == [5, 6] and list(model.cached_tokens) == [1, 2]
    model.forward([5, 6])
    assert sync_cache(model, [1, 2, 5, 6]) == [6] and list(model.cached_tokens) == [1, 2, 5]  # its logits are needed
    assert sync_cache(model, [7]) == [7] and list(model.cached_tokens) == []
