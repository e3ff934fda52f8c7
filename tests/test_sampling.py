"""Algorithm 1 lines 3-5: Poisson subsampling into M groups, and the paper's fixed-size sampler."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpcore.errors import ConfigError
from dpcore.fewshot.release import RunFolder, tang_artifact
from dpcore.fewshot.sampling import (
    ACCOUNTED_SAMPLERS,
    draw_groups,
    fixed_size_groups,
    poisson_groups,
    sampling_rate,
)
from dpcore.release import gate


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


# --------------------------------------------------------------------------- fixed sampler: privacy


def _groups_of(sequence, subset_size):
    return tuple(tuple(sequence[i:i + subset_size]) for i in range(0, len(sequence), subset_size))


def _fixed_distribution(num_records, num_subsets, subset_size):
    """Exact law of `fixed_size_groups`: uniform over ordered sequences of MN distinct records."""
    sequences = list(itertools.permutations(range(num_records), num_subsets * subset_size))
    weight = Fraction(1, len(sequences))
    return {_groups_of(seq, subset_size): weight for seq in sequences}


@pytest.mark.parametrize("n, num_subsets, subset_size", [(4, 2, 1), (4, 3, 1), (5, 2, 2), (6, 1, 3)])
def test_fixed_sampler_add_one_record_is_the_poisson_style_mixture(n, num_subsets, subset_size):
    """The coupling of the proof in `dpcore.fewshot.sampling`, exactly: for D' = D + x,
    law(D') = (1 - p) law(D) + p law(D with a uniform slot replaced by x), p = MN/(n+1),
    and every replaced sample differs from its source in exactly one group."""
    m, x = num_subsets * subset_size, n
    with_x = _fixed_distribution(n + 1, num_subsets, subset_size)
    without = _fixed_distribution(n, num_subsets, subset_size)
    p = Fraction(m, n + 1)
    mixture = Counter({outcome: (1 - p) * w for outcome, w in without.items()})
    for outcome, w in without.items():
        flat = [r for group in outcome for r in group]
        for slot in range(m):
            replaced = _groups_of(flat[:slot] + [x] + flat[slot + 1:], subset_size)
            assert sum(a != b for a, b in zip(outcome, replaced, strict=True)) == 1
            mixture[replaced] += p * w / m
    assert dict(mixture) == with_x
    # The accountant's q for either neighbour of the private set bounds p.
    assert p == Fraction(m, n + 1) <= Fraction(m, n + 1)  # D_y = D': q = m/|D_y| = p
    assert p < Fraction(m, n)  # D_y = D: q = m/|D_y| > p


def test_fixed_size_groups_draw_uniform_ordered_sequences():
    """The code draws the law the proof assumes: every ordered (M*N)-sequence equally often."""
    rng = np.random.default_rng(2)
    counts = Counter(tuple(np.concatenate(fixed_size_groups(5, 3, 1, rng)).tolist()) for _ in range(30000))
    assert len(counts) == 60  # 5 * 4 * 3 ordered sequences
    assert stats.chisquare(list(counts.values())).pvalue > 1e-3


def _hockey_stick(p_density, q_density, alpha, dx):
    return float(np.maximum(p_density - alpha * q_density, 0.0).sum() * dx)


def _mixture_density(grid, centres_weights, sigma):
    density = np.zeros_like(grid)
    for centre, weight in centres_weights.items():
        density += float(weight) * stats.norm.pdf(grid, loc=centre, scale=sigma)
    return density


@pytest.mark.parametrize("values, x, subset_size", [
    ([0.0] * 5, 1.0, 1),              # worst case: every replacement moves one group by the full 1
    ([0.1, 0.9, 0.4, 0.6, 0.0], 1.0, 1),
    ([0.2, 0.7, 0.5, 0.3, 0.9], 0.0, 2),
])
def test_fixed_sampler_is_dominated_by_the_poisson_accountant_pair(values, x, subset_size):
    """End to end on a 1-D Gaussian mechanism (each group contributes the mean of its record values
    in [0, 1], so one group change moves the sum by at most 1; noise N(0, sigma^2)): the exact
    output laws of the fixed sampler on D and D' = D + x are within the hockey-stick divergence,
    in both directions, of the pair the Poisson accountant composes,
    ((1 - q) N(0, s^2) + q N(1, s^2), N(0, s^2)) with q = MN/|D'|. Tight in the worst case."""
    sigma, num_subsets = 0.5, 4 // subset_size
    grid = np.linspace(-6.0, 10.0, 64001)
    dx = grid[1] - grid[0]

    def output_law(records):
        law = Counter()
        for outcome, w in _fixed_distribution(len(records), num_subsets, subset_size).items():
            total = sum(np.mean([records[i] for i in group]) for group in outcome)
            law[round(float(total), 12)] += w
        return _mixture_density(grid, law, sigma)

    small, large = output_law(values), output_law(values + [x])
    q = 4 / (len(values) + 1)
    shift = 1.0 if x >= max(values) else -1.0
    base = stats.norm.pdf(grid, scale=sigma)
    mixed = (1 - q) * base + q * stats.norm.pdf(grid, loc=shift, scale=sigma)
    for epsilon in (0.0, 0.5, 1.0, 2.0):
        alpha = math.exp(epsilon)
        bound_add, bound_remove = _hockey_stick(mixed, base, alpha, dx), _hockey_stick(base, mixed, alpha, dx)
        assert _hockey_stick(large, small, alpha, dx) <= bound_add + 1e-6
        assert _hockey_stick(small, large, alpha, dx) <= bound_remove + 1e-6
        if values == [0.0] * 5:
            assert _hockey_stick(large, small, alpha, dx) == pytest.approx(bound_add, abs=1e-6)


def test_release_gate_refuses_demos_of_a_sampler_the_accountant_does_not_cover():
    """The gate agrees with the proof: poisson and fixed demos pass the sampler condition; demos of
    any other sampler, or without a recorded sampler, are refused."""
    import pandas as pd

    assert set(ACCOUNTED_SAMPLERS) == {"poisson", "fixed"}
    calibration = pd.DataFrame({"epsilon": [1.0], "crosscheck_agreed": [True]})
    audit = pd.DataFrame({"passed": [True]})

    def failures(demos):
        run = RunFolder(path=Path("."), manifest={"dataset": "sst2"}, demos=demos, calibration=calibration,
                             audit=audit, changed_files=())
        return gate.release_failures(gate.evidence(tang_artifact("r1", run, 1.0), []))

    demos = pd.DataFrame({"method": ["tang", "tang"], "epsilon": [1.0, 1.0], "seeded_noise": [False, False],
                          "sampler": ["poisson", "fixed"], "text": ["a", "b"], "label": ["x", "y"]})
    assert not any("sampler" in line for line in failures(demos))
    shuffled = demos.assign(sampler=["poisson", "shuffle"])
    assert any("sampler" in line and "shuffle" in line for line in failures(shuffled))
    unrecorded = demos.drop(columns=["sampler"])
    assert any("sampler" in line for line in failures(unrecorded))
