"""The ``dflash`` block drafter (plugins/block_draft): its network, the packed training layout against
the drafter's own forward, the best-first tree over a block, greedy equivalence for chains and trees
under every stop kind, the exact output distribution under sampling (with a deliberately wrong
variant the test rejects), the student of ``pacer distill student.kind=dflash``, and its refusals."""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import subprocess
from pathlib import Path
from typing import cast

import attrs
import pytest
import torch

from pacer_core import Draft, DraftVocab, SamplingParams, hookimpl
from pacer_core.block_trees import BlockTree, block_tree
from pacer_core.cost_profiles import load_profile
from pacer_core.testing import chisquare_pvalue, exact_continuation_probs
from pacer_plugins.block_draft.drafter import DFlashDrafter
from pacer_plugins.block_draft.model import ContextCache, load_block_draft
from pacer_plugins.block_draft.students import block_layout, block_loss, block_outputs, evaluate_blocks

from helpers import (
    LENGTH,
    PASS_P,
    adapter,
    block_engine,
    make_block_draft,
    misreport_block_rows,
    one_line_error,
    reference_greedy,
    sample_outputs,
    single_thread,
    tiny_llama,
)

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = [[3, 7, 11, 5], [1, 2, 3], [5], [9, 9, 9, 9, 9, 9]]
BUDGET = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A peaky tiny Llama target (vocabulary 16) and a random block draft of block 3 over tokens 0..7."""
    target = tiny_llama(0, vocab=16, scale=3.0)
    folder = make_block_draft(target, tmp_path_factory.mktemp("dflash") / "draft", peak=3.0)
    return target, folder


def fused_states(target_model, tokens: list[int], layers=(0, 1)) -> torch.Tensor:
    """[len, n·d] the inputs of ``layers`` of the target at every position of ``tokens``."""
    with torch.no_grad():
        out = target_model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1)


# -- the network and its training layout ---------------------------------------------------------
def test_block_layout_on_a_worked_example():
    layout = block_layout([3], 1, 2, 8)
    assert layout.tokens.tolist() == [3, 4, -1, -1] and layout.positions.tolist() == [3, 4, 5, 6]
    assert layout.predicts.tolist() == [[5, 6]] and layout.mask_rows.tolist() == [[2, 3]]
    assert layout.latest.tolist() == [2, 2, 2, 2]  # every row joins the feature of position 2
    seen = layout.mask.int().tolist()
    assert all(row == [1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1] for row in seen)


def test_two_packed_blocks_never_see_each_other():
    layout = block_layout([2, 5], 0, 2, 10)
    rows = 3
    assert not layout.mask[:rows, 10 + rows :].any() and not layout.mask[rows:, 10 : 10 + rows].any()
    assert layout.mask[rows:, :5].all() and not layout.mask[rows:, 5:10].any()


def test_the_context_cache_grown_in_pieces_equals_one_pass(pair):
    target, folder = pair
    net = load_block_draft(folder)
    states = fused_states(target, [3, 7, 11, 5, 2, 9])
    whole, pieces = ContextCache(2), ContextCache(2)
    net.extend_context(whole, states)
    for chunk in (states[:2], states[2:3], states[3:]):
        net.extend_context(pieces, chunk)
    for a, b in zip(whole.keys + whole.values, pieces.keys + pieces.values):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_pending_context_rows_cropped_then_projected_equal_one_pass(pair):
    """States kept pending (steps the draft gate decoded plainly), cropped as steps are rolled back and
    projected at the next draft, give the keys, values and newest feature of one pass over the kept rows."""
    target, folder = pair
    net = load_block_draft(folder)
    states = fused_states(target, [3, 7, 11, 5, 2, 9, 4])
    cache = ContextCache(2)
    net.extend_context(cache, states[:2])
    cache.pending += [states[2:4], states[4:7]]
    assert (len(cache), cache.known) == (2, 7)
    cache.crop(5)  # into the second pending chunk
    assert cache.known == 5 and [int(rows.shape[0]) for rows in cache.pending] == [2, 1]
    cache.crop(9)  # past the end: nothing changes
    assert cache.known == 5
    net.extend_context(cache, cast(torch.Tensor, cache.take_pending()))
    assert cache.take_pending() is None and not cache.pending
    whole = ContextCache(2)
    net.extend_context(whole, states[:5])
    for a, b in zip(whole.keys + whole.values + [whole.latest], cache.keys + cache.values + [cache.latest]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    cache.pending.append(states[5:7])
    cache.crop(3)  # into the projected rows: the pending ones go, the newest feature is unknown
    assert (len(cache), cache.known, cache.latest) == (3, 3, None)


@pytest.fixture(scope="module")
def published_pair(pair, tmp_path_factory):
    """The same target and a random block draft in the published architecture (no ``inject``, q/k norms)."""
    target, _ = pair
    return target, make_block_draft(target, tmp_path_factory.mktemp("dflash-pub") / "draft", peak=3.0, published=True)


@pytest.mark.parametrize("known", [0, 2])
@pytest.mark.parametrize("architecture", ["ours", "published"])
def test_training_blocks_compute_what_the_drafter_computes(pair, published_pair, known, architecture):
    """The packed training forward (several anchors, one mask) gives every block's mask rows exactly
    what the drafter's one-block forward gives at that anchor: what is trained is what is served, in
    our architecture and the published one (``student.published``)."""
    target, folder = pair if architecture == "ours" else published_pair
    net = load_block_draft(folder)
    assert net.arch.inject == (architecture == "ours") and net.arch.qk_norm == (architecture == "published")
    tokens = [3, 7, 11, 5, 2, 9, 4, 1, 6, 8, 12, 3]
    states = fused_states(target, tokens)
    embed = target.model.embed_tokens.weight.detach()
    anchors = [1, 4, 6]
    layout = block_layout(anchors, known, 3, len(tokens))
    packed = block_outputs(net, embed, torch.tensor([tokens]), states[None], layout)[0]  # [K, block, d]
    for k, a in enumerate(anchors):
        cache = ContextCache(2)
        net.extend_context(cache, states[:a])
        x = net.block_inputs(embed[tokens[a : a + known + 1]][None], 3, cache.latest[None])
        context = [(key[None], value[None]) for key, value in zip(cache.keys, cache.values)]
        alone = net(x, torch.arange(a, a + known + 4), context)[0, known + 1 :]
        torch.testing.assert_close(packed[k], alone, rtol=1e-4, atol=1e-5)


def test_the_block_loss_falls_when_trained(pair):
    target, folder = pair
    net = load_block_draft(folder).train()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 16, (2, 12), generator=generator)
    with torch.no_grad():
        out = target.model(input_ids=tokens, output_hidden_states=True)
    feats, fused = out.last_hidden_state, torch.cat([out.hidden_states[0], out.hidden_states[1]], -1)
    head = target.lm_head.weight.detach()
    layout = block_layout([1, 4, 7], 0, 3, 12)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss, parts = block_loss(
            net, target.model.embed_tokens.weight.detach(), head[net.subset], tokens, feats, fused, layout, decay=0.8
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.85 * losses[0] and 0.0 <= parts["top1"] <= 1.0
    metrics = evaluate_blocks(
        net, target.model.embed_tokens.weight.detach(), head, tokens, fused, (feats @ head.T).argmax(-1), stride=2
    )
    assert len(metrics["heldout_position_agreement"]) == 3 and 0 <= metrics["heldout_block_accepted"] <= 3


# -- the tree over a block -----------------------------------------------------------------------
def brute_best(rows: torch.Tensor, topk: int, nodes: int) -> set[tuple[int, ...]]:
    """The ``nodes`` paths (tuples of ranks) of highest joint probability, by enumeration."""
    top_p = rows.topk(topk, -1).values.double().tolist()
    paths = [path for d in range(1, rows.shape[0] + 1) for path in itertools.product(range(topk), repeat=d)]
    score = {path: sum(math.log(top_p[i][r]) for i, r in enumerate(path)) for path in paths}
    return set(heapq.nsmallest(nodes, paths, key=lambda path: (-score[path], len(path))))


@pytest.mark.parametrize("seed, topk, nodes", [(0, 2, 5), (1, 3, 8), (2, 3, 20), (3, 4, 12)])
def test_the_block_tree_takes_the_likeliest_nodes(seed, topk, nodes):
    rows = torch.softmax(torch.randn(3, 10, generator=torch.Generator().manual_seed(seed)) * 2, -1)
    block = block_tree(rows, None, topk, nodes).next_levels(3, 0)
    tokens = block.tokens.tolist() + (block.side.tokens.tolist() if block.side else [])
    parents = list(range(-1, len(block) - 1)) + (block.side.parents.tolist() if block.side else [])
    assert len(tokens) == min(nodes, sum(topk**d for d in range(1, 4)))
    order = rows.argsort(dim=-1, descending=True, stable=True).tolist()

    def depth(i):
        return 0 if parents[i] < 0 else 1 + depth(parents[i])

    def path(i):  # the ranks of node i's tokens, root first
        ranks = []
        while i >= 0:
            ranks.append(order[depth(i)][:topk].index(tokens[i]))
            i = parents[i]
        return tuple(reversed(ranks))

    assert {path(i) for i in range(len(tokens))} == brute_best(rows, topk, nodes)
    assert all(p < i for i, p in enumerate(parents))  # parents first
    assert block.tokens.tolist() == rows.argmax(-1)[: len(block)].tolist()  # the main path: each row's argmax


def test_the_block_tree_on_its_worked_example():
    rows = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]])
    block = block_tree(rows, None, 2, 3).next_levels(2, 0)
    assert block.tokens.tolist() == [0, 0] and block.side.tokens.tolist() == [1]
    assert block.side.parents.tolist() == [-1] and not block.sampled


def test_the_block_tree_maps_columns_and_stops_at_eos():
    rows = torch.tensor([[0.7, 0.3], [0.9, 0.1]])
    vocab = DraftVocab(torch.tensor([5, 2]), 8)
    block = block_tree(rows, None, 2, 6, vocab, eos={2}).next_levels(2, 0)
    assert block.tokens.tolist() == [5, 5] and block.side.tokens.tolist() == [2, 2]
    assert block.side.parents.tolist() == [-1, 0]  # nothing under the end-of-sequence token
    assert block.draft_probs.shape == (2, 8) and float(block.draft_probs[0, 5]) == pytest.approx(0.7)


def test_the_block_tree_reads_a_side_nodes_children_from_its_reweighted_row():
    """The docstring's example: b's children {d: log 2} make d its first child, read from a row of its own."""
    rows = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]])

    def reweight(d, path):
        return {1: math.log(2.0)} if path == [1] else {}

    block = block_tree(rows, None, 2, 5, reweight=reweight).next_levels(2, 0)
    assert block.tokens.tolist() == [0, 0]  # the main path: each row's argmax, its rows the block's
    assert block.side.tokens.tolist() == [1, 1, 1] and block.side.parents.tolist() == [-1, 0, 2]
    own = torch.tensor([0.5, 0.8, 0.1]) / 1.4
    assert torch.allclose(block.side.draft_probs[2], own)  # b -> d reads b's row
    assert torch.allclose(block.side.draft_probs[1], rows[1])  # a -> d reads row 1 as it is
    assert block.draft_probs.shape == (2, 3) and torch.allclose(block.draft_probs, rows)


@pytest.mark.parametrize("seed, topk, nodes", [(0, 2, 6), (1, 3, 10), (2, 3, 20)])
def test_the_reweighted_block_tree_takes_the_likeliest_nodes_under_each_paths_row(seed, topk, nodes):
    """Against enumeration: each node's probability is the product, along its path, of its depth's row
    reweighted for its parent's path (here by a pseudo-random Δ on a few columns per path, the main
    path's none); every node's row is the one its probability was read from."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.softmax(torch.randn(3, 8, generator=generator) * 2, -1)
    main = rows.argmax(-1).tolist()

    def reweight(d, path):
        if path == main[:d]:
            return {}
        picks = torch.Generator().manual_seed(hash(tuple(path)) % 1000)
        columns = torch.randperm(8, generator=picks)[:3].tolist()
        return {c: float(v) for c, v in zip(columns, torch.randn(3, generator=picks) * 2)}

    def row(path):  # the row the children of ``path`` are read from
        delta, base = reweight(len(path), list(path)), rows[len(path)].double()
        weights = torch.tensor([math.exp(delta.get(c, 0.0)) for c in range(8)], dtype=torch.float64)
        return base * weights / float((base * weights).sum())

    def children(path):
        top = row(path).topk(topk)
        return list(zip(top.indices.tolist(), top.values.tolist()))

    best, frontier = {}, [((), 0.0)]
    while frontier:  # every path of up to three tokens, each token among its parent's row's top k
        path, score = frontier.pop()
        if len(path) < 3:
            for token, p in children(path):
                best[path + (token,)] = score + math.log(p)
                frontier.append((path + (token,), score + math.log(p)))
    wanted = set(heapq.nsmallest(nodes, best, key=lambda path: (-best[path], len(path))))
    block = block_tree(rows, None, topk, nodes, reweight=reweight).next_levels(3, 0)
    tokens = block.tokens.tolist() + block.side.tokens.tolist()
    parents = list(range(-1, len(block) - 1)) + block.side.parents.tolist()
    table = torch.cat([block.draft_probs, block.side.draft_probs])

    def path(i):
        return (path(parents[i]) if parents[i] >= 0 else ()) + (tokens[i],)

    assert {path(i) for i in range(len(tokens))} == wanted
    for i in range(len(tokens)):  # each node's row: its parent's path's
        assert torch.allclose(table[i].double(), row(path(i)[:-1]), atol=1e-6)


def test_a_side_node_of_a_block_tree_follows_its_own_paths_lookup_prior(pair):
    """Logits flat over tokens 1-5 (2 a little ahead in the first row) and the committed text 1 2 3 1 4 5 1:
    the lookup prior makes 2 and 4 the first row's likeliest (each followed 1), the main path 2 3 1; the
    side node 4's child follows 4 as the text did (5), where without the reweighting it would be the
    main path's successor (3)."""
    target, folder = pair
    engine = block_engine(target, folder, extra=["sampling.temperature=0"])
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, DFlashDrafter))
    drafter.pacer_start(None)
    committed, columns = [1, 2, 3, 1, 4, 5, 1], drafter.draft_vocab.columns
    assert (columns[1:6] >= 0).all()  # each of them a column of the draft
    logits = torch.full((3, len(drafter.draft_vocab.ids)), -30.0)
    logits[:, columns[1:6]] = 0.0
    logits[0, columns[2]] = 0.5
    rows, chosen = drafter._rows(logits, committed, [], None)
    main = drafter._token_ids(chosen)
    assert main == [2, 3, 1]
    reweight = drafter._path_reweight(committed, main)
    for prior, child in ((reweight, 5), (None, 3)):
        block = block_tree(rows, None, 2, 5, drafter.draft_vocab, frozenset(), prior).next_levels(3, 0)
        assert block.tokens.tolist() == main
        assert block.side.tokens.tolist() == [4, child] and block.side.parents.tolist() == [-1, 3]


def test_side_paths_are_reweighted_by_the_lookup_prior_alone(pair, tmp_path):
    """The corpus prior stays the main path's on a side path: with it alone nothing is reweighted; with the
    lookup prior beside it a side path's Δ is the lookup bonuses' difference alone. Committed 1 2 3 1 4 5 1
    and the main path 2 3 1: under the side token 4 (whose lookups 4 → 5 and 1 4 → 5 give 5 2 + 4; 5 1 4
    never occurred), against the main path's 2 (2 → 3, 1 2 → 3: 3 gets 2 + 4), Δ = {5: +6, 3: −6}; the
    corpus's successors (a → 5a + 3 mod 8: 4 → 7, 2 → 5) would have added 7: +3 and 5: −3."""
    target, folder = pair
    committed, main = [1, 2, 3, 1, 4, 5, 1], [2, 3, 1]
    corpus_only = corpus_prior(tmp_path, 3.0, 8)
    for lookup, expected in (("[]", None), ("[2, 4, 4]", {5: 6.0, 3: -6.0})):
        extra = ["sampling.temperature=0", *corpus_only[1:], f"strategy.drafter.lookup_bias={lookup}"]
        drafter = next(
            p for p in block_engine(target, folder, extra=extra).pm.get_plugins() if isinstance(p, DFlashDrafter)
        )
        drafter.pacer_start(None)
        assert drafter.corpus is not None
        drafter.index.extend(committed)
        reweight = drafter._path_reweight(committed, main)
        if expected is None:
            assert reweight is None
            continue
        columns = drafter.draft_vocab.columns
        assert reweight(1, [4]) == {int(columns[t]): v for t, v in expected.items()}
        assert reweight(1, [2]) == {}  # the main path reads its row as it is


# -- greedy: equal to the target's own decoding --------------------------------------------------
STOPS = {
    "fixed1": "{name: fixed, gamma: 1}",
    "fixed4": "{name: fixed, gamma: 4}",
    "fixed7": "{name: fixed, gamma: 7}",
    "heuristic": "{name: heuristic, gamma: 2}",
    "confidence": "{name: confidence, threshold: 0.3}",
    "pacer": "{name: pacer, b: 3, max_draft: 8}",
}
DEEP = "{topk: 3, depth: 7, nodes: 12}"  # three blocks of 3: the further ones on the main path
TREES = {
    "chain": None,
    "tree6": "{topk: 3, depth: 3, nodes: 6}",
    "deep": DEEP,
    "auto_cpu": "{topk: 3, depth: 3, nodes: auto, profile: cpu-2core-smollm2-fp32}",
    "auto_gpu": "{topk: 4, depth: 3, nodes: auto, profile: a100-7b-bf16}",
}


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("stop", STOPS)
def test_greedy_block_drafting_equals_plain_decoding(pair, tmp_path, stop, tree):
    target, folder = pair
    extra = ["sampling.temperature=0"]
    if stop == "pacer":
        from helpers import write_checkpoint

        checkpoint = write_checkpoint(tmp_path / "mb", adapter(target).hidden_size)
        stop_spec = STOPS[stop].replace("}", f", checkpoint: '{checkpoint}', allow_other_pair: true}}")
    else:
        stop_spec = STOPS[stop]
    engine = block_engine(target, folder, stop=stop_spec, tree=TREES[tree], extra=extra)
    accepted = 0
    for prompt in PROMPTS:  # one engine, several prompts: no state leaks from one to the next
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == reference_greedy(target, prompt, BUDGET), prompt
        accepted += result.metrics["accepted"]
        for drafted, forwards in zip(result.metrics["drafted_per_step"], result.metrics["draft_forwards_per_step"]):
            # a forward per block of 3 (one more when a stop cut the last block), one per tree block
            assert forwards <= (3 if tree == "deep" else 1 if TREES[tree] else -(-drafted // 3) + 1)
    assert accepted > 0


def test_a_tree_deeper_than_the_block_drafts_further_blocks_on_its_main_path(pair):
    """``tree.depth`` 7 over blocks of 3: each step runs up to three forwards, each further block
    conditioned on the main path drafted before it (each row's argmax), and its tree reaches below
    the first block."""
    target, folder = pair
    engine = block_engine(  # no prior: each row's argmax is its raw logits'
        target, folder, stop="{name: fixed, gamma: 7}", tree=DEEP, lookup_bias="[]", extra=["sampling.temperature=0"]
    )
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, DFlashDrafter))
    forward, calls, seen = drafter._forward, [], []

    def recording(committed, known):
        out = forward(committed, known)
        calls.append((list(known), [drafter.columns.id_list[c] for c in out[0].argmax(-1).tolist()]))
        return out

    drafter._forward = recording

    class Probe:
        @hookimpl
        def pacer_observe_step(self, state, step):
            seen.append((len(step.draft), step.draft_forwards))

    engine.pm.register(Probe())
    result = engine.generate(PROMPTS[0], max_new_tokens=BUDGET)
    assert result.tokens == reference_greedy(target, PROMPTS[0], BUDGET)
    assert any(depth > 3 and forwards == 3 for depth, forwards in seen)
    for (known, argmax), (further, _) in zip(calls, calls[1:]):
        if further:  # a further block: the tokens before it, then the previous block's argmax path
            assert further == known + argmax


def test_one_forward_serves_a_whole_block_to_a_per_token_stop(pair):
    """``fixed(1)`` asks for one token at a time: a chain takes one forward per block of 3, and a
    further block is conditioned on the tokens drafted before it."""
    target, folder = pair
    engine = block_engine(target, folder, stop="{name: fixed, gamma: 6}", extra=["sampling.temperature=0"])
    seen = []

    class Probe:
        @hookimpl
        def pacer_observe_step(self, state, step):
            seen.append((len(step.draft), step.draft_forwards))

    engine.pm.register(Probe())
    engine.generate(PROMPTS[0], max_new_tokens=BUDGET)
    assert (6, 2) in seen  # six tokens, two forwards


@pytest.mark.parametrize("drafter", ["dflash", "hybrid"])
def test_cost_models_price_the_block_drafters_forward_once_a_block(pair, drafter):
    """A profile prices a draft forward: the ``pacer`` stop's throughput rule (which adds a price per
    draft token), cost-sized trees and the draft gate (a price per forward) all read the drafter's
    block from its ``DraftInfo``, so a whole block of 3 costs one forward, not three."""
    target, folder = pair
    profile = load_profile("a100-7b-bf16")
    forward = profile.draft_forward("block")
    tree = "{topk: 2, depth: 3, nodes: auto, profile: a100-7b-bf16}"
    extra = ["generation.skip_drafting.enabled=true"]
    if drafter == "hybrid":  # the main member's block
        extra.append(
            f"strategy.drafter={{name: hybrid, members: [{{name: dflash, path: '{folder}', tree: {tree}}}, "
            "{name: prompt_lookup}]}"
        )
    stop = "{name: pacer, rule: throughput, b: 3, max_draft: 6, predictor: draft_confidence, profile: a100-7b-bf16}"
    engine = block_engine(target, folder, stop=stop, tree=tree, extra=extra)
    stops = [p for p in engine.pm.get_plugins() if type(p).__name__ == "PacerStop"]
    assert len(stops) == 1 and stops[0].cost.tokens_per_forward == 3
    assert stops[0].cost.draft(3) == pytest.approx(forward)  # a block's three tokens: one forward
    gate_cost = engine.gate.cost  # the drafter's cost-sized tree prices the gate
    assert gate_cost.tokens_per_forward == 3 and gate_cost.draft_forward_s == pytest.approx(forward)


@pytest.mark.parametrize("lookup_bias, expected", [("null", [2, 1, 2]), ("[]", [0, 0, 0])], ids=["prior", "none"])
def test_the_lookup_prior_raises_the_successors_of_each_rows_path(pair, lookup_bias, expected):
    """Row i's logits get b_n for each token that followed the last n tokens of its path (the committed
    text, then the rows chosen before it) in the committed text: over flat logits, the chain follows the
    text's alternation, and each row's distribution is the one its token was chosen from."""
    target, folder = pair
    engine = block_engine(target, folder, lookup_bias=lookup_bias, extra=["sampling.temperature=0"])
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, DFlashDrafter))
    drafter.pacer_start(None)
    logits = torch.zeros(3, len(drafter.draft_vocab.ids))
    rows, columns = drafter._rows(logits, [1, 2, 1, 2, 1], [], None)
    assert drafter._token_ids(columns) == expected
    if lookup_bias == "null":  # 1 → 2 (b_1 = 2), 2 1 → 2 (b_2 = 4), 1 2 1 → 2 (b_3 = 4): e^10 against 1 each
        column = drafter.draft_vocab.columns[2]
        assert rows[0, column].item() == pytest.approx(math.exp(10) / (math.exp(10) + rows.shape[1] - 1))
    else:
        assert torch.allclose(rows, torch.full_like(rows, 1 / rows.shape[1]))


def corpus_prior(tmp_path, bias: float, width: int) -> list[str]:
    """Overrides giving the drafter a corpus prior of ``bias`` over a corpus where token a is followed by
    5a + 3 mod ``width`` (five times each: frequent enough to count), and no lookup prior."""
    docs = [[a, (5 * a + 3) % width] for a in range(16)] * 5
    (tmp_path / "corpus.json").write_text(json.dumps(docs))
    return [
        "strategy.drafter.lookup_bias=[]",
        f"strategy.drafter.corpus_bias={bias}",
        f"strategy.drafter.corpus={tmp_path / 'corpus.json'}",
    ]


def test_the_corpus_prior_raises_the_corpus_successors_of_each_rows_path(pair, tmp_path):
    """Row i's logits get corpus_bias × share for the successors of its path's longest frequent n-gram in
    the corpus (the path: the committed text, then the rows chosen before it); greedy output stays the
    target's."""
    target, folder = pair
    engine = block_engine(target, folder, extra=["sampling.temperature=0", *corpus_prior(tmp_path, 3.0, 8)])
    result = engine.generate(PROMPTS[0], max_new_tokens=BUDGET)
    assert result.tokens == reference_greedy(target, PROMPTS[0], BUDGET)
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, DFlashDrafter))
    assert drafter.corpus is not None and drafter.suffix_length == drafter.corpus.longest
    drafter.pacer_start(None)
    logits = torch.zeros(3, len(drafter.draft_vocab.ids))
    rows, columns = drafter._rows(logits, [1], [], None)
    assert drafter._token_ids(columns) == [0, 3, 2]  # 1 → 5 + 3 = 0 mod 8 → 3 → 18 = 2 mod 8
    column = drafter.draft_vocab.columns[0]
    assert rows[0, column].item() == pytest.approx(math.exp(3) / (math.exp(3) + rows.shape[1] - 1))


def test_the_drafter_keeps_only_committed_context(pair):
    target, folder = pair
    engine = block_engine(target, folder, extra=["sampling.temperature=0"])
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, DFlashDrafter))
    result = engine.generate(PROMPTS[0], max_new_tokens=BUDGET)
    # every committed token but the last; the last step's rows are projected when it next drafts
    assert drafter.context.known == len(PROMPTS[0]) + len(result.tokens) - 1
    assert 0 < len(drafter.context) < drafter.context.known


# -- sampling: exactly the target's distribution -------------------------------------------------
# every token once, then the first again: every token has a successor in the text, so the lookup prior
# raises one token of every drafted row
SAMPLE_PROMPT = [5, 9, 1, 14, 3, 12, 7, 0, 10, 6, 15, 2, 8, 13, 4, 11, 5]


def sampled_pvalue(folder, target_model, tree, samples, monkeypatch=None, wrong=None, lookup_bias="null", extra=()):
    """The chi-square p-value of ``samples`` sampled generations (T = 1, speculative sampling), with the
    drafter's ``lookup_bias`` (null: the default prior) and the overrides ``extra``; ``wrong``: the
    drafter reports another distribution than each token was drawn from (``misreport_block_rows``)."""
    if wrong:
        misreport_block_rows(monkeypatch, DFlashDrafter, wrong)
    engine = block_engine(
        target_model,
        folder,
        stop="{name: fixed, gamma: 3}",
        tree=tree,
        eos=False,
        lookup_bias=lookup_bias,
        extra=[
            "sampling.temperature=1.0",
            "strategy.verifier={name: speculative_sampling}",
            "generation.ignore_eos=true",
            *extra,
        ],
    )
    outputs, _ = sample_outputs(engine, SAMPLE_PROMPT, samples)
    expected = exact_continuation_probs(
        adapter(target_model, eos=False), SAMPLE_PROMPT, LENGTH, SamplingParams(temperature=1.0)
    )
    return chisquare_pvalue(outputs, expected)


@pytest.fixture(scope="module")
def sampling_pair(tmp_path_factory):
    """A peaky target (scale 15: few likely continuations) and a random block draft over its whole
    vocabulary, so drafted tokens are accepted and rejected alike."""
    target = tiny_llama(0, vocab=16, scale=15.0)
    return target, make_block_draft(target, tmp_path_factory.mktemp("dflash-s") / "draft", subset_size=16, peak=3.0)


SAMPLED = [
    pytest.param(
        tree,
        bias,
        id=f"{tree_id}-{bias_id}",
        marks=pytest.mark.slow if tree == DEEP and bias != "null" else (),  # the deep tree's default prior: fast
    )
    for tree, tree_id in ((None, "chain"), ("{topk: 3, depth: 3, nodes: 6}", "tree"), (DEEP, "deep"))
    for bias, bias_id in (("null", "prior"), ("[6.0]", "strong-prior"), ("[]", "no-prior"))
]


@pytest.mark.parametrize("tree, lookup_bias", SAMPLED)
def test_sampled_block_drafting_matches_the_target_distribution(sampling_pair, tree, lookup_bias):
    target, folder = sampling_pair
    with single_thread():
        assert sampled_pvalue(folder, target, tree, 600, lookup_bias=lookup_bias) > PASS_P


@pytest.mark.parametrize("wrong", ["columns", "prior"])
def test_rows_misreported_fail_the_distribution_test(sampling_pair, monkeypatch, wrong):
    target, folder = sampling_pair
    with single_thread():
        # a strong one-token prior: the reported rows then differ from the drawn ones at every row
        assert sampled_pvalue(folder, target, None, 600, monkeypatch, wrong=wrong, lookup_bias="[6.0]") < 1e-6


@pytest.mark.parametrize("tree", [None, "{topk: 3, depth: 3, nodes: 6}"], ids=["chain", "tree"])
def test_sampled_block_drafting_with_the_corpus_prior_matches_the_target_distribution(sampling_pair, tmp_path, tree):
    target, folder = sampling_pair
    with single_thread():
        prior = corpus_prior(tmp_path, 30.0, 16)  # outweighs the draft's own logits: one token a row
        assert sampled_pvalue(folder, target, tree, 600, extra=prior) > PASS_P


def test_rows_reported_without_the_corpus_prior_fail_the_distribution_test(sampling_pair, tmp_path, monkeypatch):
    target, folder = sampling_pair
    with single_thread():
        prior = corpus_prior(tmp_path, 30.0, 16)
        assert sampled_pvalue(folder, target, None, 600, monkeypatch, wrong="prior", extra=prior) < 1e-6


@pytest.fixture(scope="module")
def narrow_sampling_pair(tmp_path_factory):
    """The peaky target of ``sampling_pair`` and a random block draft over tokens 0..7 only: the prompt's
    other tokens join its columns through ``context_vocab`` (on by default for a draft made here)."""
    target = tiny_llama(0, vocab=16, scale=15.0)
    return target, make_block_draft(target, tmp_path_factory.mktemp("dflash-n") / "draft", subset_size=8, peak=3.0)


def test_the_context_vocabulary_adds_the_committed_tokens_outside_the_subset(narrow_sampling_pair):
    target, folder = narrow_sampling_pair
    engine = block_engine(target, folder, extra=["sampling.temperature=0"])
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, DFlashDrafter))
    result = engine.generate(SAMPLE_PROMPT, max_new_tokens=BUDGET)
    assert result.tokens == reference_greedy(target, SAMPLE_PROMPT, BUDGET)
    ids = drafter.columns.id_list
    assert ids[:8] == list(range(8)) and sorted(ids[8:]) == list(range(8, 16))  # the prompt holds every token
    assert drafted_tokens(engine, SAMPLE_PROMPT) & set(range(8, 16))  # and they are drafted
    # each added column's logits are the draft's hidden states against the token's row of the target's head
    hidden = torch.randn(2, adapter(target).hidden_size)
    head = adapter(target).embedding_weights()[1].float()
    assert torch.allclose(drafter.columns.logits(hidden, hidden @ head[:8].T), hidden @ head[ids].T, atol=1e-5)
    off = block_engine(target, folder, extra=["sampling.temperature=0", "strategy.drafter.context_vocab=false"])
    plain = next(p for p in off.pm.get_plugins() if isinstance(p, DFlashDrafter))
    assert off.generate(SAMPLE_PROMPT, max_new_tokens=BUDGET).tokens == result.tokens
    assert plain.columns.id_list == list(range(8))


def drafted_tokens(engine, prompt) -> set[int]:
    """The tokens ``engine`` drafts while generating after ``prompt``."""
    drafted: set[int] = set()

    class Probe:
        @hookimpl
        def pacer_observe_step(self, state, step):
            drafted.update(step.draft.tokens.tolist())

    engine.pm.register(Probe())
    engine.generate(prompt, max_new_tokens=BUDGET)
    return drafted


@pytest.mark.parametrize("tree", [None, "{topk: 3, depth: 3, nodes: 6}"], ids=["chain", "tree"])
@pytest.mark.parametrize("lookup_bias", ["null", "[6.0]"], ids=["prior", "strong-prior"])
def test_sampled_block_drafting_over_the_context_vocabulary_matches_the_target_distribution(
    narrow_sampling_pair, tree, lookup_bias
):
    target, folder = narrow_sampling_pair
    with single_thread():
        assert sampled_pvalue(folder, target, tree, 600, lookup_bias=lookup_bias) > PASS_P


def test_context_tokens_drafted_but_claimed_impossible_fail_the_distribution_test(narrow_sampling_pair, monkeypatch):
    target, folder = narrow_sampling_pair
    with single_thread():
        # a strong one-token prior: the prompt's successors, half of them outside the subset, are drafted
        assert sampled_pvalue(folder, target, None, 1500, monkeypatch, wrong="context", lookup_bias="[6.0]") < 1e-6


def test_context_vocab_on_a_draft_with_its_own_output_layer_is_refused(tmp_path):
    from pacer_core import InputError

    target = tiny_llama(0, vocab=16, scale=3.0)
    folder = make_block_draft(target, tmp_path / "draft", own_head=True)
    with pytest.raises(InputError, match="context_vocab=true needs a draft whose head is a subset"):
        block_engine(target, folder, extra=["strategy.drafter.context_vocab=true"])


@pytest.mark.parametrize("tree", ["{topk: 3, depth: 3, nodes: 6}", DEEP], ids=["tree", "deep"])
def test_tree_children_claimed_as_sampled_fail_the_distribution_test(sampling_pair, monkeypatch, tree):
    levels = BlockTree.next_levels
    monkeypatch.setattr(
        BlockTree,
        "next_levels",
        lambda *a, **k: (lambda block: block and attrs.evolve(block, sampled=True))(levels(*a, **k)),
    )
    target, folder = sampling_pair
    with single_thread():
        assert sampled_pvalue(folder, target, tree, 600) < 1e-6


# -- PACER on blocks: an M_B trained for the block draft -----------------------------------------
PREVERIFY = [
    "verifier={name: speculative_sampling}",
    "sampling.temperature=1.0",
    "data.window=6",
    "data.max_new_tokens=16",
    "data.heldout_every=3",
    "model.width=16",
    "model.heads=2",
    "model.ffn_size=32",
    "model.max_positions=8",
    "model.draft_confidence=true",
    "model.confidence_prior=true",
    "train.pack_len=24",
    "train.batch_size=4",
    "train.epochs=3",
    "train.warmup=2",
    "train.threads=1",
]
MB_PROMPTS = [[3, 7, 11, 5], [1, 2, 3], [5, 9, 13, 5], [2, 4, 6, 8, 10], [9, 9, 9], [12, 1, 14, 3]]


@pytest.fixture(scope="module")
def block_mb(sampling_pair, tmp_path_factory):
    """``pacer train-preverify`` run end to end for the sampling pair's block draft (the tiny target
    stands in for the loader; the prompts are given): (run folder, the exported M_B, the command)."""
    import json

    import pacer_core.hf as hf
    from pacer_core import cli

    target, folder = sampling_pair
    out = tmp_path_factory.mktemp("preverify") / "run"
    out.mkdir()
    (out / "items.json").write_text(json.dumps([{"source": "test", "prompt": p} for p in MB_PROMPTS]))
    argv = [
        "train-preverify",
        f"out={out}",
        f"export={out / 'mb'}",
        f"drafter={{name: dflash, path: '{folder}'}}",
        *PREVERIFY,
    ]
    patch = pytest.MonkeyPatch()
    patch.setattr(hf, "load_section", lambda section, role: (adapter(target, eos=False), None, None))
    try:
        with single_thread():
            assert cli.main(argv) == 0
    finally:
        patch.undo()
    return out, out / "mb", argv


def test_train_preverify_trains_an_mb_on_the_block_drafts_hidden_states(block_mb, sampling_pair, monkeypatch, capsys):
    """The block drafter tells its draft folder (``Component.draft_folder``); M_B reads its hidden
    states (the target's size) and is checked against its identity; a rerun resumes, simulating
    nothing, and a rerun whose draft weights changed under the same options is refused."""
    import json

    import pacer_core.hf as hf
    from pacer_core import cli
    from pacer_plugins.pacer_stop.model import PreVerifier
    from pacer_plugins.pacer_stop.train import DRAFT_IDENTITY_FILE, load_samples

    out, export, argv = block_mb
    target, folder = sampling_pair
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["drafter"]["name"] == "dflash" and manifest["draft"] == str(folder)
    assert manifest["draft_identity"].startswith("dflash:") and manifest["data"]["heldout_steps"] > 0
    assert PreVerifier.load(export).arch.input_size == 32  # the block draft's hidden states: the target's size
    samples = load_samples(out / "samples", len(MB_PROMPTS))
    assert all(int(sample["lengths"][0]) == 6 for sample in samples)  # the 6-token window: two blocks of 3
    assert 0.0 < manifest["data"]["accepted_rate"] < 1.0  # labels of both kinds
    recorded = json.loads((out / DRAFT_IDENTITY_FILE).read_text())
    assert recorded == {"draft_identity": manifest["draft_identity"]}
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "samples").glob("*.pt")}
    monkeypatch.setattr(hf, "load_section", lambda section, role: (adapter(target, eos=False), None, None))
    with single_thread():
        assert cli.main(argv) == 0  # resumed: samples and the finished checkpoint are kept
    assert {p.name: p.stat().st_mtime_ns for p in (out / "samples").glob("*.pt")} == stamps
    (out / DRAFT_IDENTITY_FILE).write_text(json.dumps({"draft_identity": "dflash:None:0123456789abcdef"}))
    try:
        message = one_line_error(capsys, argv)
    finally:
        (out / DRAFT_IDENTITY_FILE).write_text(json.dumps(recorded))
    assert "was simulated with draft dflash:None:0123456789abcdef" in message and "new out= folder" in message


def test_the_block_drafters_draft_folder_is_found_without_a_model():
    from pacer_core.config import load_config, plan_run
    from pacer_core.errors import InputError
    from pacer_plugins.block_draft.drafter import DEFAULT_DRAFT
    from pacer_plugins.pacer_stop.items import draft_folder, draft_manifest

    for drafter, expected in [("{name: dflash}", DEFAULT_DRAFT), ("{name: dflash, path: /my/block}", "/my/block")]:
        cfg = load_config(overrides=[f"strategy.drafter={drafter}"], require_models=False)
        if expected == DEFAULT_DRAFT:
            found = draft_folder(cfg, plan_run(cfg, require_models=False).stack.drafter)
            assert found == DEFAULT_DRAFT and "corpus_sources" in draft_manifest(found)
        else:
            with pytest.raises(InputError, match="is not a dflash draft folder"):
                draft_folder(cfg, plan_run(cfg, require_models=False).stack.drafter)


@pytest.mark.parametrize("b", [3, 2])
def test_greedy_block_drafting_with_its_mb_equals_plain_decoding(block_mb, sampling_pair, b):
    target, folder = sampling_pair
    _, export, _ = block_mb
    engine = block_engine(
        target,
        folder,
        stop=f"{{name: pacer, b: {b}, t0: 0.3, max_draft: 9, checkpoint: '{export}'}}",
        extra=["sampling.temperature=0"],
    )
    for prompt in PROMPTS:
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == reference_greedy(target, prompt, BUDGET), prompt
        assert result.metrics["pacer_checks"] > 0


def test_pacer_with_b_equal_to_the_block_judges_between_blocks_and_draft_more_is_a_forward(block_mb, sampling_pair):
    """b = the drafter's block (3): M_B is consulted once a block, and each block it passes is one
    more dflash forward conditioned on the blocks before it (t₀ 0: every block passes, up to
    max_draft); t₀ 1: the first block fails and the step sends it (one forward, one check)."""
    target, folder = sampling_pair
    _, export, _ = block_mb
    for t0, blocks in ((0.0, 3), (1.0, 1)):
        engine = block_engine(
            target,
            folder,
            stop=f"{{name: pacer, b: 3, t0: {t0}, rho: 1.0, t_max: 1.0, "
            f"max_draft: 9, send_failed_block: true, checkpoint: '{export}'}}",
            extra=["sampling.temperature=0"],
            eos=False,
        )
        stop = next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.stop"))
        seen = []

        class Probe:
            @hookimpl
            def pacer_observe_step(self, state, step):
                if len(step.draft):
                    judged = [(start, end) for start, end, _, _ in stop.blocks_judged]
                    if step.committed_before + 10 <= len(PROMPTS[0]) + BUDGET:  # the budget left room for 9
                        seen.append((len(step.draft), step.draft_forwards, judged))

        engine.pm.register(Probe())
        engine.generate(PROMPTS[0], max_new_tokens=BUDGET)
        assert all(forwards == -(-n // 3) for n, forwards, _ in seen), seen  # one forward a block
        full = [s for s in seen if s[0] == 3 * blocks]
        assert full and all(n <= 3 * blocks for n, _, _ in seen), (t0, seen)
        # a block M_B passes is followed by another; the last block (at max_draft, or the failed
        # one a sending rule keeps) ends the step. A sending rule leaves the block reaching
        # max_draft unjudged: it is sent either way
        expected = [(0, 3), (3, 6)] if blocks == 3 else [(0, 3)]
        assert all(judged == expected for _, _, judged in full), (t0, full)


def test_sampled_block_drafting_under_pacer_matches_the_target_distribution(block_mb, sampling_pair):
    target, folder = sampling_pair
    _, export, _ = block_mb
    engine = block_engine(
        target,
        folder,
        eos=False,
        stop=f"{{name: pacer, b: 3, t0: 0.3, max_draft: 9, checkpoint: '{export}'}}",
        extra=[
            "sampling.temperature=1.0",
            "strategy.verifier={name: speculative_sampling}",
            "generation.ignore_eos=true",
        ],
    )
    with single_thread():
        outputs, steps = sample_outputs(engine, SAMPLE_PROMPT, 600)
    expected = exact_continuation_probs(
        adapter(target, eos=False), SAMPLE_PROMPT, LENGTH, SamplingParams(temperature=1.0)
    )
    assert chisquare_pvalue(outputs, expected) > PASS_P


def test_an_mb_of_another_drafter_is_refused_with_the_block_draft(sampling_pair, tmp_path):
    """An M_B trained on the eagle drafter's hidden states (another draft identity), or reading
    hidden states of another size, is refused in one line naming the fix."""
    from pacer_core.errors import InputError
    from pacer_plugins.pacer_stop.model import PreVerifier

    from helpers import small_arch, write_checkpoint

    target, folder = sampling_pair
    eagle_mb = tmp_path / "eagle-mb"
    PreVerifier(small_arch(32)).save(
        eagle_mb, {"target_digest": None, "drafter": {"name": "eagle"}, "draft_identity": "eagle:abcd:0123456789abcdef"}
    )
    with pytest.raises(InputError) as info:
        block_engine(target, folder, stop=f"{{name: pacer, b: 3, checkpoint: '{eagle_mb}'}}")
    message = str(info.value)
    assert "\n" not in message and "reads the eagle drafter's hidden states" in message
    assert "with draft dflash:" in message and "train-preverify" in message
    with pytest.raises(InputError, match="reads hidden states of size 8, but this draft's have size 32"):
        block_engine(
            target,
            folder,
            stop=f"{{name: pacer, b: 3, checkpoint: '{write_checkpoint(tmp_path / 's', 8)}', allow_other_pair: true}}",
        )


# -- refusals ------------------------------------------------------------------------------------
def test_a_folder_without_a_block_draft_is_refused_in_one_line(capsys, tmp_path):
    drafter = f"strategy.drafter={{name: dflash, path: '{tmp_path}'}}"
    message = one_line_error(capsys, ["generate", "--prompt", "hi", drafter])
    assert "is not a dflash draft folder" in message and "pacer distill student.kind=dflash" in message


def test_a_draft_of_another_target_is_refused(pair):
    from pacer_core.errors import InputError

    target, folder = pair
    with pytest.raises(InputError, match="was distilled from target None, but this target is abc"):
        block_engine(target, folder, digest="abc")


def test_weights_that_do_not_fit_their_config_are_refused_before_building(pair, tmp_path):
    import json
    import shutil

    from pacer_core.errors import InputError

    _, folder = pair
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["intermediate_size"] = 1 << 20  # a huge network: refused from the header, never allocated
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="does not match its config.json"):
        load_block_draft(copy)


# -- in a hybrid ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", [None, "{topk: 3, depth: 3, nodes: 6}"], ids=["chain", "tree"])
def test_a_hybrid_of_the_block_draft_and_prompt_lookup_equals_plain_decoding(pair, tree):
    """The block draft merges into ``hybrid`` like any member: its block (chain or tree) and the
    lookup's phrases in one token tree, greedy output the target's own."""
    target, folder = pair
    member = f"{{name: dflash, path: '{folder}'" + (f", tree: {tree}" if tree else "") + "}"
    engine = block_engine(
        target,
        folder,
        extra=[
            f"strategy.drafter={{name: hybrid, members: [{member}, {{name: prompt_lookup}}]}}",
            "sampling.temperature=0",
        ],
    )
    for prompt in PROMPTS:
        assert engine.generate(prompt, max_new_tokens=BUDGET).tokens == reference_greedy(target, prompt, BUDGET)


# -- a damaged draft folder: one line, never a traceback while drafting ----------------------------
def _damaged_copy(folder, tmp_path, config=None, subset=None):
    """A copy of the draft ``folder`` whose config.json takes ``config``'s values and whose weights'
    subset buffer is ``subset``."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "damaged"
    shutil.copytree(folder, copy)
    if config is not None:
        (copy / "config.json").write_text(json.dumps({**json.loads((copy / "config.json").read_text()), **config}))
    if subset is not None:
        state = load_file(str(copy / "draft.safetensors"))
        state["subset"] = torch.tensor(subset, dtype=torch.long)
        save_file(state, str(copy / "draft.safetensors"))
    return copy


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"target_layers": ["a", "b"]}, "target_layers must be a list of layer numbers"),
        ({"target_layers": "ab"}, "target_layers must be a list of layer numbers"),
        ({"target_layers": [0, True]}, "target_layers must be a list of layer numbers"),
        ({"rope_theta": "x"}, "rope_theta must be a finite number > 0"),
        ({"rope_theta": 0}, "rope_theta must be a finite number > 0"),
        ({"rope_theta": float("nan")}, "rope_theta must be a finite number > 0"),
        ({"rms_eps": None}, "rms_eps must be a finite number > 0"),
        ({"rms_eps": -1.0}, "rms_eps must be a finite number > 0"),
    ],
    ids=[
        "layer-names",
        "layers-string",
        "layer-bool",
        "theta-string",
        "theta-zero",
        "theta-nan",
        "eps-null",
        "eps-negative",
    ],
)
def test_a_config_with_a_wrong_value_is_refused_before_drafting(pair, tmp_path, config, needle):
    """Every value of config.json is checked, not only the sizes: a layer name, a string or a zero rope
    base, a null norm epsilon were a TypeError or ValueError deep in the first draft forward."""
    from pacer_core.errors import InputError

    target, folder = pair
    with pytest.raises(InputError, match="does not describe a block draft") as caught:
        block_engine(target, _damaged_copy(folder, tmp_path, config=config)).generate(PROMPTS[0], max_new_tokens=4)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("last", [99, -1], ids=["past-the-vocabulary", "negative"])
def test_a_subset_naming_tokens_the_vocabulary_lacks_is_refused(pair, tmp_path, last):
    """The weights' subset buffer holds token ids: one outside the target's vocabulary was an
    IndexError while building the drafter (or in the embedding lookup)."""
    from pacer_core.errors import InputError

    target, folder = pair
    damaged = _damaged_copy(folder, tmp_path, subset=[0, 1, 2, 3, 4, 5, 6, last])
    with pytest.raises(InputError, match="token ids outside 0..15"):
        block_engine(target, damaged).generate(PROMPTS[0], max_new_tokens=4)


@pytest.mark.parametrize(
    "options, needle",
    [
        (["student.block=0"], "'block' must be >= 1"),
        (["student.block=33"], "'block' must be <= 32"),
        (["train.anchors=-1"], "'anchors' must be >= 1"),
        (["student.draft_layers=0"], "'draft_layers' must be >= 1"),
        (["init=nofolder"], "init 'nofolder' is not a folder"),
        (["student.kind=feature", "student.published=true"], "student.published chooses the published DFlash"),
    ],
    ids=["block-0", "block-33", "anchors-negative", "no-layers", "init", "published-feature"],
)
def test_distill_refuses_a_dflash_option_in_one_line_before_any_model_loads(
    capsys, tmp_path, monkeypatch, options, needle
):
    import pacer_core.hf

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(pacer_core.hf, "load_section", no_model)
    (tmp_path / "draft").mkdir()
    monkeypatch.chdir(tmp_path)
    message = one_line_error(capsys, ["distill", f"out={tmp_path / 'run'}", "student.kind=dflash", *options])
    assert needle in message


def test_init_starts_a_published_student_from_a_draft_in_our_architecture(pair, published_pair):
    """``init=`` a dflash draft: every tensor of the same name and shape is copied, the published
    architecture's q/k norms keep their start and ``inject`` is dropped; other target layers are refused
    in one line; another vocabulary subset (another corpus') is the run's own, every weight copied."""
    from pacer_core.errors import InputError
    from pacer_plugins.block_draft.students import start_from

    _, ours_folder = pair
    student = load_block_draft(published_pair[1])
    norms = {k: v.clone() for k, v in student.state_dict().items() if k.endswith(("q_norm", "k_norm"))}
    start = start_from(student, str(ours_folder))
    theirs, now = load_block_draft(ours_folder).state_dict(), student.state_dict()
    assert sorted(start["init_fresh_tensors"]) == sorted(norms) and len(norms) == 4
    assert all(torch.equal(now[k], v) for k, v in theirs.items() if k in now)
    assert all(torch.equal(now[k], v) for k, v in norms.items()) and not any("inject" in k for k in now)
    student.arch.target_layers[:] = [1, 0]
    with pytest.raises(InputError, match=r"fuses target layers \[0, 1\].*student.fused_layers=\[0, 1\]"):
        start_from(student, str(ours_folder))
    student.arch.target_layers[:] = [0, 1]
    # another corpus' subset: every weight is copied, the run keeps its own subset
    flipped = student.subset.flip(0).clone()
    student.subset.copy_(flipped)
    start_from(student, str(ours_folder))
    assert torch.equal(student.subset, flipped)
    now = student.state_dict()
    assert all(torch.equal(now[k], v) for k, v in theirs.items() if k in now and k != "subset")


def test_a_block_tree_is_handed_out_level_by_level():
    """A policy asking for one level at a time gets the same tree, a level a call: nodes numbered as
    the draft tree numbers them, parents given before their children, the main path continued; once
    the main path ends, every deeper node comes with its last block."""
    rows = torch.softmax(torch.randn(3, 10, generator=torch.Generator().manual_seed(4)) * 2, -1)
    whole = block_tree(rows, None, 3, 12).next_levels(3, 0)
    plan, draft = block_tree(rows, None, 3, 12), Draft()
    while (block := plan.next_levels(1, draft.num_nodes)) is not None:
        assert all(int(p) < draft.num_nodes + len(block) for p in (block.side.parents if block.side else []))
        draft = draft.extend(block)
    tree, once = draft.tree, Draft().extend(whole).tree
    assert draft.tokens.tolist() == whole.tokens.tolist() and len(tree) == len(once) == 12
    assert sorted(zip(tree.depths.tolist(), tree.tokens.tolist())) == sorted(
        zip(once.depths.tolist(), once.tokens.tolist())
    )


def test_a_target_that_does_not_show_its_weights_is_refused(pair):
    from pacer_core import Engine, load_config
    from pacer_core.errors import InputError
    from pacer_core.testing import ScriptedLM

    _, folder = pair
    cfg = load_config(overrides=[f"strategy.drafter={{name: dflash, path: '{folder}'}}"], require_models=False)
    with pytest.raises(
        InputError,
        match=r"the dflash drafter reads its target's weights, which this target "
        r"\(ScriptedLM\) does not show",
    ):
        Engine.build(ScriptedLM(16), cfg=cfg)


# -- scripts/remake_block_draft.sh: the shipped draft's lineage, run by a stand-in pacer ----------
def _remake(tmp_path: Path, *args: str, fail_on: str = "") -> subprocess.CompletedProcess:
    """Run the remake script with PACER_VENV a folder whose bin/pacer records its arguments (one line a
    call in calls.txt) and fails when they contain ``fail_on``."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    fake = venv / "bin" / "pacer"
    fake.write_text(
        f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "calls.txt"}\n'
        + (f'case "$*" in *"{fail_on}"*) exit 3 ;; esac\n' if fail_on else "")
    )
    fake.chmod(0o755)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "remake_block_draft.sh"), *args],
        env={**os.environ, "PACER_VENV": str(venv)},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_the_remake_script_runs_the_four_legs_from_the_draft_before_and_resumes(tmp_path):
    work = tmp_path / "work"
    history = subprocess.run(
        ["git", "cat-file", "-e", "4530caf:plugins/block_draft/default/draft.safetensors"], cwd=ROOT
    )
    done = _remake(tmp_path, "--work", str(work), fail_on="selfdistill_from=50 train.epochs=1")
    if history.returncode:  # a shallow clone: the script says what it needs, and runs nothing
        assert done.returncode == 2 and "clone the whole repository" in done.stderr
        return
    assert done.returncode == 3  # the third leg failed (an interruption): the first two are marked done
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 3 and all(c.startswith("distill ") for c in calls)
    assert f"out={work}/pub2 init={work}/base corpus.selfdistill_from=84 train.epochs=4" in calls[0]
    assert f"out={work}/pub3 init={work}/pub2/dflash-draft corpus.selfdistill_from=50 train.epochs=0.35" in calls[1]
    assert calls[2].endswith("selfdistill_from=50 train.epochs=1") and all("student.published=true" in c for c in calls)
    base = json.loads((work / "base" / "manifest.json").read_text())
    assert base["command"].startswith("pacer distill out=runs/dflash-pub ")  # the draft of commit 4530caf
    assert (work / "base" / "draft.safetensors").stat().st_size > 10_000_000
    again = _remake(tmp_path, "--work", str(work))
    assert again.returncode == 0, again.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 5 and calls[3] == calls[2]  # only the unfinished leg ran again, then the last
    last = f"out={work}/pub4 init={work}/pub3/dflash-draft corpus.selfdistill_from=0 corpus.selfdistill_until=30"
    assert calls[4].endswith(f"{last} target.dtype=float32 train.epochs=1")  # its own options replace the common
    assert "target.dtype=bfloat16" in calls[4].split(last)[0]
    assert "1/4 continuing the draft of 4530caf" in again.stdout and "done before" in again.stdout


def test_the_remake_script_refuses_an_unknown_option(tmp_path):
    result = _remake(tmp_path, "--wrok", "x")
    assert result.returncode == 2 and "unknown option '--wrok'" in result.stderr and result.stderr.count("\n") == 1
