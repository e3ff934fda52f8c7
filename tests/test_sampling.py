"""Algorithm 1 lines 3-5: Poisson subsampling into M groups, and the paper's fixed-size sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.errors import ConfigError
from dpcore.sampling import draw_groups, fixed_size_groups, poisson_groups, sampling_rate


def _draws(num_records, q, groups, trials, seed=0):
    rng = np.random.default_rng(seed)
    return [poisson_groups(num_records, q, groups, rng) for _ in range(trials)]


def test_sampling_rate_is_mn_over_records():
    assert sampling_rate(10, 2, 30000) == pytest.approx(20 / 30000)
    assert sampling_rate(5, 4, 20) == 1.0


@pytest.mark.parametrize("m, n, records", [(10, 2, 19), (3, 3, 8)])
def test_sampling_rate_above_one_is_refused(m, n, records):
    with pytest.raises(ConfigError, match="sampling rate"):
        sampling_rate(m, n, records)


@pytest.mark.parametrize("m, n", [(0, 2), (2, 0), (-1, 1), (2.5, 1)])
def test_group_sizes_below_one_are_refused(m, n):
    with pytest.raises(ConfigError, match="num_subsets|subset_size"):
        sampling_rate(m, n, 100)


def test_poisson_groups_are_disjoint_in_range_and_int():
    for groups in _draws(200, 0.2, 7, 50):
        assert len(groups) == 7
        flat = np.concatenate(groups)
        assert flat.dtype == np.int64
        assert len(set(flat.tolist())) == flat.size  # disjoint, no repeats
        assert flat.size == 0 or (flat.min() >= 0 and flat.max() < 200)


def test_inclusion_frequency_matches_q():
    num_records, q, trials = 40, 0.3, 4000
    counts = np.zeros(num_records)
    sizes = []
    for groups in _draws(num_records, q, 5, trials, seed=1):
        flat = np.concatenate(groups)
        counts[flat] += 1
        sizes.append(flat.size)
    freq = counts / trials
    se = math.sqrt(q * (1 - q) / trials)
    assert np.all(np.abs(freq - q) < 5 * se), (freq.min(), freq.max())
    assert abs(freq.mean() - q) < 5 * se / math.sqrt(num_records)
    # The sample size is Binomial(n, q), not fixed: Poisson sampling.
    assert np.var(sizes) == pytest.approx(num_records * q * (1 - q), rel=0.15)


def test_group_assignment_is_uniform_and_independent():
    num_records, q, m, trials = 12, 0.5, 4, 6000
    group_of_0 = []
    same_group = together = 0
    joint = np.zeros((m, 2))  # group of record 0 x inclusion of record 1
    for groups in _draws(num_records, q, m, trials, seed=2):
        where = {int(i): g for g, members in enumerate(groups) for i in members}
        if 0 in where:
            group_of_0.append(where[0])
            joint[where[0], int(1 in where)] += 1
            if 1 in where:
                together += 1
                same_group += where[0] == where[1]
    counts = np.bincount(group_of_0, minlength=m)
    expected = len(group_of_0) / m
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.3, counts  # chi-square, 3 dof, p = 0.001
    # Two included records share a group with probability 1/M (independent assignment).
    assert same_group / together == pytest.approx(1 / m, abs=4 * math.sqrt((1 / m) * (1 - 1 / m) / together))
    # Record 0's group does not depend on whether record 1 was sampled.
    rows = joint.sum(axis=1, keepdims=True)
    cols = joint.sum(axis=0, keepdims=True)
    expected_joint = rows * cols / joint.sum()
    chi2_joint = float(((joint - expected_joint) ** 2 / expected_joint).sum())
    assert chi2_joint < 16.3, joint


def test_empty_groups_happen_and_no_record_is_dropped_or_duplicated():
    empties = 0
    for groups in _draws(100, 0.05, 5, 400, seed=3):  # about one record per group on average
        empties += sum(len(g) == 0 for g in groups)
    assert empties > 0  # Poisson sampling leaves groups empty (they contribute nothing)


def test_poisson_is_reproducible_and_fresh_per_call():
    a = poisson_groups(500, 0.1, 5, np.random.default_rng(7))
    b = poisson_groups(500, 0.1, 5, np.random.default_rng(7))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    rng = np.random.default_rng(7)
    first, second = poisson_groups(500, 0.1, 5, rng), poisson_groups(500, 0.1, 5, rng)
    assert not all(np.array_equal(x, y) for x, y in zip(first, second, strict=True))


@pytest.mark.parametrize("q", [-0.1, 1.5, float("nan")])
def test_poisson_refuses_bad_rates(q):
    with pytest.raises(ConfigError, match="sampling_rate"):
        poisson_groups(10, q, 2, np.random.default_rng(0))


def test_fixed_size_groups_are_m_groups_of_n_without_replacement():
    rng = np.random.default_rng(0)
    for _ in range(50):
        groups = fixed_size_groups(30, 5, 3, rng)
        assert [len(g) for g in groups] == [3] * 5
        flat = np.concatenate(groups)
        assert len(set(flat.tolist())) == 15 and flat.max() < 30
    with pytest.raises(ConfigError, match="exceeds"):
        fixed_size_groups(14, 5, 3, rng)


def test_draw_groups_dispatches_and_refuses_unknown_sampler():
    rng = np.random.default_rng(0)
    assert [len(g) for g in draw_groups("fixed", 50, 4, 2, rng)] == [2] * 4
    assert len(draw_groups("poisson", 50, 4, 2, rng)) == 4
    with pytest.raises(ConfigError, match="sampler"):
        draw_groups("shuffle", 50, 4, 2, rng)
    with pytest.raises(ConfigError, match="sampling rate"):
        draw_groups("poisson", 7, 4, 2, rng)
