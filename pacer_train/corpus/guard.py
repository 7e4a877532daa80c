"""The benchmark guard: no instruction of the corpus may overlap a benchmark prompt.

Texts are compared as lower-case word sequences (runs of letters and digits). An instruction is
refused when it shares any run of ``n`` consecutive words (default 13, the usual contamination
n-gram) with a benchmark prompt, or contains a whole benchmark prompt shorter than ``n`` words.
The benchmark sets are the project's evaluation prompts: HumanEval, GSM8K test, MT-Bench (both
turns), and the summarization and code-editing prompts.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable, Optional

from pacer_core.errors import InputError

BENCHMARK_SETS = ("humaneval", "gsm8k", "mtbench", "summarization", "code_editing")
NGRAM = 13
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _prompt_sets():
    """The evaluation prompt loaders of the benchmark harness."""
    from pacer_bench.prompts import PROMPT_SETS

    return PROMPT_SETS


class BenchmarkGuard:
    """``refuses(text)`` → the reason an instruction may not be used, or ``None``."""

    def __init__(self, prompts: Iterable[tuple[str, str]], n: int = NGRAM):
        """``prompts``: (benchmark prompt id, text) pairs."""
        self.n = n
        self.grams: dict[tuple[str, ...], str] = {}
        self.short: dict[int, dict[tuple[str, ...], str]] = {}
        digest = hashlib.sha256()
        count = 0
        for pid, text in prompts:
            count += 1
            digest.update(f"{pid}\0{text}\0".encode())
            w = words(text)
            if len(w) < n:
                if w:
                    self.short.setdefault(len(w), {})[tuple(w)] = pid
                continue
            for i in range(len(w) - n + 1):
                self.grams.setdefault(tuple(w[i : i + n]), pid)
        self.prompts = count
        self.digest = digest.hexdigest()[:16]

    @classmethod
    def from_benchmarks(cls, sets: Iterable[str] = BENCHMARK_SETS, n: int = NGRAM) -> "BenchmarkGuard":
        """The guard over the project's benchmark prompt sets; a set that cannot be read is an error
        (no corpus is made without the check)."""
        loaders = _prompt_sets()
        pairs: list[tuple[str, str]] = []
        names = list(sets)
        for name in names:
            try:
                # every turn: a multi-turn bench (multi_turn: true) evaluates MT-Bench's second turns too
                pairs += [
                    (p.question_id if t == 0 else f"{p.question_id}/turn{t + 1}", text)
                    for p in loaders[name]()
                    for t, text in enumerate(p.turns)
                ]
            except InputError as exc:
                raise InputError(f"the benchmark-overlap check needs the '{name}' prompt set: {exc}") from None
        guard = cls(pairs, n)
        guard.sets = names
        return guard

    def describe(self) -> dict:
        return {
            "sets": list(getattr(self, "sets", [])),
            "prompts": self.prompts,
            "ngram_words": self.n,
            "prompts_digest": self.digest,
        }

    def refuses(self, text: str) -> Optional[str]:
        w = words(text)
        for i in range(len(w) - self.n + 1):
            pid = self.grams.get(tuple(w[i : i + self.n]))
            if pid is not None:
                return f"shares a {self.n}-word run with benchmark prompt {pid}"
        for length, table in self.short.items():
            for i in range(len(w) - length + 1):
                pid = table.get(tuple(w[i : i + length]))
                if pid is not None:
                    return f"contains benchmark prompt {pid}"
        return None
