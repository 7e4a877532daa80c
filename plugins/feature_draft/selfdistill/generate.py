"""Batched greedy answers from the target (``pacer_core.hf.greedy_batch``), and the throughput
measurement.

``greedy_batch`` left-pads the prompts, runs one prefill forward, then one forward per new token
for the rows still running: a row that emits an end-of-sequence token (or reaches the budget)
leaves the batch (its KV-cache rows are dropped), so short answers do not pay for the longest one.
Position ids follow each row's own tokens, so a padded row sees what it would see alone; in
float32 the answers are the target's own greedy answers up to rounding (the tests check it on a
tiny model), in bfloat16 padding and batch shape change the rounding and an answer can part from
the unbatched one after a near tie (``measure`` reports how often).
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import torch

from pacer_core.hf import greedy_batch


Generator = Callable[[list[list[int]], int], list[list[int]]]


def answer_all(generate: Generator, prompts: Sequence[Sequence[int]], batch_size: int, max_new_tokens: int,
               on_batch: Optional[Callable[[list[list[int]]], None]] = None) -> list[list[int]]:
    """Answers for all ``prompts`` in their order; batches group prompts of similar length (less
    padding). ``on_batch(answers)`` is called after each batch (progress)."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    answers: list[Optional[list[int]]] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        made = generate([list(prompts[i]) for i in chunk], max_new_tokens)
        for i, answer in zip(chunk, made):
            answers[i] = answer
        if on_batch is not None:
            on_batch(made)
    return answers  # type: ignore[return-value]


def measure(generate: Generator, prompts: Sequence[Sequence[int]], batch_sizes: Sequence[int], max_new_tokens: int,
            seconds: float, log: Callable[[str], None] = lambda _: None) -> list[dict]:
    """Throughput of ``generate`` per batch size: batches of the first prompts (in order) until
    ``seconds`` have passed (at least one batch). Each row: answered prompts, answer tokens, seconds,
    tokens/s (wall clock, and per CPU-second of this process: comparable while the machine is
    shared), and agreement with the first batch size's answers on the prompts both answered
    (identical answers; mean common prefix as a fraction of the longer answer)."""
    rows, reference = [], {}
    for size in batch_sizes:
        made: dict[int, list[int]] = {}
        start, cpu = time.perf_counter(), time.process_time()
        index = 0
        while index < len(prompts) and (not made or time.perf_counter() - start < seconds):
            chunk = list(range(index, min(index + size, len(prompts))))
            for i, answer in zip(chunk, answer_all(generate, [prompts[i] for i in chunk], size, max_new_tokens)):
                made[i] = answer
            index += size
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        tokens = sum(len(a) for a in made.values())
        if not reference:
            reference = made
        shared = sorted(set(made) & set(reference))
        same = sum(made[i] == reference[i] for i in shared)
        prefix = [_common(made[i], reference[i]) / max(len(made[i]), len(reference[i]), 1) for i in shared]
        row = {"batch_size": size, "prompts": len(made), "answer_tokens": tokens, "seconds": round(elapsed, 1),
               "tokens_per_s": round(tokens / elapsed, 1), "cpu_seconds": round(cpu, 1),
               "tokens_per_cpu_s": round(tokens / max(cpu, 1e-9), 1), "compared": len(shared), "identical": same,
               "common_prefix": round(sum(prefix) / len(prefix), 3) if prefix else None}
        log(str(row))
        rows.append(row)
    return rows


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
