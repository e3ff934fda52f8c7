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


def test_extend_at_chosen_positions_equals_every_position(tiny_lm):
    """keep=<boolean [B, W]>: the log-softmax at the True positions only, row-major, equal to those rows
    of keep="all" (the vocabulary head runs on the kept positions alone)."""
    import torch

    from dpcore.lm.prefix_cache import PrefixCache

    prefix = PrefixCache(tiny_lm, tiny_lm.encode("Classify the article."))
    rows = [tiny_lm.encode("Stocks fell sharply today"), tiny_lm.encode("A goal"), tiny_lm.encode("Rain")]
    width = max(len(r) for r in rows)
    wanted = torch.zeros((len(rows), width), dtype=torch.bool)
    wanted[0, [0, 2, len(rows[0]) - 1]] = True
    wanted[1, len(rows[1]) - 1] = True
    wanted[2, 0] = True
    _, every = prefix.extend(prefix.start(len(rows)), rows, keep="all")  # [B, W, V]
    grown, chosen = prefix.extend(prefix.start(len(rows)), rows, keep=wanted)  # [N, V]
    assert chosen.shape == (int(wanted.sum()), every.shape[-1])
    torch.testing.assert_close(chosen, every[wanted], atol=1e-5, rtol=1e-5)
    assert grown.next_position.tolist() == [prefix.offset + len(prefix) + len(r) for r in rows]
