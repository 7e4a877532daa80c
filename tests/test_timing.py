"""The verification-cost probe (``pacer_bench.timing.measure_verify_costs``)."""

from __future__ import annotations

import pytest


def test_the_chain_and_tree_cost_probes_run_interleaved_so_drift_hits_both_alike():
    """Every repeat times every chain and tree probe in turn, so a machine whose speed drifts during
    the probe slows chain and tree forwards alike (one after the other, the trees would see only
    the later speed); medians come back per probe, in the order given."""
    from pacer_bench.timing import measure_verify_costs

    class Target:  # one forward of k tokens takes k ms, a tree-masked one 1 ms more
        def __init__(self):
            self.cached_tokens, self.calls, self.now = [], [], 0.0

        def reset(self):
            self.cached_tokens = []

        def crop(self, n):
            del self.cached_tokens[n:]

        def forward(self, tokens, positions=None, tree_mask=None, logits_from=0):
            tree = tree_mask is not None
            assert not tree or (positions is not None and tuple(tree_mask.shape) == (len(tokens),) * 2)
            self.calls.append((len(tokens), tree))
            self.now += (len(tokens) + tree) / 1000
            self.cached_tokens += list(tokens)

    target = Target()
    chain, tree = measure_verify_costs(target, [5, 6, 7], [1, 4], 3, lambda: target.now, tree_ks=[4, 8])
    assert target.calls[2:] == [(1, False), (4, False), (4, True), (8, True)] * 3  # after the context and a warm-up
    assert chain == pytest.approx([0.001, 0.004]) and tree == pytest.approx([0.005, 0.009])
    assert target.cached_tokens == []
    assert measure_verify_costs(Target(), [5], [1, 2], 1, lambda: 0.0)[1] == []
    with pytest.raises(ValueError):
        measure_verify_costs(Target(), [5], [1], 1, lambda: 0.0, tree_ks=[1])
