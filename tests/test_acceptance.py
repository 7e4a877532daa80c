"""Property tests of the pure acceptance math (``acceptance.py``) and sampling (``sampling.py``).

The central identity of speculative sampling: drawing x ~ q, accepting it with probability
min(1, p(x)/q(x)) and otherwise drawing from normalize(max(0, p − q)) yields exactly p, because
min(p, q) + (1 − Σ min(p, q)) · residual == p. Here it is checked on the formula, on the exact law
of ``speculative_verify`` for one draft token (the acceptance region in u is found by bisection and
the distributions the next token is drawn from are captured), and statistically with a seeded
generator.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from pacer_core import Draft, DraftBlock, SamplingParams, Verdict, acceptance
from pacer_core.acceptance import greedy_verify, residual_distribution, speculative_verify
from pacer_core.sampling import argmax_first, choose, logits_to_probs, sample

from strategies import (
    distinct_logits,
    distribution,
    distribution_pair,
    distribution_rows,
    logits_rows,
    vocab_sizes,
)

SETTINGS = settings(max_examples=60, deadline=None)
BELOW_ONE = math.nextafter(1.0, 0.0)  # the largest uniform draw in [0, 1)


class CapturingSampler:
    """Stands in for ``acceptance.sample``: records each distribution a token is drawn from."""

    def __init__(self):
        self.drawn_from: list[torch.Tensor] = []

    def __call__(self, probs: torch.Tensor, generator) -> torch.Tensor:
        self.drawn_from.append(probs.clone())
        return probs.argmax(-1)


def argmax(row: list[float]) -> int:
    """Index of the largest value, the lowest index on ties (as ``torch.argmax``)."""
    return max(range(len(row)), key=lambda j: (row[j], -j))


def one_hot(token: int, vocab: int) -> torch.Tensor:
    row = torch.zeros(vocab, dtype=torch.float64)
    row[token] = 1.0
    return row


# -- residual distribution -------------------------------------------------------------------


@SETTINGS
@given(distribution_pair())
def test_accepted_mass_plus_residual_recovers_target(pair):
    p, q = pair
    overlap = torch.minimum(p, q)  # [vocab]
    mixture = overlap + (1.0 - overlap.sum()) * residual_distribution(p, q)
    assert torch.allclose(mixture, p, atol=1e-9)


@SETTINGS
@given(distribution_pair())
def test_residual_is_a_distribution_on_the_excess_of_p(pair):
    p, q = pair
    residual = residual_distribution(p, q)
    assert not torch.isnan(residual).any()
    assert (residual >= 0).all()
    assert residual.sum().item() == pytest.approx(1.0, abs=1e-9)
    if (p - q).clamp_min(0).sum() > 1e-9:  # mass to recover: only where p exceeds q
        assert (residual[p <= q] == 0).all()


@SETTINGS
@given(st.data())
def test_residual_of_equal_distributions_is_target_not_nan(data):
    p = data.draw(distribution(data.draw(vocab_sizes)))
    residual = residual_distribution(p, p.clone())
    assert torch.equal(residual, p)
    assert torch.equal(residual_distribution(p.float(), p.float()), p.float())


def test_residual_rows_are_independent():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)  # [2, 3]
    q = torch.tensor([[0.5, 0.5, 0.0], [0.6, 0.3, 0.1]], dtype=torch.float64)
    residual = residual_distribution(p, q)
    assert torch.equal(residual[0], p[0])  # equal rows: the target itself
    assert torch.allclose(residual[1], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))


# -- speculative_verify: the exact law for one draft token -----------------------------------


def acceptance_threshold(token: int, draft_probs, target_probs) -> float:
    """The u below which ``speculative_verify`` accepts ``token`` (u ~ U[0, 1)), by bisection.

    Acceptance must be a threshold in u (accept iff u < t), which the bisection also checks on a
    few points of the grid.
    """
    tokens = torch.tensor([token])

    def accepted(u: float) -> bool:
        uniforms = torch.tensor([u], dtype=torch.float64)
        return speculative_verify(tokens, draft_probs, target_probs, uniforms, None).accepted == 1

    if not accepted(0.0):
        low = 0.0
    elif accepted(BELOW_ONE):
        low = 1.0
    else:
        low, high = 0.0, BELOW_ONE
        for _ in range(48):
            mid = (low + high) / 2
            low, high = (mid, high) if accepted(mid) else (low, mid)
    for u in (0.1, 0.37, 0.5, 0.81, 0.99):  # one threshold, not a patchwork
        if abs(u - low) > 1e-9:
            assert accepted(u) == (u < low)
    return low


def next_token_distribution(token: int, u: float, draft_probs, target_probs) -> tuple[Verdict, torch.Tensor]:
    sampler = CapturingSampler()
    with mock.patch.object(acceptance, "sample", sampler):
        verdict = speculative_verify(
            torch.tensor([token]), draft_probs, target_probs, torch.tensor([u], dtype=torch.float64), None
        )
    assert len(sampler.drawn_from) == 1  # exactly one token is drawn per step
    return verdict, sampler.drawn_from[0]


@SETTINGS
@given(st.data())
def test_speculative_verify_one_token_has_the_exact_law(data):
    """Integrate over x ~ q and u ~ U[0, 1): P(first emitted = y) == p(y), P(accept) == Σ min(p, q),
    and the bonus after an accepted token is drawn from the target's next row."""
    p, q = data.draw(distribution_pair())
    vocab = p.shape[0]
    p_next = data.draw(distribution(vocab))
    target_probs = torch.stack([p, p_next])  # [2, vocab]
    draft_probs = q[None]  # [1, vocab]
    first_token_law = torch.zeros(vocab, dtype=torch.float64)
    accept_probability = 0.0
    for x in range(vocab):
        if q[x] == 0:
            continue  # the drafter never proposes x
        threshold = acceptance_threshold(x, draft_probs, target_probs)
        expected = 1.0 if p[x] >= q[x] else (p[x] / q[x]).item()
        assert threshold == pytest.approx(expected, abs=1e-9)
        accept_probability += q[x].item() * threshold
        first_token_law[x] += q[x] * threshold
        if threshold > 0:
            verdict, drawn_from = next_token_distribution(x, 0.0, draft_probs, target_probs)
            assert (verdict.accepted, verdict.next_kind) == (1, "bonus")
            assert torch.allclose(drawn_from, p_next)
        if threshold < 1:
            verdict, drawn_from = next_token_distribution(x, BELOW_ONE, draft_probs, target_probs)
            assert (verdict.accepted, verdict.next_kind) == (0, "recovered")
            first_token_law += q[x] * (1 - threshold) * drawn_from
    assert accept_probability == pytest.approx(torch.minimum(p, q).sum().item(), abs=1e-9)
    assert torch.allclose(first_token_law, p, atol=1e-8)


@SETTINGS
@given(st.data())
def test_point_mass_draft_is_accepted_with_probability_p_of_x(data):
    """``draft_probs=None`` (n-gram drafters): accept x with probability p(x), else draw from p
    without x; over any proposal rule for x the first emitted token is still distributed as p."""
    vocab = data.draw(vocab_sizes)
    p = data.draw(distribution(vocab))
    x = data.draw(st.integers(0, vocab - 1))
    target_probs = torch.stack([p, p])  # [2, vocab]
    threshold = acceptance_threshold(x, None, target_probs)
    assert threshold == pytest.approx(p[x].item(), abs=1e-9)
    law = threshold * one_hot(x, vocab)
    if threshold < 1:
        verdict, drawn_from = next_token_distribution(x, BELOW_ONE, None, target_probs)
        assert verdict.next_kind == "recovered"
        without_x = p.clone()
        without_x[x] = 0
        assert torch.allclose(drawn_from, without_x / without_x.sum())
        law = law + (1 - threshold) * drawn_from
    # float32: p(x) = 1 - 6e-8 leaves a residual of 6e-8 where p holds 2e-16, so compare at float32 resolution
    assert torch.allclose(law, p, atol=1e-6)


def test_speculative_verify_statistically_reproduces_the_target():
    """Seeded sampling end to end (real multinomial draws): first token ~ p, bonus ~ next row."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.1, 0.3])  # mass on a token p never emits
    p_next = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.6])
    target_probs = torch.stack([p, p_next])  # [2, 5]
    generator = torch.Generator().manual_seed(1234)
    samples = 6000
    drafted = torch.multinomial(q, samples, replacement=True, generator=generator)
    uniforms = torch.rand(samples, generator=generator)
    first, bonus = torch.zeros(5), torch.zeros(5)
    for x, u in zip(drafted.tolist(), uniforms.tolist()):
        verdict = speculative_verify(torch.tensor([x]), q[None], target_probs, torch.tensor([u]), generator)
        if verdict.accepted:
            first[x] += 1
            bonus[verdict.next_token] += 1
        else:
            first[verdict.next_token] += 1
    assert first[4] == 0  # p(x) = 0 is never emitted
    support = p > 0

    def pvalue(counts, probs):
        counts, probs = counts.double(), probs.double()
        return chisquare(counts.numpy(), (probs / probs.sum() * counts.sum()).numpy()).pvalue

    assert pvalue(first[support], p[support]) > 1e-3
    assert pvalue(bonus, p_next) > 1e-3
    # the same counts are far from the draft's law: the test can tell a wrong one
    assert pvalue(first[support], q[support]) < 1e-6
    accept_rate = bonus.sum() / samples
    assert accept_rate.item() == pytest.approx(torch.minimum(p, q).sum().item(), abs=0.03)


# -- speculative_verify: several draft tokens, edge cases ------------------------------------


@SETTINGS
@given(st.data())
def test_speculative_verify_stops_at_first_rejection(data):
    """accepted = first i rejected with probability 1 − min(1, p/q); the next token is drawn from the
    residual at that row, or from row n (bonus) when every draft token is accepted."""
    vocab = data.draw(vocab_sizes)
    n = data.draw(st.integers(0, 5))
    target_probs = data.draw(distribution_rows(n + 1, vocab))  # [n + 1, vocab]
    point_mass = data.draw(st.booleans())
    draft_probs = None if point_mass else data.draw(distribution_rows(n, vocab)) if n else None
    tokens = torch.tensor(data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)), dtype=torch.long)
    uniforms = torch.tensor(data.draw(st.lists(st.floats(0.0, BELOW_ONE), min_size=n, max_size=n)), dtype=torch.float64)
    expected = n
    for i in range(n):
        q_x = 1.0 if draft_probs is None else draft_probs[i, tokens[i]].item()
        p_x = target_probs[i, tokens[i]].item()
        if not (p_x > 0 and (p_x >= q_x or uniforms[i].item() * q_x < p_x)):  # min(1, p/q)
            expected = i
            break
    sampler = CapturingSampler()
    with mock.patch.object(acceptance, "sample", sampler):
        verdict = speculative_verify(tokens, draft_probs, target_probs, uniforms, None)
    assert verdict.accepted == expected
    (drawn_from,) = sampler.drawn_from
    if expected == n:
        assert verdict.next_kind == "bonus"
        assert torch.equal(drawn_from, target_probs[n])
    else:
        assert verdict.next_kind == "recovered"
        q_row = one_hot(int(tokens[expected]), vocab) if draft_probs is None else draft_probs[expected]
        assert torch.allclose(drawn_from, residual_distribution(target_probs[expected], q_row))
        assert drawn_from[tokens[expected]] <= target_probs[expected, tokens[expected]] + 1e-12
    assert verdict.next_token == int(drawn_from.argmax())


@SETTINGS
@given(st.data())
def test_point_mass_is_one_hot_draft_probs(data):
    vocab = data.draw(vocab_sizes)
    n = data.draw(st.integers(1, 4))
    target_probs = data.draw(distribution_rows(n + 1, vocab)).float()
    tokens = torch.tensor(data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)))
    uniforms = torch.tensor(
        data.draw(st.lists(st.floats(0.0, 1.0, width=32, exclude_max=True), min_size=n, max_size=n))
    )
    seed = data.draw(st.integers(0, 2**31))
    as_none = speculative_verify(tokens, None, target_probs, uniforms, torch.Generator().manual_seed(seed))
    one_hots = torch.nn.functional.one_hot(tokens, vocab).float()  # [n, vocab]
    as_one_hot = speculative_verify(tokens, one_hots, target_probs, uniforms, torch.Generator().manual_seed(seed))
    assert as_none == as_one_hot


@SETTINGS
@given(st.data())
def test_zero_target_probability_is_never_accepted(data):
    vocab = data.draw(vocab_sizes)
    p = data.draw(distribution(vocab))
    assume((p == 0).any())
    x = int((p == 0).nonzero()[0])
    q = data.draw(distribution(vocab))
    generator = torch.Generator().manual_seed(0)
    for draft_probs in (None, q[None], torch.zeros(1, vocab, dtype=torch.float64)):
        for u in (0.0, 1e-12, 0.5, BELOW_ONE):
            verdict = speculative_verify(
                torch.tensor([x]), draft_probs, torch.stack([p, p]), torch.tensor([u], dtype=torch.float64), generator
            )
            assert verdict.accepted == 0
            assert p[verdict.next_token] > 0


@SETTINGS
@given(st.data())
def test_zeros_in_draft_probs_give_no_nan(data):
    """A draft token the draft gave probability 0 (q(x) = 0 < p(x)) is accepted; rejections at rows
    where q has zeros draw a valid token of positive target probability."""
    vocab = data.draw(vocab_sizes)
    p, q = data.draw(distribution_pair(vocab))
    assume((q == 0).any())
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    x_zero = int((q == 0).nonzero()[0])
    target_probs = torch.stack([p, p])
    for x in range(vocab):
        for u in (0.0, 0.5, BELOW_ONE):
            verdict = speculative_verify(
                torch.tensor([x]), q[None], target_probs, torch.tensor([u], dtype=torch.float64), generator
            )
            assert 0 <= verdict.next_token < vocab
            assert p[verdict.next_token] > 0
            if x == x_zero and p[x] > 0:
                assert verdict.accepted == 1
    assert not torch.isnan(residual_distribution(p, q)).any()


def test_empty_draft_draws_the_bonus_from_the_first_row():
    target_probs = torch.tensor([[0.0, 1.0, 0.0]])  # [1, 3]
    verdict = speculative_verify(torch.empty(0, dtype=torch.long), None, target_probs, torch.empty(0), None)
    assert verdict == Verdict(accepted=0, next_token=1, next_kind="bonus")


def test_speculative_verify_is_reproducible_with_a_seeded_generator():
    p = torch.full((2, 6), 1 / 6)
    q = torch.tensor([[0.9, 0.02, 0.02, 0.02, 0.02, 0.02]])
    runs = [
        [speculative_verify(torch.tensor([0]), q, p, torch.tensor([0.5]), g).next_token for _ in range(20)]
        for g in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))
    ]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1  # really drawn at random, not a constant


# -- greedy verification ---------------------------------------------------------------------


@st.composite
def greedy_case(draw):
    """(draft tokens [n], target logits [n + 1, vocab], first mismatch m in [0, n])."""
    vocab = draw(vocab_sizes)
    n = draw(st.integers(0, 6))
    logits = draw(logits_rows(n + 1, vocab))
    target_argmax = [argmax(row) for row in logits.tolist()]
    mismatch = draw(st.integers(0, n))
    draft = target_argmax[:n]
    if mismatch < n:
        draft[mismatch] = (target_argmax[mismatch] + draw(st.integers(1, vocab - 1))) % vocab
        for i in range(mismatch + 1, n):  # after the mismatch: anything, even the argmax
            draft[i] = draw(st.integers(0, vocab - 1))
    return torch.tensor(draft, dtype=torch.long), logits, mismatch, target_argmax


@SETTINGS
@given(greedy_case())
def test_greedy_verify_accepts_longest_argmax_prefix(case):
    draft, logits, mismatch, target_argmax = case
    n = int(draft.shape[0])
    verdict = greedy_verify(draft, logits)
    assert verdict.accepted == mismatch
    assert verdict.next_token == target_argmax[mismatch]
    assert verdict.next_kind == ("bonus" if mismatch == n else "recovered")
    assert verdict.path is None and verdict.nodes(Draft((DraftBlock(draft),))) == tuple(range(mismatch))


@st.composite
def token_trees(draw, vocab: int, max_nodes: int = 8):
    """(tokens [n], parents [n]) of a random tree: each node's parent an earlier node or the root."""
    n = draw(st.integers(0, max_nodes))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    return torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long)


def root_paths(parents: list[int]) -> list[list[int]]:
    """Every root path of a tree (empty path included), in depth-first node order."""
    paths: list[list[int]] = [[]]

    def below(node: int, prefix: list[int]) -> None:
        for child in (c for c, p in enumerate(parents) if p == node):
            paths.append(prefix + [child])
            below(child, prefix + [child])

    below(-1, [])
    return paths


@SETTINGS
@given(st.data())
def test_greedy_verify_tree_takes_the_longest_argmax_path(data):
    """Brute force: of all root paths whose every token is the target's argmax after its parent,
    the longest (the first in depth-first order on ties) is accepted; the next token is the argmax
    after it, a bonus at a leaf. Trees with duplicate siblings are drawn often (tiny vocabularies)."""
    vocab = data.draw(st.integers(2, 4))
    tokens, parents = data.draw(token_trees(vocab))
    n = int(tokens.shape[0])
    logits = data.draw(logits_rows(n + 1, vocab))
    target_argmax = [argmax(row) for row in logits.tolist()]
    plist, tlist = parents.tolist(), tokens.tolist()
    valid = [
        p
        for p in root_paths(plist)
        if all(tlist[node] == target_argmax[(p[i - 1] if i else -1) + 1] for i, node in enumerate(p))
    ]
    best = max(valid, key=len)  # max keeps the first of equal lengths
    verdict = greedy_verify(tokens, logits, parents)
    assert verdict.path == tuple(best) and verdict.accepted == len(best)
    last = best[-1] if best else -1
    assert verdict.next_token == target_argmax[last + 1]
    assert verdict.next_kind == ("recovered" if last in plist else "bonus")


@given(st.lists(st.sampled_from([-1.0, 0.0, 2.0, float("inf"), float("-inf"), float("nan")]), min_size=1, max_size=300))
def test_argmax_first_is_argmax_ties_and_nan_included(values):
    """``argmax_first`` names the index ``argmax`` names: the first of tied maxima, the first NaN; on
    narrow rows and on rows wide enough to be read through ``max(0)``."""
    row = torch.tensor(values)
    assert argmax_first(row) == int(row.argmax())
    wide = torch.cat([torch.full((5000,), -3.0), row, torch.full((5000,), -3.0)])
    assert argmax_first(wide) == int(wide.argmax())


def test_greedy_verify_reads_only_the_rows_its_walk_reaches_on_the_cpu():
    """A greedy walk asks for the argmax of the rows along its path (plus the next token's), not of
    every node's row: the other rows of a wide tree are never read (on a device all rows are read in
    one kernel instead)."""
    vocab, width = 8, 6  # the root's children: tokens 0..5; only token 3 continues, with one child
    tokens = torch.tensor(list(range(width)) + [4])
    parents = torch.tensor([-1] * width + [3])
    logits = torch.zeros(width + 2, vocab)
    logits[0, 3] = logits[4, 4] = logits[7, 1] = 5.0  # argmax 3 after the root, 4 after node 3, 1 after node 6
    logits[[1, 2, 3, 5, 6]] = float("nan")  # rows the walk must not read (argmax of NaN rows is NaN's index)
    read = []

    def counting(name):  # argmax_first reads a row through argmax, or max(0) when it is wide
        original = getattr(torch.Tensor, name)

        def count(self, *args, **kwargs):
            read.append(tuple(self.shape))
            return original(self, *args, **kwargs)

        return count

    with (
        mock.patch.object(torch.Tensor, "argmax", counting("argmax")),
        mock.patch.object(torch.Tensor, "max", counting("max")),
    ):
        verdict = greedy_verify(tokens, logits, parents)
    assert verdict == Verdict(accepted=2, next_token=1, next_kind="bonus", path=(3, 6))
    assert read == [(vocab,)] * 3  # rows 0, 4 and 7, one at a time


def test_greedy_verify_tree_prefers_the_deeper_duplicate():
    # root children: node 0 (token 1, a leaf) and node 1 (token 1, with child node 2 = token 2)
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    verdict = greedy_verify(torch.tensor([1, 1, 2]), logits, torch.tensor([-1, -1, 1]))
    assert verdict == Verdict(accepted=2, next_token=0, next_kind="bonus", path=(1, 2))


def test_greedy_verify_on_a_chain_tree_equals_the_chain_rule():
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])  # argmax 1, 0, 2
    chain = greedy_verify(torch.tensor([1, 1]), logits)
    tree = greedy_verify(torch.tensor([1, 1]), logits, torch.tensor([-1, 0]))
    assert chain == Verdict(accepted=1, next_token=0, next_kind="recovered")
    assert (tree.accepted, tree.next_token, tree.next_kind, tree.path) == (1, 0, "recovered", (0,))


# -- logits_to_probs, sample, choose ---------------------------------------------------------


@SETTINGS
@given(st.data())
def test_greedy_params_give_one_hot_argmax(data):
    vocab, rows = data.draw(vocab_sizes), data.draw(st.integers(1, 3))
    logits = data.draw(logits_rows(rows, vocab))
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.5))
    expected = torch.stack([one_hot(argmax(r), vocab) for r in logits.tolist()]).float()
    assert torch.equal(probs, expected)


@SETTINGS
@given(distinct_logits(), st.floats(0.05, 5.0), st.floats(0.05, 5.0))
def test_temperature_is_softmax_of_scaled_logits(logits, t1, t2):
    low, high = sorted((t1, t2))
    probs_low = logits_to_probs(logits, SamplingParams(temperature=low))
    probs_high = logits_to_probs(logits, SamplingParams(temperature=high))
    expected = torch.softmax(logits.double() / low, -1).float()
    assert torch.allclose(probs_low, expected, atol=1e-6)
    assert probs_low.sum().item() == pytest.approx(1.0, abs=1e-5)
    top = int(logits.argmax())
    assert probs_low[top] >= probs_high[top] - 1e-6  # colder is peakier

    def entropy(probs):
        return -(probs * probs.clamp_min(1e-30).log()).sum().item()

    assert entropy(probs_low) <= entropy(probs_high) + 1e-5


@SETTINGS
@given(st.data())
def test_top_k_keeps_exactly_k_tokens(data):
    logits = data.draw(distinct_logits())
    vocab = int(logits.shape[0])
    k = data.draw(st.integers(1, vocab + 2))
    temperature = data.draw(st.floats(0.1, 2.0))
    probs = logits_to_probs(logits, SamplingParams(temperature=temperature, top_k=k))
    kept = (probs > 0).nonzero().flatten()
    top = torch.topk(logits, min(k, vocab)).indices
    assert sorted(kept.tolist()) == sorted(top.tolist())
    expected = torch.softmax(logits[top].double() / temperature, -1).float()
    assert torch.allclose(probs[top], expected, atol=1e-6)


def test_top_k_keeps_ties_with_the_kth_token():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [True, False, True, True, False]


@SETTINGS
@given(st.data())
def test_top_p_keeps_the_smallest_prefix_reaching_p(data):
    logits = data.draw(distinct_logits())
    top_p = data.draw(st.floats(0.01, 0.99))
    temperature = data.draw(st.floats(0.2, 2.0))
    full = torch.softmax(logits.double() / temperature, -1)
    order = torch.argsort(full, descending=True)
    cumulative = torch.cumsum(full[order], 0)
    assume(((cumulative - top_p).abs() > 1e-4).all())  # no float ambiguity at the boundary
    size = int((cumulative < top_p).sum()) + 1  # smallest m with mass of the top m >= top_p
    probs = logits_to_probs(logits, SamplingParams(temperature=temperature, top_p=top_p))
    kept = (probs > 0).nonzero().flatten()
    assert sorted(kept.tolist()) == sorted(order[:size].tolist())
    kept_full = full[order[:size]]
    assert torch.allclose(probs[order[:size]].double(), kept_full / kept_full.sum(), atol=1e-6)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_top_k_then_top_p():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0]).log()  # probabilities 0.4, 0.3, 0.2, 0.1, 0
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.7))
    # top-3 renormalized: 4/9, 3/9, 2/9; mass 7/9 ≥ 0.7 reached by the first two
    assert torch.allclose(probs, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0, 0.0]), atol=1e-6)


@SETTINGS
@given(st.data())
def test_rows_are_processed_independently(data):
    vocab, rows = data.draw(vocab_sizes), data.draw(st.integers(2, 4))
    logits = data.draw(logits_rows(rows, vocab))
    params = SamplingParams(
        temperature=data.draw(st.floats(0.1, 2.0)),
        top_k=data.draw(st.integers(0, vocab)),
        top_p=data.draw(st.floats(0.1, 1.0)),
    )
    batched = logits_to_probs(logits, params)
    assert torch.allclose(batched, torch.stack([logits_to_probs(r, params) for r in logits]), atol=1e-7)


def test_sample_never_draws_a_zero_probability_token_and_is_seeded():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]])  # [2, 4]
    draws = [sample(probs, torch.Generator().manual_seed(s)) for s in range(200)]
    assert all(d.shape == (2,) for d in draws)
    assert {int(d[0]) for d in draws} == {1, 3}
    assert {int(d[1]) for d in draws} == {2}
    again = [sample(probs, torch.Generator().manual_seed(s)) for s in range(200)]
    assert all(torch.equal(a, b) for a, b in zip(draws, again))


def test_choose_greedy_and_sampled():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    assert choose(logits, SamplingParams(), None) == (1, None)
    params = SamplingParams(temperature=0.7, top_k=2)
    token, probs = choose(logits, params, torch.Generator().manual_seed(0))
    assert torch.equal(probs, logits_to_probs(logits, params))
    assert token in (1, 3)


def test_equal_subnormal_probabilities_are_always_accepted():
    """p == q must accept for every u, even where u · q rounds up to p (found by Hypothesis)."""
    probs = torch.tensor([0.0, 1.0, 4.9407e-324], dtype=torch.float64)
    target_probs = torch.stack([probs, torch.full((3,), 1 / 3, dtype=torch.float64)])
    for u in (0.1, 0.5, BELOW_ONE):
        verdict = speculative_verify(
            torch.tensor([2]), probs[None], target_probs, torch.tensor([u], dtype=torch.float64), None
        )
        assert verdict.accepted == 1


def test_a_tiny_residual_is_still_normalized():
    """A rejection of probability 1e-12 draws from the residual itself, not from p (found by hypothesis)."""
    p = torch.tensor([1.0, 1e-12], dtype=torch.float64)
    p = p / p.sum()
    verdict, drawn_from = next_token_distribution(0, BELOW_ONE, None, torch.stack([p, p]))
    assert verdict.next_kind == "recovered"
    assert torch.equal(drawn_from, torch.tensor([0.0, 1.0], dtype=torch.float64))
