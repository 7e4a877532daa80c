"""Context priors for the ``eagle`` drafter's logits: pure functions of the text read so far.

The target repeats itself and its prompt: words it has used, and the continuations of phrases it has
already written. A one-layer draft predicts both less often than the target does them, so the
drafter adds to its logits (docs/draft.md, "The context vocabulary and the priors"):

- ``context_bias`` to every token of the committed text (a copy prior);
- ``lookup_bias[n-1]`` to every token that followed an earlier occurrence of the last n tokens of
  the draft's path (the committed text and the tokens drafted before it), n = 1..len(lookup_bias):
  prompt lookup's evidence, graded by the length of the match, as a prior on the draft's choice.

Successors are looked up in the committed text only; the suffix they are looked up for may end in
draft tokens. The draft's distribution stays what it is told to be, so verification is unaffected.
"""

from __future__ import annotations

from typing import Sequence


class SuccessorIndex:
    """For n = 1..``longest``: every n-gram of the text read so far → the tokens that followed it."""

    def __init__(self, longest: int):
        self.longest = longest
        self.text: list[int] = []
        self.table: dict[tuple[int, ...], set[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Read ``tokens`` after the text so far."""
        for token in tokens:
            p = len(self.text)
            for n in range(1, min(self.longest, p) + 1):
                self.table.setdefault(tuple(self.text[p - n:p]), set()).add(int(token))
            self.text.append(int(token))

    def successors(self, suffix: Sequence[int]) -> list[set[int]]:
        """[n-1] → the tokens that followed the last n tokens of ``suffix`` in the text read, for n =
        1..min(longest, len(suffix))."""
        return [self.table.get(tuple(suffix[len(suffix) - n:]), set())
                for n in range(1, min(self.longest, len(suffix)) + 1)]


def lookup_bonus(index: SuccessorIndex, suffix: Sequence[int], biases: Sequence[float]) -> dict[int, float]:
    """token → Σ biases[n-1] over the n whose match of ``suffix``'s last n tokens it followed."""
    bonus: dict[int, float] = {}
    for bias, followers in zip(biases, index.successors(suffix)):
        for token in followers:
            bonus[token] = bonus.get(token, 0.0) + bias
    return bonus
