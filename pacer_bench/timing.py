"""Clocks and the verification-cost probes: what the bench's timings rest on.

Chains are verified by a causal forward over the pending token and the draft; token trees by a
forward with positions and an ancestor mask (``pacer_core.engine.tree_layout``), which takes the
model's masked attention path. Each probe times the forward the engine would run.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch


def device_of(model: Any) -> str:
    """The device a model runs on, as text (``cpu`` when it does not say)."""
    device = getattr(model, "device", None)
    return str(device) if device is not None else "cpu"


def make_clock(device: str) -> Callable[[], float]:
    """``time.perf_counter``, synchronising CUDA first when the models run on a GPU."""
    if device.startswith("cuda"):
        import torch

        def clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return clock
    return time.perf_counter


def probe_tree_layout(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [k] and ancestor mask [k, k] of a verification forward over k tokens: the pending
    token, then a tree of k - 1 nodes (one child of the root, then two children per node). The mask's
    pattern does not change a dense forward's cost; the masked attention path does."""
    from pacer_core.draft_values import TokenTree
    from pacer_core.engine import tree_layout

    n = k - 1
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)], dtype=torch.long)[:n]  # [n]
    tree = TokenTree(torch.zeros(n, dtype=torch.long), parents, None, torch.zeros(n, dtype=torch.bool))
    return tree_layout(1, tree)


def measure_verify_costs(
    target: Any,
    context: Sequence[int],
    ks: Sequence[int],
    repeats: int,
    clock: Callable[[], float],
    tree_ks: Sequence[int] = (),
) -> tuple[list[float], list[float]]:
    """Median seconds of one target forward over k new tokens after ``context`` (cached), as a
    verification step feeds them: causal for each k of ``ks`` (a chain), and with the positions and
    ancestor mask of a token tree (``probe_tree_layout``; k >= 2) for each k of ``tree_ks``.
    Returns (chain medians, tree medians), in the order given. Every repeat runs every probe, chain
    and tree interleaved, so drift of the machine's speed hits both alike; the cache is cropped
    back after each forward."""
    ks, tree_ks = [int(k) for k in ks], [int(k) for k in tree_ks]
    if not ks and not tree_ks:
        raise ValueError("no token count to measure")
    if (ks and min(ks) < 1) or (tree_ks and min(tree_ks) < 2):
        raise ValueError(f"token counts must be >= 1 (trees >= 2), got {ks} and trees {tree_ks}")
    context = list(context)
    longest = max(ks + tree_ks)
    feed = (context * (longest // max(len(context), 1) + 1))[:longest]
    probes = [(k, None, None) for k in ks] + [(k, *probe_tree_layout(k)) for k in tree_ks]
    target.reset()
    target.forward(context, logits_from=len(context))
    base = len(target.cached_tokens)
    k, positions, mask = probes[0]
    target.forward(feed[:k], positions=positions, tree_mask=mask)  # one untimed forward
    target.crop(base)
    times: list[list[float]] = [[] for _ in probes]
    for _ in range(repeats):
        for i, (k, positions, mask) in enumerate(probes):
            start = clock()
            target.forward(feed[:k], positions=positions, tree_mask=mask)
            times[i].append(clock() - start)
            target.crop(base)
    target.reset()
    medians = [sorted(t)[len(t) // 2] for t in times]
    return medians[: len(ks)], medians[len(ks) :]
