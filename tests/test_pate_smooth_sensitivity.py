"""Smooth-sensitivity release of PromptPATE's data-dependent epsilon (Papernot et al. 2018, Section 4.3).

Reference values: computed with github.com/tensorflow/privacy (snapshot at commit 03035d5),
research/pate_2018/smooth_sensitivity.py: compute_logq0_gnmax, check_conditions (C5, C6),
compute_local_sensitivity_bounds_gnmax, compute_local_sensitivity_bounds_threshold,
compute_discounted_max and compute_rdp_of_smooth_sensitivity_gaussian, with the per-query local
sensitivities summed over the threshold tests and the answered queries' GNMax (made non-decreasing
in the distance first: SMOOTH_SENSITIVITY_REFERENCE). (Where a
threshold local-sensitivity list reaches the largest count E at distance E - v, that code leaves
the entry at 0; ours counts it, a larger and still valid bound: compared on the other entries.)
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpcore.errors import ConfigError
from dpcore.pate import data_dependent as dd
from dpcore.pate import smooth_sensitivity as pss

CONSENSUS = [[200, 0], [198, 2], [195, 5], [190, 10], [185, 15], [199, 1], [193, 7], [188, 12]]
MIXED = [[181, 9, 5, 5], [150, 30, 10, 10], [200, 0, 0, 0], [179, 21, 0, 0], [100, 100, 0, 0], [190, 4, 3, 3],
         [175, 10, 10, 5], [60, 50, 45, 45], [183, 17, 0, 0], [196, 2, 1, 1]]
MIXED_ANSWERED = [True, False, True, True, False, True, False, False, True, True]
CLAUDE = [[398, 2, 0], [395, 3, 2], [392, 8, 0], [385, 10, 5], [399, 1, 0], [300, 90, 10], [391, 5, 4], [400, 0, 0]]
CLAUDE_ANSWERED = [True, True, True, False, True, False, True, True]
SPLIT = [[60, 50, 45, 45], [80, 70, 30, 20], [100, 60, 25, 15], [52, 50, 49, 49], [120, 40, 20, 20], [70, 70, 30, 30]]

# (votes, answered, E, T, sigma1, sigma2, order, SS_beta at beta = 0.4 / order, reference's own SS_beta).
# Ours: the reference's per-query local-sensitivity lists made non-decreasing in d (np.maximum.accumulate:
# A^(d) must bound every histogram WITHIN d changed teachers, and the queries' histograms move
# together), then summed and discounted with compute_discounted_max. The reference sums the lists
# as they are, which can be smaller (its threshold lists are not monotone): ours is never below it.
SMOOTH_SENSITIVITY_REFERENCE = [
    (CONSENSUS, [True] * 8, 200, 180, 1.0, 20.0, 10.0, 5.186666937597488, 4.665990384594407),
    (SPLIT, [False] * 6, 200, 180, 1.0, 20.0, 10.0, 0.17735243257308692, 0.17735243257308692),
    (SPLIT, [False] * 6, 200, 180, 1.0, 20.0, 50.0, 4.5625156104883775, 2.990823559631678),
    (MIXED, MIXED_ANSWERED, 200, 180, 5.0, 20.0, 10.0, 0.09753565876525233, 0.08103757021174006),
    (MIXED, MIXED_ANSWERED, 200, 180, 5.0, 20.0, 50.0, 0.16914341982374925, 0.10189710165391834),
    (CLAUDE, CLAUDE_ANSWERED, 400, 390, 1.0, 50.0, 20.0, 2.7641767098923222, 2.1118698521411954),
]
# (sigma2, order, log q0, C5, C6): smooth_sensitivity.compute_logq0_gnmax and check_conditions (2 classes)
PLATEAU_REFERENCE = [
    (20.0, 10.0, -3.1410347495741835, True, True),
    (20.0, 20.0, -2.950000299489585, True, False),
    (50.0, 20.0, -3.3065184373897782, True, True),
    (40.0, 50.0, -3.121760950205933, True, False),
]


@pytest.mark.parametrize("votes, answered, teachers, t, sigma1, sigma2, order, expected, reference_raw",
                         SMOOTH_SENSITIVITY_REFERENCE)
def test_smooth_sensitivity_matches_reference(votes, answered, teachers, t, sigma1, sigma2, order, expected,
                                              reference_raw):
    ss = pss.smooth_sensitivity(votes, np.array(answered), teachers=teachers, threshold=t, sigma1=sigma1,
                                sigma2=sigma2, order=order, beta=0.4 / order)
    assert ss == pytest.approx(expected, rel=1e-9)
    assert ss >= reference_raw * (1 - 1e-12)


@pytest.mark.parametrize("sigma2, order, log_q0, c5, c6", PLATEAU_REFERENCE)
def test_plateau_and_conditions_match_reference(sigma2, order, log_q0, c5, c6):
    assert pss._log_q0(sigma2, order) == pytest.approx(log_q0, rel=1e-9)
    assert pss.check_conditions(sigma2, 2, order) == (c5, c6)


@pytest.mark.parametrize("sigma2", [2.0, 5.0, 40.0, 100.0])
def test_the_conditions_are_checked_on_the_scalar_analysis_elementwise(sigma2):
    """C5 and C6 are checked on grids of thousands of q at once (`rdp_from_log_qs`, `_log_bounds`): the same
    values as the one-q functions the release itself uses, on every branch (Theorem 6 or the data-independent
    bound, q = 0 and q = 1, below and above mu1)."""
    log_q = np.concatenate([np.linspace(-700.0, 0.0, 2001), np.linspace(-3.0, -1e-6, 500), [-1e-300, 0.0, -np.inf]])
    below_independent = []
    for order in (2.0, 8.0, 44.0, 64.0):
        grid = dd.rdp_from_log_qs(log_q, sigma2, order)
        one = np.array([dd.rdp_from_log_q(x, sigma2, [order])[0] for x in log_q])
        np.testing.assert_allclose(grid, one, rtol=1e-13, atol=0)
        assert grid[-1] == 0.0 and grid[-2] == order / sigma2 ** 2  # q = 0: fixed output; q = 1: independent
        below_independent.append(bool((grid < order / sigma2 ** 2).any()))
    assert sum(below_independent) >= 3  # Theorem 6's branch is taken (not at order 64 when sigma2 is 2: mu1 < 64)
    finite = log_q[np.isfinite(log_q)]
    for classes in (2, 4, 14):
        bounds = pss._log_bounds(finite, sigma2, classes, upper=True)
        one = np.array([pss._log_bound(x, sigma2, classes, upper=True) for x in finite])
        np.testing.assert_allclose(bounds, one, rtol=1e-13, atol=0)
    with pytest.raises(ConfigError):
        dd.rdp_from_log_qs([0.5], sigma2, 2.0)


def test_gnss_cost_matches_theorem_23_reference():
    # smooth_sensitivity.compute_rdp_of_smooth_sensitivity_gaussian(beta, 10.0, order), beta = 0.4 / order
    for order, cost in ((10.0, 0.2421863685693903), (20.0, 0.2715684156920066), (50.0, 0.5326504438503342)):
        assert pss.gnss_rdp(0.4 / order, 10.0, order) == pytest.approx(cost, rel=1e-12)
    with pytest.raises(ConfigError, match="order"):
        pss.gnss_rdp(0.1, 10.0, 5.0)  # order must stay below 1 / (2 beta)


def _all_histograms(teachers: int, classes: int) -> np.ndarray:
    return np.array([h for h in itertools.product(range(teachers + 1), repeat=classes) if sum(h) == teachers])


def _true_local_sensitivity(values: dict, hists: np.ndarray) -> np.ndarray:
    """max |f(h) - f(h')| over the histograms h' one teacher's vote away."""
    out = np.zeros(len(hists))
    for i, h in enumerate(hists):
        for a, b in itertools.permutations(range(hists.shape[1]), 2):
            if h[a] > 0:
                g = h.copy()
                g[a] -= 1
                g[b] += 1
                out[i] = max(out[i], abs(values[tuple(h)] - values[tuple(g)]))
    return out


@pytest.mark.parametrize("kind", ["gnmax", "threshold"])
def test_local_sensitivity_at_distance_bounds_brute_force(kind):
    """A^(d)(D) >= the local sensitivity of every histogram within d changed teachers of D."""
    teachers, classes, sigma, order, threshold = 24, 3, 4.0, 3.0, 18
    assert pss.check_conditions(sigma, classes, order) == (True, True)
    hists = _all_histograms(teachers, classes)
    if kind == "gnmax":
        values = {tuple(h): float(dd.rdp_from_log_q(dd.log_q_gnmax(h, sigma), sigma, [order])[0]) for h in hists}
        bounds = [pss.local_sensitivities_gnmax(h, teachers, sigma, order) for h in hists]
    else:
        values = {tuple(h): float(dd.rdp_threshold(dd.log_pr_answered(h, threshold, 1.0), 1.0, [order])[0])
                  for h in hists}
        bounds = [pss.local_sensitivities_threshold(h, teachers, threshold, 1.0, order) for h in hists]
    true_ls = _true_local_sensitivity(values, hists)
    assert true_ls.max() > 0  # the test can fail: the bound is data-dependent here
    distance = np.abs(hists[:, None, :] - hists[None, :, :]).sum(axis=2) // 2
    for i, bound in enumerate(bounds):
        for d in range(teachers + 1):
            assert bound[d] >= true_ls[distance[i] <= d].max() * (1 - 1e-9) - 1e-15


def test_release_adds_the_shift_the_scaled_noise_and_its_own_cost():
    votes, answered, order, beta, sigma_ss, delta, delta0 = MIXED, np.array(MIXED_ANSWERED), 10.0, 0.01, 10.0, 1e-6, 5e-7
    kwargs = dict(teachers=200, threshold=180, sigma1=5.0, sigma2=20.0, delta=delta, order=order, beta=beta,
                  sigma_ss=sigma_ss, delta0=delta0)
    exact = dd.data_dependent_epsilon(votes, 180, 5.0, 20.0, delta, orders=[order], answered=answered).rdp[0]
    ss = pss.smooth_sensitivity(votes, answered, teachers=200, threshold=180, sigma1=5.0, sigma2=20.0, order=order,
                                beta=beta)
    z = np.random.default_rng(3).standard_normal()
    shift, scale = pss.upper_bound_factors(beta, sigma_ss, delta0)
    release = pss.release_data_dependent_epsilon(votes, answered, rng=np.random.default_rng(3), **kwargs)
    assert release.rdp_released == pytest.approx(max(0.0, exact + ss * (shift + scale * sigma_ss * z)), rel=1e-12)
    assert release.rdp_gnss == pss.gnss_rdp(beta, sigma_ss, order) and release.delta0 == delta0
    assert release.epsilon == pytest.approx(release.rdp_released + release.rdp_gnss + math.log(1 / delta) / (order - 1))


def test_the_upper_bound_factors_put_the_release_below_the_cost_with_probability_delta0():
    """k / (c sigma_ss) = Phi^{-1}(1 - delta0) and c = 1 + k (e^beta - 1): the shift is z standard deviations of
    the release's own noise, and that noise is scaled by a smooth bound on the shifted function's sensitivity."""
    from scipy.stats import norm

    for beta, sigma_ss, delta0 in ((0.01, 10.0, 1e-6), (0.02, 1.0, 0.05), (0.001, 30.0, 1e-9)):
        shift, scale = pss.upper_bound_factors(beta, sigma_ss, delta0)
        assert scale == pytest.approx(1 + shift * math.expm1(beta), rel=1e-12)
        assert norm.sf(shift / (scale * sigma_ss)) == pytest.approx(delta0, rel=1e-6)
    with pytest.raises(ConfigError, match="must be below 1"):
        pss.upper_bound_factors(0.04, 10.0, 1e-6)  # z sigma_ss (e^beta - 1) = 1.9: no finite shift


def test_release_noise_is_the_shifted_cost_with_the_smooth_bound_scale():
    votes, answered = [[45, 5], [30, 20], [50, 0]], np.array([True, False, True])
    kwargs = dict(teachers=50, threshold=40, sigma1=5.0, sigma2=10.0, order=5.0, beta=0.08)
    exact = dd.data_dependent_epsilon(votes, 40, 5.0, 10.0, 1e-5, orders=[5.0], answered=answered).rdp[0]
    ss = pss.smooth_sensitivity(votes, answered, **kwargs)
    sigma_ss, delta0 = 0.5, 0.2
    shift, scale = pss.upper_bound_factors(0.08, sigma_ss, delta0)
    assert exact > 4 * ss * scale * sigma_ss  # far from the clip at 0
    rng = np.random.default_rng(11)
    draws = np.array([pss.release_data_dependent_epsilon(votes, answered, delta=1e-5, sigma_ss=sigma_ss,
                                                         delta0=delta0, rng=rng, **kwargs).rdp_released
                      for _ in range(300)])
    assert draws.mean() == pytest.approx(exact + shift * ss, abs=4 * scale * sigma_ss * ss / math.sqrt(300))
    assert draws.std() == pytest.approx(scale * sigma_ss * ss, rel=0.15)


def test_release_refuses_parameters_outside_the_analysis():
    with pytest.raises(ConfigError, match="C6"):
        pss.release_data_dependent_epsilon(CONSENSUS, np.ones(8, bool), teachers=200, threshold=180, sigma1=1.0,
                                           sigma2=20.0, delta=1e-6, order=20.0, beta=0.02, sigma_ss=1.0,
                                           delta0=1e-7, rng=np.random.default_rng(0))
    with pytest.raises(ConfigError, match="answered"):
        pss.release_data_dependent_epsilon(CONSENSUS, [True], teachers=200, threshold=180, sigma1=1.0, sigma2=20.0,
                                           delta=1e-6, order=10.0, beta=0.04, sigma_ss=1.0,
                                           delta0=1e-7, rng=np.random.default_rng(0))
    with pytest.raises(ConfigError, match="teachers"):
        pss.release_data_dependent_epsilon(CONSENSUS, np.ones(8, bool), teachers=100, threshold=80, sigma1=1.0,
                                           sigma2=20.0, delta=1e-6, order=10.0, beta=0.04, sigma_ss=1.0,
                                           delta0=1e-7, rng=np.random.default_rng(0))
