"""AdaDPSyn's PFIRR aggregation (dpcore/adadpsyn/radius.py, pfirr.py): every sub-mechanism's sensitivity by
brute force (one point replaced), the noise drawn against the std the accountant assumes, the worst case
never below it, agreement recovering the mean with a small radius, and the neighbour coupling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpcore.adadpsyn.params import PAPER, RADIUS_MAX, PfirrParams, coverage_count, radius_search_iterations
from dpcore.adadpsyn.pfirr import (
    COUNT_SENSITIVITY,
    adaptive_aggregate,
    average_sensitivity,
    clip_to_ball,
    count_within,
    normalised_center,
    pad_groups,
    pfirr,
)
from dpcore.adadpsyn.radius import L_SENSITIVITY, good_radius_score, pairwise_distances
from dpcore.errors import ConfigError

RADII = np.linspace(0.0, RADIUS_MAX, 29)


def _point_sets(rng, m: int, k: int, count: int):
    """Point sets of every shape that matters: tight clusters, two clusters, spread, simplex vertices."""
    for i in range(count):
        shape = i % 4
        if shape == 0:
            base = rng.dirichlet(np.ones(k) * 0.3)
            pts = 0.9 * base + 0.1 * rng.dirichlet(np.ones(k), size=m)
        elif shape == 1:
            a, b = rng.dirichlet(np.ones(k) * 0.2, size=2)
            pts = np.array([(a if j % 2 else b) * 0.95 + 0.05 * rng.dirichlet(np.ones(k)) for j in range(m)])
        elif shape == 2:
            pts = rng.dirichlet(np.ones(k) * 0.1, size=m)
        else:
            pts = np.eye(k)[rng.integers(0, k, size=m)]
        yield pts


def _replacements(rng, pts, k: int):
    """Replacements of one point: a vertex, another point's copy, a random point, the uniform vector."""
    yield np.eye(k)[rng.integers(0, k)]
    yield pts[rng.integers(0, len(pts))].copy()
    yield rng.dirichlet(np.ones(k) * 0.2)
    yield np.full(k, 1.0 / k)


# --------------------------------------------------------------------------- sensitivities (brute force)


def test_good_radius_score_moves_at_most_its_sensitivity_when_one_point_is_replaced():
    rng = np.random.default_rng(0)
    worst = 0.0
    for m in (4, 7, 12):
        for pts in _point_sets(rng, m, 6, 12):
            for cap in {1, coverage_count(0.8, m), m}:
                before = [good_radius_score(pairwise_distances(pts), r, cap) for r in RADII]
                for index in range(m):
                    for new in _replacements(rng, pts, 6):
                        changed = pts.copy()
                        changed[index] = new
                        d = pairwise_distances(changed)
                        for r, value in zip(RADII, before, strict=True):
                            worst = max(worst, abs(good_radius_score(d, r, cap) - value))
    assert worst <= L_SENSITIVITY
    assert worst > 1.0  # a bound of 1 would be wrong: the sensitivity charged is needed


def test_coverage_count_moves_at_most_one_when_one_point_is_replaced():
    rng = np.random.default_rng(1)
    worst = 0
    for pts in _point_sets(rng, 9, 5, 20):
        center = rng.dirichlet(np.ones(5))
        for r in RADII:
            before = count_within(pts, center, r)
            for index in range(len(pts)):
                for new in _replacements(rng, pts, 5):
                    changed = pts.copy()
                    changed[index] = new
                    worst = max(worst, abs(count_within(changed, center, r) - before))
    assert worst == COUNT_SENSITIVITY


def test_clipped_sum_moves_at_most_2R_and_the_first_sum_at_most_sqrt2():
    rng = np.random.default_rng(2)
    ratio = 0.0
    for pts in _point_sets(rng, 8, 5, 20):
        center = rng.dirichlet(np.ones(5))
        for radius in (0.01, 0.1, 0.3, RADIUS_MAX):
            total = clip_to_ball(pts, center, radius).sum(axis=0)
            for index in range(len(pts)):
                for new in _replacements(rng, pts, 5):
                    changed = pts.copy()
                    changed[index] = new
                    moved = np.linalg.norm(clip_to_ball(changed, center, radius).sum(axis=0) - total)
                    ratio = max(ratio, moved / average_sensitivity(radius))
    assert ratio <= 1 + 1e-12
    assert ratio > 0.95  # nearly attained: two points on opposite sides of the ball
    # the first average does not clip: probability vectors are at most sqrt(2) = 2 x RADIUS_MAX apart
    vertices = np.eye(5)
    assert np.linalg.norm(vertices[0] - vertices[1]) == pytest.approx(average_sensitivity(RADIUS_MAX))
    for _ in range(200):
        a, b = rng.dirichlet(np.ones(5) * 0.1, size=2)
        assert np.linalg.norm(a - b) <= average_sensitivity(RADIUS_MAX) + 1e-12


def test_clipped_points_lie_in_the_ball_and_inner_points_stay():
    rng = np.random.default_rng(3)
    pts = rng.dirichlet(np.ones(6) * 0.2, size=30)
    center = pts.mean(axis=0)
    clipped = clip_to_ball(pts, center, 0.2)
    assert (np.linalg.norm(clipped - center, axis=1) <= 0.2 * (1 + 1e-12)).all()
    inside = np.linalg.norm(pts - center, axis=1) <= 0.2
    np.testing.assert_array_equal(clipped[inside], pts[inside])


# --------------------------------------------------------------------------- the whole step


def test_replayed_on_a_neighbour_every_query_moves_within_its_sensitivity():
    """The adaptive composition's view: PFIRR's trace on S, each of its queries asked again of S with one
    point replaced, at the same radius and the same centre (the earlier DP outputs), moves within the
    sensitivity charged: L(r) by 2, each count by 1, each clipped sum by 2R."""
    rng = np.random.default_rng(4)
    params = PfirrParams(sigma_avg=0.8, sigma_radius=0.5, sigma_test=0.5, shrink=1.0, updates=3)
    moved = {"radius": 0.0, "test": 0.0, "average": 0.0}
    replayed_averages = 0
    for pts in _point_sets(rng, 10, 8, 16):
        trace = pfirr(pts, params, np.random.default_rng(int(rng.integers(1 << 30))))
        cap = coverage_count(params.coverage, len(pts))
        for new in _replacements(rng, pts, 8):
            changed = pts.copy()
            changed[rng.integers(0, len(pts))] = new
            distances = pairwise_distances(changed)
            for radius, exact, _ in trace.radius_queries:
                moved["radius"] = max(moved["radius"], abs(good_radius_score(distances, radius, cap) - exact))
            for j, (radius, count, _) in enumerate(trace.tests):
                center = normalised_center(trace.averages[j].noisy, len(pts))
                moved["test"] = max(moved["test"], abs(count_within(changed, center, radius) - count))
            first = trace.averages[0]
            moved["average"] = max(moved["average"],
                                   np.linalg.norm(changed.sum(axis=0) - first.total) / average_sensitivity(first.radius))
            for j, average in enumerate(trace.averages[1:]):
                center = normalised_center(trace.averages[j].noisy, len(pts))
                total = clip_to_ball(changed, center, average.radius).sum(axis=0)
                moved["average"] = max(moved["average"],
                                       np.linalg.norm(total - average.total) / average_sensitivity(average.radius))
                replayed_averages += 1
    assert moved["radius"] <= L_SENSITIVITY
    assert moved["test"] <= COUNT_SENSITIVITY
    assert moved["average"] <= 1 + 1e-12
    assert replayed_averages > 10  # clipped averages were replayed, not only the first


def test_the_noise_drawn_has_the_std_the_accountant_assumes():
    """Over many draws on fixed points: (noisy - exact) / std is N(0, 1) for every kind of query (KS), and
    each std is the sensitivity times the noise multiplier charged."""
    rng = np.random.default_rng(5)
    pts = 0.8 * rng.dirichlet(np.ones(12) * 0.3) + 0.2 * rng.dirichlet(np.ones(12), size=16)
    params = PfirrParams(sigma_avg=0.9, sigma_radius=1.5, sigma_test=2.0)
    radius_z, test_z, average_z = [], [], []
    for seed in range(600):
        trace = pfirr(pts, params, np.random.default_rng(seed))
        assert trace.radius_std == L_SENSITIVITY * params.sigma_radius
        assert trace.test_std == COUNT_SENSITIVITY * params.sigma_test
        radius_z += [(noisy - exact) / trace.radius_std for _, exact, noisy in trace.radius_queries]
        test_z += [(noisy - exact) / trace.test_std for _, exact, noisy in trace.tests]
        for average in trace.averages:
            assert average.std == pytest.approx(average_sensitivity(average.radius) * params.sigma_avg, rel=1e-15)
            average_z += list((average.noisy - average.total) / average.std)
    for z in (radius_z, test_z, average_z):
        assert len(z) > 300
        assert stats.kstest(z, "norm").pvalue > 1e-3
        assert np.std(z) == pytest.approx(1.0, abs=0.08)


def test_the_worst_case_never_uses_less_noise_or_more_queries_than_charged():
    rng = np.random.default_rng(6)
    for params in (PAPER, PfirrParams(sigma_avg=0.3, sigma_radius=0.2, sigma_test=0.2, updates=4)):
        for pts in _point_sets(rng, 12, 10, 24):
            trace = pfirr(pts, params, np.random.default_rng(int(rng.integers(1 << 30))))
            assert len(trace.radius_queries) == params.radius_queries
            assert len(trace.tests) <= params.tests
            assert 1 <= len(trace.averages) <= params.averages == params.tests + 1
            assert trace.averages[0].radius == RADIUS_MAX
            for average in trace.averages:
                assert average.radius <= RADIUS_MAX
                assert average.std >= average_sensitivity(average.radius) * params.sigma_avg * (1 - 1e-15)


def test_agreeing_groups_get_a_small_radius_and_the_mean_back():
    """Identical group distributions: the radius shrinks, the noise with it, and the aggregate is the mean
    much closer than with the worst-case radius (Tang-style noise, R = sqrt(2)/2 throughout)."""
    m, k = 100, 10
    mean = np.random.default_rng(7).dirichlet(np.ones(k))
    pts = np.repeat(mean[None, :], m, axis=0)
    adaptive = PfirrParams(sigma_avg=2.0, sigma_radius=0.05, sigma_test=0.05, shrink=1.0, updates=3)
    worst_case = PfirrParams(sigma_avg=2.0, sigma_radius=0.05, sigma_test=0.05, shrink=1.0, updates=0)
    traces = [pfirr(pts, adaptive, np.random.default_rng(seed)) for seed in range(100)]
    # L(r) = t at every r (all distances are 0), so each noisy comparison with t passes half the time (the
    # authors' test against t itself): the bisection goes down with probability 3/4 per iteration
    assert np.mean([t.radius for t in traces]) < 0.3
    assert np.mean([t.final_radius for t in traces]) < RADIUS_MAX / 2
    errors = [np.linalg.norm(t.scores - mean) for t in traces]
    worst_errors = [np.linalg.norm(pfirr(pts, worst_case, np.random.default_rng(s)).scores - mean) for s in range(100)]
    assert np.mean(errors) < np.mean(worst_errors) / 2
    assert np.mean([int(np.argmax(t.scores) == np.argmax(mean)) for t in traces]) > 0.9
    # the paper's parameters (M = 20, K = 100): agreeing groups still move to a smaller ball on average ...
    agreeing = np.repeat(np.random.default_rng(8).dirichlet(np.ones(100) * 0.1)[None, :], 20, axis=0)
    assert np.mean([pfirr(agreeing, PAPER, np.random.default_rng(s)).final_radius for s in range(100)]) < 0.6
    # ... and spread groups (simplex vertices) stay at the radius the accounting started from
    spread = np.eye(k)[np.arange(m) % k]
    spread_traces = [pfirr(spread, adaptive, np.random.default_rng(s)) for s in range(20)]
    assert all(t.final_radius == RADIUS_MAX for t in spread_traces)
    assert np.mean([t.radius for t in spread_traces]) > 0.6  # 10 points per vertex: no ball holds t = 80


def test_the_stream_position_after_a_step_does_not_depend_on_the_data():
    params = PAPER
    states = set()
    for pts in (np.eye(5)[np.arange(8) % 5], np.full((8, 5), 0.2), np.random.default_rng(8).dirichlet(np.ones(5), 8)):
        rng = np.random.default_rng(11)
        pfirr(pts, params, rng)
        states.add(str(rng.bit_generator.state))
    assert len(states) == 1


def test_adaptive_aggregate_is_a_drop_in_seeded_and_tensor_shaped():
    import torch

    pts = np.random.default_rng(9).dirichlet(np.ones(7), size=5)
    a = adaptive_aggregate(pts, PAPER, np.random.default_rng(1))
    b = adaptive_aggregate(torch.from_numpy(pts), PAPER, np.random.default_rng(1))
    assert isinstance(a, torch.Tensor) and a.dtype == torch.float64 and a.shape == (7,)
    assert torch.equal(a, b)
    assert float(a.sum()) == pytest.approx(1.0) and float(a.min()) >= 0


# --------------------------------------------------------------------------- points


def test_padding_empty_groups_with_the_public_distribution_makes_a_record_replace_one_point():
    """A record added to a group (empty or not) changes that group's distribution only: with the empty
    groups padded by the public distribution, the M points of D and D plus one record differ in one row."""
    rng = np.random.default_rng(10)
    public = rng.dirichlet(np.ones(6))
    record_dists = rng.dirichlet(np.ones(6), size=9)
    groups = [[0, 1], [], [2], [3, 4, 5], []]  # M = 5 groups, two empty

    def points(groups):
        nonempty = [record_dists[g].mean(axis=0) for g in groups if g]
        return pad_groups(np.array(nonempty).reshape(-1, 6), len(groups), public)

    before = points(groups)
    for target in range(len(groups)):
        after_groups = [list(g) for g in groups]
        after_groups[target].append(8)
        after = points(after_groups)
        assert after.shape == before.shape == (5, 6)
        # as multisets: all rows but one are shared
        unmatched = [row for row in after if not any(np.allclose(row, b) for b in before)]
        assert len(unmatched) == 1


def test_pad_groups_and_params_refuse_what_would_break_the_bounds():
    assert pad_groups(np.empty((0, 4)), 3, None).tolist() == [[0.25] * 4] * 3
    with pytest.raises(ConfigError):
        pad_groups(np.ones((4, 3)) / 3, 3, None)
    rows = pad_groups(np.array([[np.nan, 1.0, 1.0], [2.0, -1.0, 2.0]]), 2, None)
    np.testing.assert_allclose(rows, [[1 / 3] * 3, [0.5, 0.0, 0.5]])
    for bad in ({"sigma_avg": -1}, {"sigma_avg": 1, "tolerance": 0}, {"sigma_avg": 1, "coverage": 0},
                {"sigma_avg": 1, "updates": -1}, {"sigma_avg": math.nan}):
        with pytest.raises(ConfigError):
            PfirrParams(**bad)
    assert radius_search_iterations(0.1) == 3  # the authors' accountant: ceil(log2(0.7071 / 0.1)) = 3
    assert PAPER.radius_queries == 6 and PAPER.tests == 2 and PAPER.averages == 3
    assert coverage_count(0.8, 20) == 16 and coverage_count(0.8, 1) == 1
