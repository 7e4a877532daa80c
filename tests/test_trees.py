"""Token trees: the draft tree, the target pass that scores it, the cache rows kept, greedy decoding
through the engine, and the exact distribution of tree sampling.

- ``Draft.tree``: node numbering (block by block, main path then side nodes), depths, ancestor
  mask, ``truncate``; a chain-shaped tree with side nodes is not a chain.
- The model adapter: one forward over [pending, tree nodes] with ``engine.tree_layout`` gives the
  logits and hidden states of separate plain forwards of each node's root path (``HFModel`` on a
  tiny Llama, and ``ScriptedLM``); ``crop(base, rows)`` of an accepted path leaves the cache (every
  layer's keys and values) of plain decoding of the committed tokens.
- The engine with a test tree drafter (``tree_script``, registered through ``extra_plugins``) that
  drafts from the target's known greedy output with scheduled mistakes and side nodes (right and
  wrong ones, duplicate siblings, a deep branch accepted through a side node, side chains deeper
  than the main path, EOS inside a branch, the budget ending inside a branch): the output equals
  the target's own greedy decoding for every stop policy × both verifiers, and an observer checks
  after every step the verdict (against an independent oracle), the emitted tokens and the
  target's cache (for the tiny Llama: its keys and values equal a plain-decoding cache).
- Exact distribution of sampled trees (as in test_distribution.py): a tree drafter of depth 2+
  and width 2+ whose children are drawn i.i.d. from the draft (``sampled=True``) or are its top-k
  tokens (``sampled=False``), through the engine with ``speculative_sampling`` at several sampling
  settings, must reproduce the target's exact distribution of the first three tokens (chi-square);
  a verifier that tests each sibling against the target's fresh row (no residual update between
  siblings) must fail the same test. Cases run ahead in spawned workers, as there.
"""

from __future__ import annotations

import functools
import time
from typing import Optional

import attrs
import pytest
import torch

from pacer_core import Component, Draft, DraftBlock, Engine, SideNodes, Verdict, hookimpl, load_config
from pacer_core.acceptance import greedy_verify, residual_distribution
from pacer_core.engine import tree_layout
from pacer_core.registry import components, new_plugin_manager
from pacer_core.sampling import logits_to_probs, sample
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs, random_table

from helpers import (
    DRAFT_TABLE,
    EOS,
    LENGTH,
    PASS_P,
    PROMPT,
    SAMPLINGS,
    SCRIPTED_VOCAB,
    TARGET_TABLE,
    VOCAB,
    adapter,
    build_engine,
    module_cases,
    precomputed,
    reference_greedy,
    sample_outputs,
    single_thread,
    tiny_llama,
    with_eos_bias,
    write_checkpoint,
)

BUDGET = 30
PROMPTS = {"plain": [5, 9, 13, 7, 22], "one_token": [17], "repetitive": [5, 9, 13, 5, 9, 13, 5, 9]}
EOS_BIAS = 0.03  # added to the target's EOS logit: EOS becomes its argmax after a few tokens
EOS_PROMPTS = {"one_token": [17], "repetitive": [5, 9, 13, 5, 9, 13, 5, 9]}


@functools.cache
def llama(kind: str):
    """Tiny seeded Llamas, built once per session."""
    return {"target": lambda: tiny_llama(0), "eos_target": lambda: with_eos_bias(tiny_llama(0), EOS_BIAS)}[kind]()


# -- the draft tree ------------------------------------------------------------------------------
def block(tokens, side=None, parents=None):
    return DraftBlock(
        torch.tensor(tokens, dtype=torch.long),
        side=None
        if side is None
        else SideNodes(torch.tensor(side, dtype=torch.long), torch.tensor(parents, dtype=torch.long)),
    )


# node: 0  1  2   3   4   5 | 6  7  8   9   10 11  12
# tok:  3  4  10  11  20  4 | 5  6  12  30  7  13  14
# par: -1  0  -1  2   0   0 | 1  6  3   2   6  8   11
TREE_DRAFT = Draft(
    (block([3, 4], [10, 11, 20, 4], [-1, 2, 0, 0]), block([5, 6], [12, 30, 7, 13, 14], [3, 2, 6, 8, 11]))
)


def test_draft_tree_numbers_blocks_main_path_then_side_nodes():
    tree = TREE_DRAFT.tree
    assert tree.tokens.tolist() == [3, 4, 10, 11, 20, 4, 5, 6, 12, 30, 7, 13, 14]
    assert tree.parents.tolist() == [-1, 0, -1, 2, 0, 0, 1, 6, 3, 2, 6, 8, 11]
    assert TREE_DRAFT.tokens.tolist() == [3, 4, 5, 6] and len(TREE_DRAFT) == 4 and TREE_DRAFT.num_nodes == 13
    assert TREE_DRAFT.path_nodes == tree.main_path == (0, 1, 6, 7)
    assert tree.depths.tolist() == [1, 2, 1, 2, 2, 2, 3, 4, 3, 2, 4, 4, 5]  # side nodes deeper than the main path
    assert tree.children[-1] == [0, 2] and tree.children[0] == [1, 4, 5] and tree.children[12] == []
    assert tree.path_to(12) == [2, 3, 8, 11, 12] and tree.path_to(-1) == []
    mask = tree.ancestor_mask()
    for i in range(len(tree)):
        assert set(mask[i].nonzero().flatten().tolist()) == set(tree.path_to(i))
    assert not tree.is_chain and tree.sampled.all()  # DraftBlock.sampled defaults to True
    assert Draft((block([3, 4]), block([5]))).tree.is_chain


def test_side_nodes_continuing_the_tip_make_a_tree_not_a_chain():
    """Chain-shaped but not all main path: a chain verdict (first ``accepted`` main-path tokens)
    could not name the side nodes, so the verifiers must treat it as a tree."""
    draft = Draft((block([3, 4], [5, 6], [1, 2]),))
    tree = draft.tree
    assert tree.parents.tolist() == [-1, 0, 1, 2] and not tree.is_chain
    logits = torch.nn.functional.one_hot(torch.tensor([3, 4, 5, 6, 7]), 16).float()
    verdict = greedy_verify(tree.tokens, logits, tree.parents)
    assert verdict.nodes(draft) == (0, 1, 2, 3) and verdict.next_token == 7


def test_truncate_cuts_nodes_deeper_than_keep_and_renumbers():
    cut = TREE_DRAFT.truncate(2)
    tree = cut.tree
    # kept: 0 1 2 3 4 5 (block 1, depths <= 2) and 9 (block 2's side node 30 under node 2, depth 2)
    assert tree.tokens.tolist() == [3, 4, 10, 11, 20, 4, 30]
    assert tree.parents.tolist() == [-1, 0, -1, 2, 0, 0, 2]
    assert cut.tokens.tolist() == [3, 4] and len(cut.blocks) == 2 and len(cut.blocks[1]) == 0
    assert TREE_DRAFT.truncate(5) is TREE_DRAFT
    assert TREE_DRAFT.truncate(4).tree.tokens.tolist() == [3, 4, 10, 11, 20, 4, 5, 6, 12, 30, 7, 13]
    assert TREE_DRAFT.truncate(0).num_nodes == 0


def test_select_keeps_the_chosen_nodes_with_their_ancestors_and_renumbers():
    points = Draft(tuple(attrs.evolve(b, sampled=False) for b in TREE_DRAFT.blocks))  # top-k children
    # main path 0 1 | 6 7; keep 0, 2, 3, 8 (8's parent 3, 3's parent 2) and 7 (its parent 6 is left out)
    chosen = points.select([0, 2, 3, 8, 7, 4])
    tree = chosen.tree
    assert tree.tokens.tolist() == [3, 10, 11, 20, 12] and tree.parents.tolist() == [-1, -1, 1, 0, 2]
    assert chosen.tokens.tolist() == [3] and len(chosen) == 1 and chosen.depth == 3
    assert chosen.forwards == points.forwards and points.select(range(13)) is points
    assert points.select([]).num_nodes == 0
    assert points.select(i for i in range(13) if i != 1).tokens.tolist() == [3]  # the main path ends at 0


def test_select_refuses_to_split_sampled_siblings():
    """Candidates drawn i.i.d. from one distribution are rejected in turn against a residual:
    leaving out some of them for their values would bias what is accepted."""
    probs = torch.full((1, 8), 1 / 8)
    sampled = SideNodes(torch.tensor([5, 6]), torch.tensor([-1, -1]), torch.full((2, 8), 1 / 8))
    draft = Draft((DraftBlock(torch.tensor([4]), probs, side=sampled),))
    with pytest.raises(ValueError, match="sampled children"):
        draft.select([0, 1])
    assert draft.select([]).num_nodes == 0 and draft.select([0, 1, 2]) is draft
    chain = Draft((DraftBlock(torch.tensor([4, 5, 6]), probs.expand(3, 8)),))  # a sampled chain may be cut
    assert chain.select([0, 1]).tokens.tolist() == [4, 5]
    points = Draft((DraftBlock(torch.tensor([4]), probs, side=attrs.evolve(sampled, sampled=False), sampled=False),))
    assert points.select([0, 2]).tree.tokens.tolist() == [4, 6]  # point masses may be left out one by one


def test_best_nodes_ranks_by_cumulative_draft_probability():
    from pacer_core.trees import best_nodes

    # root children 0 (q .6, main) and 1 (q .3); 0's children 2 (.5, main) and 3 (.4); 2's child 4 (.9)
    q = {0: (1, 0.6), 1: (2, 0.3), 2: (3, 0.5), 3: (4, 0.4), 4: (5, 0.9)}
    probs = torch.zeros(5, 8)
    for node, (token, p) in q.items():
        probs[node, token] = p
    main = DraftBlock(
        torch.tensor([1]), probs[:1], side=SideNodes(torch.tensor([2]), torch.tensor([-1]), probs[1:2]), sampled=False
    )
    second = DraftBlock(
        torch.tensor([3]), probs[2:3], side=SideNodes(torch.tensor([4]), torch.tensor([0]), probs[3:4]), sampled=False
    )
    third = DraftBlock(torch.tensor([5]), probs[4:5], sampled=False)
    draft = Draft((main, second, third))  # cumulative: 0 .6, 1 .3, 2 .3, 3 .24, 4 .27
    assert best_nodes(draft.tree, 5) is None
    assert best_nodes(draft.tree, 1) == [0]
    assert best_nodes(draft.tree, 3) == [0, 1, 2]  # a tie goes to the earlier node
    assert best_nodes(draft.tree, 4) == [0, 1, 2, 4]
    # a node without a draft probability (another source's phrase) is kept, with its ancestors
    merged = Draft(
        (
            main,
            attrs.evolve(
                second,
                side=SideNodes(
                    torch.tensor([4, 7]),
                    torch.tensor([0, 3]),
                    torch.cat([probs[3:4], torch.zeros(1, 8)]),
                    sampled=False,
                ),
            ),
            third,
        )
    )
    assert merged.tree.tokens.tolist() == [1, 2, 3, 4, 7, 5]
    assert best_nodes(merged.tree, 1) == [0, 3, 4]  # node 4 (the phrase) needs node 3 above it
    assert draft.select(best_nodes(draft.tree, 2)).tree.tokens.tolist() == [1, 2]


def test_every_strategys_selection_applies_and_a_tree_drafter_sends_its_best_nodes():
    """The engine sends the nodes every ``pacer_select_nodes`` answer keeps; the ``draft_model``
    tree grows topk nodes a level and sends its best ``nodes``; output stays the target's."""
    sent = []

    @attrs.define
    class NoConfig:
        pass

    class Picky:  # leaves out every node at depth 3 and beyond
        @hookimpl
        def pacer_select_nodes(self, draft):
            return [i for i, d in enumerate(draft.tree.depths.tolist()) if d < 3]

        @hookimpl
        def pacer_observe_step(self, step):
            sent.append(step.draft)

    class Plugin:
        @hookimpl
        def pacer_components(self):
            return [Component("observer", "picky", NoConfig, lambda config, resources: Picky())]

    target, draft = adapter(llama("target"), eos=False), adapter(tiny_llama(1), eos=False)
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model, tree: {topk: 3, depth: 4, nodes: 5}}",
            "strategy.stop=[{name: fixed, gamma: 4}]",
            "strategy.observers=[{name: picky}]",
        ],
        require_models=False,
        extra_plugins=[Plugin()],
    )
    engine = Engine.build(target, draft=draft, cfg=cfg, extra_plugins=[Plugin()])
    for prompt in PROMPTS.values():
        assert engine.generate(prompt, max_new_tokens=BUDGET).tokens == reference_greedy(
            llama("target"), prompt, BUDGET, eos=False
        )
    grown = [d for d in sent if d.forwards == 4]
    assert grown and all(d.num_nodes <= 5 and d.depth <= 2 for d in sent)
    assert any(d.num_nodes == 5 for d in grown)


def test_sampled_flag_and_side_probabilities_follow_the_blocks():
    probs = torch.full((2, 8), 1 / 8)
    side = SideNodes(torch.tensor([1]), torch.tensor([-1]), torch.full((1, 8), 1 / 8))
    draft = Draft(
        (DraftBlock(torch.tensor([2, 3]), probs, side=side, sampled=False), DraftBlock(torch.tensor([4]), probs[:1]))
    )
    tree = draft.tree
    assert tree.sampled.tolist() == [False, False, False, True] and tree.draft_probs.shape == (4, 8)
    bad = Draft((DraftBlock(torch.tensor([2]), probs[:1], side=SideNodes(torch.tensor([1]), torch.tensor([-1]))),))
    with pytest.raises(ValueError, match="sampled side nodes must carry the draft_probs"):
        bad.tree
    # point-mass side nodes (lookup, pool phrases) beside sampled tokens need no distribution
    lookup = SideNodes(torch.tensor([1, 5]), torch.tensor([-1, 1]), sampled=False)
    mixed = Draft((DraftBlock(torch.tensor([2]), probs[:1], side=lookup), DraftBlock(torch.tensor([4]), probs[:1])))
    assert mixed.tree.sampled.tolist() == [True, False, False, True] and mixed.tree.draft_probs.shape == (4, 8)
    assert mixed.depth == 2 and len(mixed) == 2 and Draft((block([2, 3], [1, 5], [1, 2]),)).depth == 4
    forward_parent = Draft((block([2], [1], [1]),))  # a side node may not continue itself
    with pytest.raises(ValueError, match="earlier node"):
        forward_parent.tree


# -- one forward over the tree ---------------------------------------------------------------------
def make_lm(kind: str):
    if kind == "hf":
        return adapter(llama("target"), eos=False)
    return ScriptedLM(VOCAB, table=random_table(VOCAB, seed=3))


def plain_last(kind: str, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and hidden state after ``context``: one plain causal forward on a fresh cache."""
    out = make_lm(kind).forward(context, logits_from=len(context) - 1, hidden=True)
    return out.logits[-1], out.hidden_states[-1]


CACHE_SETUPS = [
    pytest.param([], [17], id="empty-cache"),
    pytest.param([5, 9, 13, 7], [22], id="one-pending"),
    pytest.param([5, 9, 13], [7, 22, 40], id="three-pending"),
]


def tree_forward(kind: str, prefix: list[int], pending: list[int], full_mask: bool = False):
    """An LM with ``prefix`` cached that scored [pending, TREE_DRAFT's nodes] in one forward."""
    lm = make_lm(kind)
    if prefix:
        lm.forward(prefix, logits_from=len(prefix))
    tree = TREE_DRAFT.tree
    positions, mask = tree_layout(len(pending), tree)
    if full_mask:  # the [k, cached + k] form, every cached token visible
        mask = torch.cat([torch.ones(mask.shape[0], len(prefix), dtype=torch.bool), mask], 1)
    out = lm.forward(pending + tree.tokens.tolist(), positions=positions, tree_mask=mask, hidden=True)
    return lm, out


@pytest.mark.parametrize("kind", ["hf", "scripted"])
@pytest.mark.parametrize("prefix, pending", CACHE_SETUPS)
def test_tree_forward_matches_separate_forwards(kind, prefix, pending):
    lm, out = tree_forward(kind, prefix, pending)
    tree = TREE_DRAFT.tree
    k = len(pending) + len(tree)
    assert out.logits.shape == (k, VOCAB) and out.hidden_states.shape[0] == k
    for i in range(len(pending)):
        logits, hidden = plain_last(kind, prefix + pending[: i + 1])
        assert torch.allclose(out.logits[i], logits, atol=1e-5)
        assert torch.allclose(out.hidden_states[i].float(), hidden.float(), atol=1e-5)
    for node in range(len(tree)):
        path = tree.tokens[tree.path_to(node)].tolist()
        logits, hidden = plain_last(kind, prefix + pending + path)
        row = len(pending) + node
        assert torch.allclose(out.logits[row], logits, atol=1e-5), node
        assert torch.allclose(out.hidden_states[row].float(), hidden.float(), atol=1e-5), node
    assert list(lm.cached_tokens) == prefix + pending + tree.tokens.tolist()
    _, full = tree_forward(kind, prefix, pending, full_mask=True)
    assert torch.allclose(full.logits, out.logits, atol=1e-6)


# accepted paths of TREE_DRAFT, by node: contiguous (a plain crop), through side nodes, empty
PATHS = {
    "main": [0, 1],
    "main-deep": [0, 1, 6, 7],
    "side-deep": [2, 3, 8, 11, 12],
    "mixed": [0, 1, 6, 10],
    "duplicate": [0, 5],
    "one-side": [2],
    "empty": [],
}


def layer_tensors(lm) -> list[torch.Tensor]:
    return [t for layer in lm._cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("kind", ["hf", "scripted"])
@pytest.mark.parametrize("path_name", list(PATHS))
@pytest.mark.parametrize("prefix, pending", CACHE_SETUPS)
def test_crop_keeps_the_accepted_path_as_plain_decoding_would(kind, path_name, prefix, pending):
    path = PATHS[path_name]
    lm, _ = tree_forward(kind, prefix, pending)
    base = len(prefix) + len(pending)
    lm.crop(base, [base + i for i in path])
    committed = prefix + pending + TREE_DRAFT.tree.tokens[path].tolist()
    plain = make_lm(kind)
    if prefix:
        plain.forward(prefix, logits_from=len(prefix))
    plain.forward(committed[len(prefix) :], logits_from=len(committed))
    assert list(lm.cached_tokens) == list(plain.cached_tokens) == committed
    if kind == "hf":
        mine, theirs = layer_tensors(lm), layer_tensors(plain)
        assert len(mine) == len(theirs) == 2 * llama("target").config.num_hidden_layers
        for a, b in zip(mine, theirs):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    after = lm.forward([8, 9], hidden=True)
    expected = plain.forward([8, 9], hidden=True)
    assert torch.allclose(after.logits, expected.logits, atol=1e-5)
    assert torch.allclose(after.hidden_states.float(), expected.hidden_states.float(), atol=1e-5)


@pytest.mark.parametrize("kind", ["hf", "scripted"])
def test_crop_refuses_rows_out_of_order_or_range(kind):
    lm, _ = tree_forward(kind, [5, 9, 13], [7])
    base, total = 4, len(lm.cached_tokens)
    for rows in ([base + 3, base + 1], [base + 1, base + 1, base + 2], [base - 1, base + 2], [base + 1, total]):
        with pytest.raises(ValueError, match="ascending"):
            lm.crop(base, rows)
    assert len(lm.cached_tokens) == total  # a refused crop changes nothing


# -- the engine with a scripted tree drafter -------------------------------------------------------
@attrs.frozen
class Node:
    """A scheduled draft node: ``token`` "c" is the target's greedy token at the node's depth (the
    right one when its whole path is right), "wK" a wrong one (that token + K); ``level`` is the
    block that emits it (0: its depth, i.e. one level per ``pacer_propose``)."""

    name: str
    parent: Optional[str]
    token: str
    level: int = 0


def main_path(*tokens: str) -> list[Node]:
    return [Node(f"m{d}", f"m{d - 1}" if d > 1 else None, t) for d, t in enumerate(tokens, 1)]


def chain(prefix: str, parent: Optional[str], first_depth: int, tokens: str, level: int = 0) -> list[Node]:
    """Side nodes ``prefix{depth}`` continuing ``parent``, one per token letter ("c"/"1"/"2"…)."""
    nodes, up = [], parent
    for depth, t in enumerate(tokens, first_depth):
        nodes.append(Node(f"{prefix}{depth}", up, "c" if t == "c" else f"w{t}", level))
        up = nodes[-1].name
    return nodes


SIDE_CHAIN_DEPTH = 7  # of the side chain off the root drafted near EOS and the end of the budget

# scenario → (nodes, the accepted path of the whole tree)
SCENARIOS = {
    "main_right": (
        main_path("c", "c", "c", "c", "c")
        + chain("x", None, 1, "1")
        + chain("y", "m2", 3, "1")
        + chain("z", "m3", 4, "2c"),
        "m1 m2 m3 m4 m5",
    ),
    # a deep branch accepted through a side node: the main path is wrong at depth 2
    "deep_side": (
        main_path("c", "w1", "c", "c", "c") + chain("b", "m1", 2, "2") + chain("a", "m1", 2, "cccc"),
        "m1 a2 a3 a4 a5",
    ),
    # duplicate siblings: d1 repeats m1 and carries the longer right path; e2 repeats m2
    "duplicates": (
        main_path("c", "c", "w1", "c", "c") + chain("d", None, 1, "cccc") + chain("e", "m1", 2, "c2"),
        "d1 d2 d3 d4",
    ),
    # duplicates with equally long right paths: the first (in node order) wins
    "tie_first": (
        main_path("w1", "c", "c", "c", "c") + chain("s", None, 1, "cc1") + chain("t", None, 1, "cc2"),
        "s1 s2",
    ),
    "all_wrong": (main_path("w1", "c", "c", "c", "c") + chain("u", None, 1, "2c") + chain("v", None, 1, "3"), ""),
    # a side chain continuing the tip, drafted with it and deeper than the main path (chain-shaped)
    "tip_chain": (main_path("c", "c", "c") + chain("q", "m3", 4, "ccc", level=3), "m1 m2 m3 q4 q5 q6"),
    # Ouroboros-like: suffixes hanging off the blocks, deeper than the block; the main path fails at 4
    "suffixes": (
        main_path("c", "c", "c", "w1", "c")
        + chain("r", "m1", 2, "1c", level=1)
        + chain("p", "m3", 4, "cc", level=3)
        + chain("o", "m4", 5, "c", level=4),
        "m1 m2 m3 p4 p5",
    ),
    # near EOS and the end of the budget: the right path is a side chain off the root
    "side_chain": (
        main_path("w1", "c", "c", "c", "c") + chain("k", None, 1, "c" * SIDE_CHAIN_DEPTH, level=1),
        " ".join(f"k{d}" for d in range(1, SIDE_CHAIN_DEPTH + 1)),
    ),
}
ROTATION = [name for name in SCENARIOS if name != "side_chain"]


def wrong(token: int, shift: int) -> int:
    return (token + shift) % VOCAB


class TreeScript:
    """A tree drafter drafting from the target's greedy continuation (known in advance): step i
    follows scenario ROTATION[(i + offset) % len(ROTATION)] (``side_chain`` when EOS or the end of
    the budget is near), one block per ``pacer_propose`` (the level's main-path node and the side
    nodes it emits). Each token's draft distribution and hidden state are seeded noise, so entropy
    and PACER stops vary the draft lengths."""

    def __init__(self, sequence: list[int], vocab: int, hidden_size: int, eos: frozenset[int], offset: int = 0):
        self.sequence, self.vocab, self.hidden_size, self.eos = sequence, vocab, hidden_size, eos
        self.offset = offset
        self.scenario: dict[int, str] = {}  # step → scenario
        self.names: dict[int, list[str]] = {}  # step → node names in tree order (before any truncation)

    def token(self, node: Node, depth: int, committed: int) -> int:
        right = self.sequence[committed + depth - 1]
        return right if node.token == "c" else wrong(right, int(node.token[1:]))

    def choose_scenario(self, state) -> str:
        committed = len(state.tokens)
        ahead = self.sequence[committed : committed + SIDE_CHAIN_DEPTH]
        if state.budget_left <= SIDE_CHAIN_DEPTH or set(ahead) & self.eos:
            return "side_chain"
        return ROTATION[(state.step_index + self.offset) % len(ROTATION)]

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        step = state.step_index
        if len(draft) == 0:
            self.scenario[step], self.names[step] = self.choose_scenario(state), []
        nodes = SCENARIOS[self.scenario[step]][0]
        level = len(draft) + 1
        main = [n for n in nodes if n.name == f"m{level}"]
        if not main:
            return None  # the scheduled main path ends: drafting ends
        side = [n for n in nodes if not n.name.startswith("m") and (n.level or self.depth(nodes, n)) == level]
        names = self.names[step]
        index = {name: i for i, name in enumerate(names)}
        tokens, parents = [], []
        for node in main + side:
            parent = -1 if node.parent is None else index[node.parent]  # emitted earlier: KeyError otherwise
            index[node.name] = len(names)
            names.append(node.name)
            tokens.append(self.token(node, self.depth(nodes, node), len(state.tokens)))
            parents.append(parent)
        probs, hidden = self.noise(tokens, state)
        side_nodes = None
        if side:
            side_nodes = SideNodes(torch.tensor(tokens[1:]), torch.tensor(parents[1:]), probs[1:])
        return DraftBlock(torch.tensor(tokens[:1]), probs[:1], hidden[:1], side=side_nodes, sampled=False)

    @staticmethod
    def depth(nodes: list[Node], node: Node) -> int:
        by_name = {n.name: n for n in nodes}
        depth = 1
        while node.parent is not None:
            node, depth = by_name[node.parent], depth + 1
        return depth

    def noise(self, tokens: list[int], state) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft distributions (peaked on each token by a seeded amount) and hidden states."""
        generator = torch.Generator().manual_seed(len(state.tokens) * 131 + state.step_index)
        logits = torch.randn(len(tokens), self.vocab, generator=generator)
        boost = torch.rand(len(tokens), generator=generator) * 10.0
        logits[torch.arange(len(tokens)), torch.tensor(tokens)] += boost
        return torch.softmax(logits, -1), torch.randn(len(tokens), self.hidden_size, generator=generator)


def expected_path(tree, right: list[int]) -> tuple[int, ...]:
    """The oracle: the deepest node whose root path is right token by token (``right[d - 1]`` at
    depth d), the lexicographically first root path (by node index) among equally deep ones."""
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    ok: dict[int, bool] = {-1: True}
    depth: dict[int, int] = {-1: 0}
    for i, parent in enumerate(parents):
        depth[i] = depth[parent] + 1
        ok[i] = ok[parent] and tokens[i] == right[depth[i] - 1]
    candidates = [tree.path_to(i) for i in range(len(tokens)) if ok[i]] + [[]]
    best = max(len(p) for p in candidates)
    return tuple(min(p for p in candidates if len(p) == best))


class TreeChecks:
    """Observer: after every step the verdict is the oracle's, the emitted tokens are the path's
    plus the next token (cut at EOS and the budget), the target's cache holds the committed prefix
    (all but the one pending token, or all at the end) and, for an HF target, its keys and values
    equal those of plain decoding of the committed tokens."""

    def __init__(self, resources, drafter: TreeScript, torch_model=None):
        self.target, self.drafter, self.torch_model = resources.target, drafter, torch_model
        self.records, self.full_trees = [], {}

    @hookimpl
    def pacer_start(self, state) -> None:
        self.records = []

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self.records.append(step)
        draft, verdict, tree = step.draft, step.verdict, step.draft.tree
        sequence, before = self.drafter.sequence, step.committed_before
        deepest = int(tree.depths.max()) if len(tree) else 0
        path = expected_path(tree, sequence[before : before + deepest + 1])
        assert verdict.nodes(draft) == path, (step.index, self.drafter.scenario[step.index])
        assert verdict.accepted == len(path) and verdict.next_token == sequence[before + len(path)]
        last = path[-1] if path else -1
        assert verdict.next_kind == ("recovered" if tree.children[last] else "bonus")
        assert step.target_argmax.shape == (len(tree) + 1,)
        untruncated = tree.tokens[list(path)].tolist() + [verdict.next_token]
        assert list(step.emitted) == untruncated[: len(step.emitted)] == state.tokens[before:]
        names = self.drafter.names[step.index]
        if len(names) == len(tree):  # nothing truncated: name the accepted nodes
            self.full_trees[step.index] = " ".join(names[i] for i in path)
        cached = list(self.target.cached_tokens)
        pending = 1 if len(step.emitted) > verdict.accepted else 0  # the next token, unless cut off
        assert cached == state.tokens[: len(state.tokens) - pending]
        finished = state.budget_left == 0 or step.emitted[-1] in state.eos_token_ids
        assert pending or finished
        if self.torch_model is not None:
            plain = adapter(self.torch_model, eos=False)
            plain.forward(cached, logits_from=len(cached))
            for a, b in zip(layer_tensors(self.target), layer_tensors(plain), strict=True):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5), step.index


@attrs.define
class NoOptions:
    pass


class TreePlugin:
    """An extra plugin offering the ``tree_script`` drafter and the ``tree_checks`` observer."""

    def __init__(
        self, sequence: list[int], vocab: int, hidden_size: int, eos=frozenset(), torch_model=None, offset: int = 0
    ):
        self.drafter = TreeScript(sequence, vocab, hidden_size, frozenset(eos), offset)
        self.torch_model = torch_model
        self.checks: Optional[TreeChecks] = None

    @hookimpl
    def pacer_components(self):
        return [
            Component(
                "drafter",
                "tree_script",
                NoOptions,
                lambda config, resources: self.drafter,
                provides={"draft_probs", "draft_hidden"},
            ),
            Component("observer", "tree_checks", NoOptions, self._checks),
        ]

    def _checks(self, config, resources):
        self.checks = TreeChecks(resources, self.drafter, self.torch_model)
        return self.checks


VERIFIERS = ("greedy", "speculative_sampling")
BASE_STOPS = {
    "fixed3": "{name: fixed, gamma: 3}",
    "fixed5": "{name: fixed, gamma: 5}",
    "heuristic": "{name: heuristic, gamma: 2}",
}
OPTIONAL_STOPS = [name for name in ("entropy", "pacer") if name in components(new_plugin_manager())["stop"]]
STOP_NAMES = list(BASE_STOPS) + OPTIONAL_STOPS


@pytest.fixture(scope="module")
def stop_specs(tmp_path_factory) -> dict[str, str]:
    """Strategy entries by stop name; ``pacer`` gets an untrained M_B for the tiny model's hidden size."""
    specs = dict(BASE_STOPS, entropy="{name: entropy}")
    if "pacer" in OPTIONAL_STOPS:
        folder = write_checkpoint(tmp_path_factory.mktemp("pacer_checkpoint"), llama("target").config.hidden_size)
        specs["pacer"] = f"{{name: pacer, checkpoint: '{folder}', b: 2, t0: 0.5, max_draft: 6}}"
    return specs


def tree_engine(plugin: TreePlugin, target, stop: str, verifier: str, observers=("tree_checks",)) -> Engine:
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: tree_script}",
            f"strategy.stop=[{stop}]",
            f"strategy.verifier={{name: {verifier}}}",
            f"strategy.observers=[{{name: metrics}}, {', '.join(f'{{name: {o}}}' for o in observers)}]",
        ],
        extra_plugins=[plugin],
        require_models=False,
    )
    return Engine.build(target, cfg=cfg, extra_plugins=[plugin])


@functools.cache
def greedy_sequence(kind: str, prompt: tuple[int, ...], length: int) -> tuple[int, ...]:
    """The target's greedy decoding, EOS ignored (it goes on after EOS): what the drafter drafts from."""
    return tuple(reference_greedy(llama(kind), list(prompt), length, eos=False))


def check_metrics(result, prompt, records) -> None:
    m = result.metrics
    assert m["emitted"] == len(result.tokens) == sum(len(r.emitted) for r in records)
    assert m["steps"] == len(records) and m["accepted"] == sum(r.verdict.accepted for r in records)
    assert m["drafted"] == sum(r.draft.depth for r in records)  # a tree's depth
    assert m["nodes_per_step"] == [r.draft.num_nodes for r in records]
    assert m["target_forwards"] == m["steps"]  # step 0 also prefills the prompt


@pytest.mark.parametrize("verifier", VERIFIERS)
@pytest.mark.parametrize("stop", STOP_NAMES)
def test_tree_engine_equals_greedy(stop, verifier, stop_specs):
    model = llama("target")
    accepted_paths = {}
    for number, (name, prompt) in enumerate(PROMPTS.items()):  # an engine per prompt (the drafter's sequence)
        sequence = list(prompt) + list(greedy_sequence("target", tuple(prompt), BUDGET + 20))
        plugin = TreePlugin(sequence, VOCAB, model.config.hidden_size, torch_model=model, offset=3 * number)
        engine = tree_engine(plugin, adapter(model, eos=False), stop_specs[stop], verifier)
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == sequence[len(prompt) : len(prompt) + BUDGET], name
        assert result.finish_reason == "length"
        records = plugin.checks.records
        check_metrics(result, prompt, records)
        scenarios = plugin.drafter.scenario
        for step, path in plugin.checks.full_trees.items():
            accepted_paths.setdefault(scenarios[step], set()).add(path)
        last = records[-1]
        assert scenarios[last.index] == "side_chain"
        # the budget ends inside the side chain: every emitted token an accepted side node
        assert len(last.emitted) == last.verdict.accepted > 0
        assert not set(last.draft.path_nodes) & set(last.verdict.nodes(last.draft))
    assert set(ROTATION) <= set(accepted_paths)  # every scenario drafted (and not cut by a Stop(keep))
    if stop == "fixed5":  # whole trees (the scheduled main paths have at most 5 nodes): the scheduled paths
        assert {s: accepted_paths[s] for s in ROTATION} == {s: {SCENARIOS[s][1]} for s in ROTATION}


def test_the_budget_ends_inside_a_side_branch():
    """Budgets below the side chain's depth: one step, the side chain cut at the budget, every
    emitted token an accepted side node (the next token dropped), nothing left pending."""
    model = llama("target")
    prompt = PROMPTS["plain"]
    sequence = list(prompt) + list(greedy_sequence("target", tuple(prompt), BUDGET + 20))
    for budget in (1, 2, 4, 7):
        plugin = TreePlugin(sequence, VOCAB, model.config.hidden_size, torch_model=model)
        engine = tree_engine(plugin, adapter(model, eos=False), BASE_STOPS["fixed3"], "greedy")
        result = engine.generate(prompt, max_new_tokens=budget)
        assert result.tokens == sequence[len(prompt) : len(prompt) + budget]
        (step,) = plugin.checks.records
        nodes = step.verdict.nodes(step.draft)
        assert len(nodes) == len(step.emitted) == budget and not set(nodes) & set(step.draft.path_nodes)
        assert len(step.draft) == min(budget, 3)  # the main path: fixed γ = 3, the budget
        assert list(engine.target.cached_tokens) == prompt + result.tokens


def test_eos_target_ends_early():
    """Precondition of the EOS tests: the biased target emits EOS after a few tokens, and its
    greedy continuation goes on after it (nodes after EOS can be accepted)."""
    for prompt in EOS_PROMPTS.values():
        tokens = reference_greedy(llama("eos_target"), prompt, 30, eos=True)
        assert tokens[-1] == EOS and EOS not in tokens[:-1] and 3 <= len(tokens) < 30
        assert list(greedy_sequence("eos_target", tuple(prompt), 40)[: len(tokens)]) == tokens


@pytest.mark.parametrize("verifier", VERIFIERS)
@pytest.mark.parametrize("stop", STOP_NAMES)
def test_eos_inside_a_branch_stops_like_generate(stop, verifier, stop_specs):
    model = llama("eos_target")
    for name, prompt in EOS_PROMPTS.items():
        expected = reference_greedy(model, prompt, 30, eos=True)
        sequence = list(prompt) + list(greedy_sequence("eos_target", tuple(prompt), 40))
        plugin = TreePlugin(sequence, VOCAB, model.config.hidden_size, eos={EOS}, torch_model=model)
        engine = tree_engine(plugin, adapter(model, eos=True), stop_specs[stop], verifier)
        result = engine.generate(prompt, max_new_tokens=30)
        assert result.tokens == expected and result.finish_reason == "eos", name
        check_metrics(result, prompt, plugin.checks.records)
        last = plugin.checks.records[-1]
        nodes = last.verdict.nodes(last.draft)
        tokens = last.draft.tree.tokens[list(nodes)].tolist()
        # EOS was accepted as a side node, and the nodes accepted after it were dropped
        assert EOS in tokens and last.emitted[-1] == EOS
        assert not set(nodes[: tokens.index(EOS) + 1]) & set(last.draft.path_nodes)
        if stop == "fixed5":
            assert tokens.index(EOS) < len(tokens) - 1, name


def test_side_nodes_deeper_than_the_main_path_survive_a_stop():
    """``Stop()`` without ``keep`` keeps the whole tree: the tip chain (depth 6) drafted with a
    3-token main path is verified whole under fixed γ = 3."""
    model = llama("target")
    prompt = PROMPTS["plain"]
    sequence = list(prompt) + list(greedy_sequence("target", tuple(prompt), BUDGET + 20))
    plugin = TreePlugin(sequence, VOCAB, model.config.hidden_size)
    engine = tree_engine(plugin, adapter(model, eos=False), BASE_STOPS["fixed3"], "greedy")
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == sequence[len(prompt) : len(prompt) + BUDGET]
    scenarios, full = plugin.drafter.scenario, plugin.checks.full_trees
    tip = [s for s in full if scenarios[s] == "tip_chain"]
    assert tip and all(full[s] == SCENARIOS["tip_chain"][1] for s in tip)
    assert max(len(r.emitted) for r in plugin.checks.records) == 7  # 6 accepted + the bonus, γ = 3


class HiddenRows:
    """Observer needing the target's hidden states: each step's rows against a plain forward."""

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
        expected = out.hidden_states[-1][0, step.target_hidden_start : cached]
        assert torch.allclose(rows.float(), expected, atol=1e-5)
        self.checked += 1


def test_target_hidden_rows_follow_the_accepted_path():
    model = llama("target")
    prompt = PROMPTS["plain"]
    sequence = list(prompt) + list(greedy_sequence("target", tuple(prompt), BUDGET + 20))
    plugin = TreePlugin(sequence, VOCAB, model.config.hidden_size)
    built = []

    class HiddenPlugin:
        @hookimpl
        def pacer_components(self):
            def factory(config, resources):
                built.append(HiddenRows(resources, model))
                return built[-1]

            return [Component("observer", "hidden_rows", NoOptions, factory, needs={"target_hidden"})]

    extra = [plugin, HiddenPlugin()]
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: tree_script}",
            f"strategy.stop=[{BASE_STOPS['fixed5']}]",
            "strategy.verifier={name: greedy}",
            "strategy.observers=[{name: tree_checks}, {name: hidden_rows}]",
        ],
        extra_plugins=extra,
        require_models=False,
    )
    engine = Engine.build(adapter(model, eos=False), cfg=cfg, extra_plugins=extra)
    result = engine.generate(prompt, max_new_tokens=BUDGET)
    assert result.tokens == sequence[len(prompt) : len(prompt) + BUDGET]
    assert built[0].checked == len(plugin.checks.records) > 1


def scripted_greedy(lm: ScriptedLM, prompt: list[int], length: int) -> list[int]:
    context = list(prompt)
    for _ in range(length):
        context.append(int(lm.next_logits(context).argmax()))
    return context


@pytest.mark.parametrize("stop", ["fixed5", "heuristic"])
def test_many_scripted_tree_runs_equal_greedy(stop):
    """Breadth on scripted targets (``ScriptedLM``: the cache is a token list with the same crop)."""
    for seed in range(8):
        target = ScriptedLM(VOCAB, seed, scale=3.0)
        prompt = [seed, seed + 1, 2 * seed + 3][: 1 + seed % 3]
        sequence = scripted_greedy(target, prompt, 60)
        plugin = TreePlugin(sequence, VOCAB, target.hidden_size)
        engine = tree_engine(plugin, target, BASE_STOPS[stop], VERIFIERS[seed % 2])
        result = engine.generate(prompt, max_new_tokens=40)
        assert result.tokens == sequence[len(prompt) : len(prompt) + 40], seed


# -- exact distribution of sampled trees -----------------------------------------------------------
TREE_SAMPLES = 4_000
FAIL_P = 1e-6  # a wrong verifier must fall below this one


@attrs.define
class SampledTreeConfig:
    width: int = attrs.field(default=2, validator=attrs.validators.ge(1))  # children per node
    depth: int = attrs.field(default=2, validator=attrs.validators.ge(1))  # levels per step
    sampled: bool = True  # children drawn i.i.d. from the draft (duplicates allowed), else its top-k


class SampledTree:
    """A full tree drafter on a ``ScriptedLM`` draft: every node of the last level gets ``width``
    children, one level per ``pacer_propose``; the main path is each main node's first child.
    Children are drawn i.i.d. from the draft's distribution after their parent (``sampled``), or
    are its ``width`` most likely tokens (point masses for the verifier)."""

    def __init__(self, config: SampledTreeConfig, resources):
        self.config, self.draft_lm, self.sampling = config, resources.draft, resources.sampling
        self.frontier: list[tuple[int, list[int]]] = []  # (tree node, its root path's context), main tip first
        self._q: dict[int, torch.Tensor] = {}  # the draft's filtered distribution by context key, [vocab]

    def q(self, context: list[int]) -> torch.Tensor:
        key = self.draft_lm.key(context)
        if key not in self._q:
            self._q[key] = logits_to_probs(self.draft_lm.next_logits(context), self.sampling)
        return self._q[key]

    @hookimpl
    def pacer_propose(self, state, draft, num_tokens) -> Optional[DraftBlock]:
        c = self.config
        if len(draft) == 0:
            self.frontier = [(-1, list(state.tokens))]
        if len(draft) >= c.depth or not self.frontier:
            return None
        q = torch.stack([self.q(context) for _, context in self.frontier])  # [f, vocab]
        if c.sampled:
            children = torch.multinomial(q, c.width, replacement=True, generator=state.generator)  # [f, width]
        else:
            children = q.topk(min(c.width, q.shape[1]), dim=-1).indices  # [f, width]
        tokens, parents, rows, frontier = [], [], [], []
        first = draft.num_nodes
        for f, (parent, context) in enumerate(self.frontier):
            for x in children[f].tolist():
                if not c.sampled and float(q[f, x]) == 0.0:
                    continue  # top-k/top-p left fewer tokens than the width
                frontier.append((first + len(tokens), context + [x]))
                tokens.append(x)
                parents.append(parent)
                rows.append(f)
        self.frontier = frontier
        probs = q[rows]  # [nodes, vocab]: each node's distribution is its parent's row
        side = None
        if len(tokens) > 1:
            side = SideNodes(torch.tensor(tokens[1:]), torch.tensor(parents[1:]), probs[1:])
        return DraftBlock(torch.tensor(tokens[:1]), probs[:1], side=side, sampled=c.sampled)


class FreshRowPerSibling:
    """WRONG: each sibling is tested against the target's fresh row p, not against the residual
    left by the siblings rejected before it (the recovered token is drawn from the right residual)."""

    def __init__(self, config, resources):
        self.sampling = resources.sampling

    @hookimpl
    def pacer_verify(self, state, draft, target_logits) -> Verdict:
        tree = draft.tree
        target_probs = logits_to_probs(target_logits, self.sampling)  # [N + 1, vocab]
        uniforms = torch.rand(len(tree), generator=state.generator).tolist()
        tokens, children, path, node = tree.tokens.tolist(), tree.children, [], -1
        while children[node]:
            fresh = residual = target_probs[node + 1]
            for child in children[node]:
                x = tokens[child]
                if bool(tree.sampled[child]):
                    q = tree.draft_probs[child]
                else:
                    q = torch.nn.functional.one_hot(torch.tensor(x), fresh.shape[0]).float()
                p_x, q_x = float(fresh[x]), float(q[x])
                if p_x > 0 and (p_x >= q_x or uniforms[child] * q_x < p_x):
                    path.append(child)
                    node = child
                    break
                residual = residual_distribution(residual, q)
            else:
                return Verdict(len(path), int(sample(residual, state.generator)), "recovered", path)
        return Verdict(len(path), int(sample(target_probs[node + 1], state.generator)), "bonus", path)


class TreeSamplingPlugins:
    """A plugin module offering the ``sampled_tree`` drafter and the wrong verifier."""

    __test__ = False

    @hookimpl
    def pacer_components(self) -> list[Component]:
        return [
            Component(
                "drafter",
                "sampled_tree",
                SampledTreeConfig,
                SampledTree,
                "test: a full tree of sampled or top-k children",
                needs={"draft_model"},
                provides={"draft_probs"},
            ),
            Component(
                "verifier",
                "test_fresh_row_per_sibling",
                NoOptions,
                FreshRowPerSibling,
                "WRONG: siblings tested against the fresh target row",
            ),
        ]


TREE_PLUGINS = (TreeSamplingPlugins(),)


@attrs.frozen
class TreeCase:
    children: str  # "sampled" or "topk"
    sampling: str = "t1"
    width: int = 2
    depth: int = 2
    verifier: str = "speculative_sampling"
    samples: int = TREE_SAMPLES

    def __str__(self) -> str:
        return f"{self.children}-w{self.width}-d{self.depth}-{self.sampling}-{self.verifier}-{self.samples}"


def measure_tree(case: TreeCase) -> tuple[float, float, float]:
    """Run ``case``; returns (chi-square p-value, steps per generation, CPU seconds)."""
    start = time.process_time()
    with single_thread():
        target = ScriptedLM(SCRIPTED_VOCAB, table=TARGET_TABLE.clone())
        draft = ScriptedLM(SCRIPTED_VOCAB, seed=1, table=DRAFT_TABLE.clone())
        drafter = (
            f"sampled_tree, width: {case.width}, depth: {case.depth}, "
            f"sampled: {str(case.children == 'sampled').lower()}"
        )
        engine = build_engine(
            target,
            draft,
            drafter,
            f"{{name: fixed, gamma: {case.depth}}}",
            SAMPLINGS[case.sampling],
            case.verifier,
            plugins=TREE_PLUGINS,
        )
        outputs, steps = sample_outputs(engine, PROMPT, case.samples)
        expected = exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling)
        p_value = chisquare_pvalue(outputs, expected)
    return p_value, steps, time.process_time() - start


@pytest.fixture(scope="module")
def measured(request):
    """``measured(case)`` → (p-value, steps per generation, CPU s), computed ahead in spawned
    workers (``helpers.precomputed``)."""
    with precomputed(request, measure_tree) as get:
        yield get


@pytest.fixture(scope="module", autouse=True)
def _workers_start_with_the_first_test(request):
    """The distribution cases take longest: the workers compute them while the tests above run."""
    if module_cases(request):
        request.getfixturevalue("measured")


def tree_grid():
    for children in ("sampled", "topk"):
        for sampling in SAMPLINGS:
            fast = (children, sampling) in (("sampled", "t1"), ("topk", "topp0.8"))  # the rest: slow, 20,000
            yield pytest.param(
                TreeCase(children, sampling, samples=TREE_SAMPLES if fast else 20_000),
                marks=() if fast else (pytest.mark.slow,),
                id=f"{children}-{sampling}",
            )
        yield pytest.param(
            TreeCase(children, "t1", width=3, depth=3, samples=20_000),
            marks=pytest.mark.slow,
            id=f"{children}-w3-d3-t1",
        )


@pytest.mark.parametrize("case", list(tree_grid()))
def test_tree_sampling_matches_target_distribution(case, measured):
    p_value, steps, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, steps/generation = {steps:.2f}, {seconds:.1f} s CPU")
    assert p_value > PASS_P
    assert 1.1 < steps < LENGTH - 0.2  # the trees were drafted, and both accepted and rejected


@pytest.mark.parametrize(
    "case",
    [
        TreeCase("sampled", verifier="test_fresh_row_per_sibling", samples=1_500),
        pytest.param(TreeCase("topk", verifier="test_fresh_row_per_sibling", samples=2_000), marks=pytest.mark.slow),
        pytest.param(
            TreeCase("sampled", "topk3", verifier="test_fresh_row_per_sibling", samples=2_000), marks=pytest.mark.slow
        ),
    ],
    ids=str,
)
def test_siblings_without_residual_update_fail_the_distribution_test(case, measured):
    p_value, _, seconds = measured(case)
    print(f"{case}: p = {p_value:.4g}, {seconds:.1f} s CPU")
    assert p_value < FAIL_P


def test_grown_levels_number_a_calls_nodes_as_draft_tree_numbers_a_block():
    """Three levels grown in one call become one block: the main path (one child a level) first,
    then the side nodes in the order they were grown, each under the node its row names in the level
    above (the call's first level: the nodes it grew from); each node is numbered once, by the block."""
    from pacer_core.trees import Candidate, GrownLevels

    grown = GrownLevels([2])  # grown from node 2, the earlier block's tip
    rows = torch.eye(4)
    grown.add([Candidate(0, 10, -0.1), Candidate(0, 11, -0.5)], rows[:2], torch.zeros(3))
    grown.add([Candidate(0, 20, -0.2), Candidate(1, 21, -0.6), Candidate(1, 22, -0.7)], rows[:3], torch.ones(3))
    grown.add([Candidate(0, 30, -0.3)], rows[3:], torch.ones(3))
    block, last = grown.block(first=3, forwards=2)
    assert block.tokens.tolist() == [10, 20, 30] and block.side.tokens.tolist() == [11, 21, 22]
    # the main path is nodes 3, 4, 5; the side nodes 6, 7, 8 (11 under node 2, 21 and 22 under 11)
    assert block.side.parents.tolist() == [2, 6, 6] and last == [5]
    assert block.hidden_states.shape == (3, 3) and block.forwards == 2 and not block.sampled
    earlier = DraftBlock(torch.tensor([1, 2, 3]), torch.eye(4)[:3], sampled=False)
    tree = Draft((earlier, block)).tree
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4, 2, 6, 6]
    assert torch.equal(tree.draft_probs[3:], torch.cat([rows[[0, 0, 3]], rows[[1, 1, 2]]]))
    without_hidden = GrownLevels()  # from the root
    without_hidden.add([Candidate(0, 5, 0.0), Candidate(0, 6, -1.0)], rows[:2])
    root_block, root_last = without_hidden.block(first=0, forwards=1)
    assert root_block.hidden_states is None and root_block.side.parents.tolist() == [-1] and root_last == [0, 1]
