"""The verbatim check (dpcore.audit.overlap): longest shared token run, against a brute force."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.audit.overlap import verbatim_overlap, verbatim_overlap_tokens, whitespace_tokenize
from dpcore.errors import ConfigError


def brute_longest(demo, record):
    best = 0
    for i in range(len(demo)):
        for j in range(len(record)):
            k = 0
            while i + k < len(demo) and j + k < len(record) and demo[i + k] == record[j + k]:
                k += 1
            best = max(best, k)
    return best


def test_overlap_constructed_case():
    report = verbatim_overlap(
        ["a b c d e f g h i j", "x y z", "nothing shared"],
        ["q a b c d e f g h i r", "b c d e f g h i j k", "z y x", "a b c"],
        threshold=8,
    )
    assert report.max_overlap_tokens == (9, 1, 0)
    assert report.records_over_threshold == (2, 0, 0)
    assert report.overlapping_records == 2 and report.max_overlap == 9
    assert report.tokenizer == "whitespace"
    below = verbatim_overlap(["a b c d e f g h i j"], ["a b c d e f g x"], threshold=8)
    assert below.max_overlap_tokens == (7,) and below.overlapping_records == 0


def test_overlap_matches_brute_force():
    rng = np.random.default_rng(3)
    for threshold in (1, 3, 5):
        records = [rng.integers(0, 4, size=rng.integers(0, 15)).tolist() for _ in range(30)]
        demos = [rng.integers(0, 4, size=rng.integers(1, 12)).tolist() for _ in range(6)]
        demos.append(records[2] + records[3])  # crosses a record boundary: must not join the two
        report = verbatim_overlap_tokens(demos, records, threshold)
        for d, demo in enumerate(demos):
            longest = [brute_longest(demo, record) for record in records]
            assert report.max_overlap_tokens[d] == max(longest)
            assert report.records_over_threshold[d] == sum(v >= threshold for v in longest)
        over = {r for r, record in enumerate(records) if any(brute_longest(d, record) >= threshold for d in demos)}
        assert report.overlapping_records == len(over)


def test_overlap_edge_cases():
    assert verbatim_overlap_tokens([], [[1, 2]], 8).max_overlap == 0
    assert verbatim_overlap_tokens([[1, 2]], [], 8).max_overlap_tokens == (0,)
    assert verbatim_overlap_tokens([[]], [[1, 2]], 8).max_overlap_tokens == (0,)
    assert verbatim_overlap_tokens([[7] * 20], [[7] * 30], 8).max_overlap_tokens == (20,)
    with pytest.raises(ConfigError, match="overlap_threshold"):
        verbatim_overlap_tokens([[1]], [[1]], 0)
    assert whitespace_tokenize(["a b", "b  a\nc"]) == [[0, 1], [1, 0, 2]]


def test_overlap_finds_the_copy_among_100k_records():
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 49152, size=40).tolist() for _ in range(100_000)]
    demos = [rng.integers(0, 49152, size=40).tolist() for _ in range(8)]
    demos.append(records[123][5:30])
    report = verbatim_overlap_tokens(demos, records, 8)
    assert report.max_overlap_tokens[-1] == 25 and report.records_over_threshold[-1] == 1
    assert max(report.max_overlap_tokens[:-1]) < 8
