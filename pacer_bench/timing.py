"""Clocks and the verification-cost probe: what the bench's timings rest on."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence


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


def measure_verify_costs(target: Any, context: Sequence[int], max_k: int, repeats: int,
                         clock: Callable[[], float]) -> list[float]:
    """Median seconds of one target forward over k = 1..max_k new tokens after ``context`` (cached),
    as a verification step feeds them; the cache is cropped back after each forward."""
    context = list(context)
    feed = (context * (max_k // max(len(context), 1) + 1))[:max_k]
    target.reset()
    target.forward(context, logits_from=len(context))
    base = len(target.cached_tokens)
    target.forward(feed[:1])  # one untimed forward
    target.crop(base)
    times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    for _ in range(repeats):
        for k in range(1, max_k + 1):
            start = clock()
            target.forward(feed[:k])
            times[k].append(clock() - start)
            target.crop(base)
    target.reset()
    return [sorted(v)[len(v) // 2] for _, v in sorted(times.items())]

