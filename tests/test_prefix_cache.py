"""The shared prefix (dpcore.lm.prefix_cache): one definition of where it ends, for scoring and generation."""

from __future__ import annotations

from dpcore.lm.prefix_cache import common_prefix_length


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[9, 2], [1, 2]]) == 0
    assert common_prefix_length([]) == 0
    assert common_prefix_length([[5, 6, 7]]) == 3


def test_common_prefix_length_reserves_own_tokens():
    # every prompt keeps `reserve` tokens of its own (a continuation needs a new token to read logits from)
    assert common_prefix_length([[1, 2, 3], [1, 2, 3, 4]], reserve=1) == 2
    assert common_prefix_length([[1, 2], [1, 2]], reserve=1) == 1
    assert common_prefix_length([[1], [1, 2]], reserve=1) == 0
    assert common_prefix_length([[], [1]], reserve=1) == 0
    assert common_prefix_length([[1, 2, 3, 9], [1, 2, 3, 8]], reserve=1) == 3
