"""Batched greedy answers from the target (``pacer_core.hf.greedy_batch``), and the throughput
measurement.

``greedy_batch`` batches continuously: up to ``batch_size`` prompts run at once, one forward per new
token for all of them; a row that emits an end-of-sequence token (or reaches the budget) leaves
the batch (its KV-cache rows are dropped) and the next prompt is prefilled and joins it, so the
batch stays full and short answers do not wait for the longest one.
Position ids follow each row's own tokens, so a padded row sees what it would see alone; in
float32 the answers are the target's own greedy answers up to rounding (the tests check it on a
tiny model), in bfloat16 padding and batch shape change the rounding and an answer can part from
the unbatched one after a near tie (``measure`` reports how often).
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

# generate(prompts, max_new_tokens, rows, on_answer) → answers: at most ``rows`` prompts at once,
# ``on_answer(index, answer)`` as each completes (greedy_batch's interface)
Generator = Callable[[list[list[int]], int, int, Optional[Callable[[int, list[int]], None]]], list[list[int]]]


def answer_all(
    generate: Generator,
    prompts: Sequence[Sequence[int]],
    batch_size: int,
    max_new_tokens: int,
    on_answer: Optional[Callable[[list[int]], None]] = None,
) -> list[list[int]]:
    """Answers for all ``prompts`` in their order, generated shortest prompt first with at most
    ``batch_size`` running at once (rows of similar length: less padding). ``on_answer(answer)`` is
    called as each answer completes (progress)."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    report = None if on_answer is None else (lambda index, answer: on_answer(answer))
    made = generate([list(prompts[i]) for i in order], max_new_tokens, batch_size, report)
    answers: list[Optional[list[int]]] = [None] * len(prompts)
    for i, answer in zip(order, made):
        answers[i] = answer
    return answers  # type: ignore[return-value]


def measure(
    generate: Generator,
    prompts: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    max_new_tokens: int,
    seconds: float,
    log: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """Throughput of ``generate`` per batch size: the first prompts (in order), four batches' worth
    at a time, until ``seconds`` have passed (at least once). Each row: answered prompts, answer tokens, seconds,
    tokens/s (wall clock, and per CPU-second of this process: comparable while the machine is
    shared), and agreement with the first batch size's answers on the prompts both answered
    (identical answers; mean common prefix as a fraction of the longer answer)."""
    rows, reference = [], {}
    for size in batch_sizes:
        made: dict[int, list[int]] = {}
        start, cpu = time.perf_counter(), time.process_time()
        index = 0
        while index < len(prompts) and (not made or time.perf_counter() - start < seconds):
            chunk = list(range(index, min(index + 4 * size, len(prompts))))
            for i, answer in zip(chunk, answer_all(generate, [prompts[i] for i in chunk], size, max_new_tokens)):
                made[i] = answer
            index += 4 * size
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        tokens = sum(len(a) for a in made.values())
        if not reference:
            reference = made
        shared = sorted(set(made) & set(reference))
        same = sum(made[i] == reference[i] for i in shared)
        prefix = [_common(made[i], reference[i]) / max(len(made[i]), len(reference[i]), 1) for i in shared]
        row = {
            "batch_size": size,
            "prompts": len(made),
            "answer_tokens": tokens,
            "seconds": round(elapsed, 1),
            "tokens_per_s": round(tokens / elapsed, 1),
            "cpu_seconds": round(cpu, 1),
            "tokens_per_cpu_s": round(tokens / max(cpu, 1e-9), 1),
            "compared": len(shared),
            "identical": same,
            "common_prefix": round(sum(prefix) / len(prefix), 3) if prefix else None,
        }
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
