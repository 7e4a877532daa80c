"""A generation's step metrics from its per-step counts: the one place they are computed.

The ``metrics`` observer (plugins/pacer_builtins/observers.py) records three lists while decoding,
the bench computes the same numbers for transformers' own ``generate`` from its trace, and the
report sums them over many generations (its per-position and draft-length numbers are these over
the concatenated steps of the records).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence


def step_metrics(
    accept_lengths: Sequence[int],
    drafted_per_step: Sequence[int],
    accepted_per_step: Sequence[int],
    nodes_per_step: Optional[Sequence[int]] = None,
) -> dict[str, Any]:
    """Steps, drafted/accepted/emitted counts, τ, acceptance rates, draft lengths and tree sizes.

    ``accept_lengths[i]`` is the number of tokens step i emitted, ``drafted_per_step[i]`` the draft's
    length (a tree's depth) and ``accepted_per_step[i]`` how many draft tokens were accepted (the
    accepted path, so never more than drafted). Per-position acceptance is, at each depth
    0..deepest-1, the share of steps drafting that deep whose accepted path reached it (acceptance
    per depth); the histogram counts steps by draft length. ``nodes_per_step[i]`` is the number of
    tokens the target verified (tree nodes; the draft length for a chain, the default).
    """
    steps, drafted, accepted, emitted = (
        len(accept_lengths),
        sum(drafted_per_step),
        sum(accepted_per_step),
        sum(accept_lengths),
    )
    drafted_at: list[int] = []
    accepted_at: list[int] = []
    histogram: dict[int, int] = {}
    for d in drafted_per_step:
        histogram[int(d)] = histogram.get(int(d), 0) + 1
    for d, a in zip(drafted_per_step, accepted_per_step):
        d, a = int(d), int(a)
        while len(drafted_at) < d:
            drafted_at.append(0)
            accepted_at.append(0)
        for i in range(d):
            drafted_at[i] += 1
            accepted_at[i] += int(i < a)
    nodes = list(drafted_per_step) if nodes_per_step is None else list(nodes_per_step)
    return {
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "emitted": emitted,
        "mean_accepted_length": emitted / steps if steps else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "per_position_acceptance": [a / d for a, d in zip(accepted_at, drafted_at)],
        "mean_draft_length": drafted / steps if steps else 0.0,
        "draft_length_histogram": dict(sorted(histogram.items())),
        "accept_lengths": list(accept_lengths),
        "drafted_per_step": list(drafted_per_step),
        "accepted_per_step": list(accepted_per_step),
        "mean_nodes_per_step": sum(nodes) / steps if steps else 0.0,
        "nodes_per_step": nodes,
    }
