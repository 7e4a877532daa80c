"""Clocks and the verification-cost probes: what the bench's timings rest on.

Chains are verified by a causal forward over the pending token and the draft; token trees by a
forward with positions and an ancestor mask (``pacer_core.engine.tree_layout``), which takes the
model's masked attention path. Each probe times the forward the engine would run.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

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
    from pacer_core.engine import tree_layout
    from pacer_core.types import TokenTree

    n = k - 1
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)], dtype=torch.long)[:n]  # [n]
    tree = TokenTree(torch.zeros(n, dtype=torch.long), parents, None, torch.zeros(n, dtype=torch.bool))
    return tree_layout(1, tree)


def measure_verify_costs(target: Any, context: Sequence[int], ks: Sequence[int], repeats: int,
                         clock: Callable[[], float], tree: bool = False) -> list[float]:
    """Median seconds of one target forward over each k of ``ks`` new tokens after ``context``
    (cached), as a verification step feeds them: causal (a chain), or with ``tree`` the positions
    and ancestor mask of a token tree (``probe_tree_layout``; k >= 2). The cache is cropped back
    after each forward."""
    context, ks = list(context), [int(k) for k in ks]
    if not ks or min(ks) < (2 if tree else 1):
        raise ValueError(f"token counts must be >= {2 if tree else 1}, got {ks}")
    longest = max(ks)
    feed = (context * (longest // max(len(context), 1) + 1))[:longest]
    layouts: dict[int, tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = {
        k: probe_tree_layout(k) if tree else (None, None) for k in ks}
    target.reset()
    target.forward(context, logits_from=len(context))
    base = len(target.cached_tokens)
    first = layouts[ks[0]]
    target.forward(feed[:ks[0]], positions=first[0], tree_mask=first[1])  # one untimed forward
    target.crop(base)
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            positions, mask = layouts[k]
            start = clock()
            target.forward(feed[:k], positions=positions, tree_mask=mask)
            times[k].append(clock() - start)
            target.crop(base)
    target.reset()
    return [sorted(times[k])[len(times[k]) // 2] for k in ks]
