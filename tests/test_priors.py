"""feature_draft.priors: the n-gram successor index and the lookup bonus, against a direct scan."""

import random

from feature_draft.priors import SuccessorIndex, lookup_bonus
from helpers import brute_successors


def test_a_worked_example():
    index = SuccessorIndex(2)
    index.extend([5, 6, 7, 5, 6, 8])
    assert index.successors([9, 5, 6]) == [{7, 8}, {7, 8}]  # after 6; after (5, 6)
    assert index.successors([1, 5]) == [{6}, set()]
    assert index.successors([8]) == [set()]  # 8 ends the text: nothing followed it yet
    assert lookup_bonus(index, [7, 5], [1.0, 10.0]) == {6: 11.0}  # 5 → 6 and (7, 5) → 6
    assert lookup_bonus(index, [4, 6], [1.0, 10.0]) == {7: 1.0, 8: 1.0}
    assert lookup_bonus(index, [], [1.0]) == {}


def test_reading_in_pieces_equals_a_direct_scan():
    rng = random.Random(0)
    text = [rng.randrange(6) for _ in range(200)]
    index = SuccessorIndex(3)
    read = 0
    while read < len(text):
        piece = rng.randint(1, 7)
        index.extend(text[read:read + piece])
        read += piece
        for _ in range(5):
            suffix = [rng.randrange(6) for _ in range(rng.randint(1, 4))]
            assert lookup_bonus(index, suffix, [1.0, 2.5, 4.0]) == brute_successors(text[:read], suffix, [1.0, 2.5, 4.0])
