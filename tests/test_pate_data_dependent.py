"""Confident-GNMax's data-dependent RDP (Papernot et al. 2018) against the published analysis code.

Reference values: computed with the PATE 2018 analysis code of github.com/tensorflow/privacy
(snapshot at commit 03035d5), research/pate_2018/core.py: compute_logq_gaussian (Proposition 7),
rdp_gaussian (Theorem 6), compute_logpr_answered and compute_rdp_threshold (the threshold test),
rdp_data_independent_gaussian, compute_eps_from_delta; composed per query as in
research/pate_2018/ICLR2018/smooth_sensitivity_table.py (_compute_rdp: threshold cost plus
P[answered] x GNMax cost, the "expected" figure) and, for the "realized" figure, with GNMax's
cost counted on the answered queries only. Orders: that script's long list (REFERENCE_ORDERS).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.errors import ConfigError
from dpcore.pate import data_dependent as dd

REFERENCE_ORDERS = np.concatenate((np.arange(2, 100 + 1, .5), np.logspace(np.log10(100), np.log10(500), num=100)))

PAPERNOT_VOTES = [  # E = 250 teachers, 10 classes: multinomial votes of Dirichlet-drawn class probabilities
    [0, 48, 0, 0, 33, 0, 0, 0, 167, 2], [0, 0, 0, 0, 0, 168, 36, 46, 0, 0], [0, 0, 0, 0, 2, 37, 93, 0, 118, 0],
    [0, 0, 175, 0, 45, 8, 0, 22, 0, 0], [2, 1, 2, 16, 3, 5, 14, 106, 12, 89], [0, 56, 0, 0, 8, 177, 0, 0, 0, 9],
    [1, 7, 30, 6, 98, 0, 38, 10, 58, 2], [3, 2, 0, 245, 0, 0, 0, 0, 0, 0], [14, 6, 0, 0, 0, 0, 230, 0, 0, 0],
    [0, 0, 0, 32, 0, 203, 15, 0, 0, 0], [36, 2, 52, 33, 53, 12, 30, 26, 6, 0], [0, 0, 0, 0, 0, 10, 209, 31, 0, 0],
]

# name: (votes, T, sigma1, sigma2, delta, answered mask,
#        (expected epsilon, its order, expected answered), (realized epsilon, its order))
SEQUENCES = {
    "clear consensus, Duan et al. Table 7 (SST-2)": (
        [[200, 0], [198, 2], [195, 5], [190, 10], [185, 15], [199, 1], [193, 7], [188, 12]], 180, 1.0, 20.0, 1e-6,
        [True] * 8, (5.590475635318162, 4.0, 7.999999713348427), (5.590475635318163, 4.0)),
    "split flock, nothing answered": (
        [[60, 50, 45, 45], [80, 70, 30, 20], [100, 60, 25, 15], [52, 50, 49, 49], [120, 40, 20, 20],
         [70, 70, 30, 30]], 180, 1.0, 20.0, 1e-6,
        [False] * 6, (0.4683223924258005, 30.5, 0.0), (0.4683223924258005, 30.5)),
    "mixed, Duan et al. Table 7 (AG News)": (
        [[181, 9, 5, 5], [150, 30, 10, 10], [200, 0, 0, 0], [179, 21, 0, 0], [100, 100, 0, 0], [190, 4, 3, 3],
         [175, 10, 10, 5], [60, 50, 45, 45], [183, 17, 0, 0], [196, 2, 1, 1]], 180, 5.0, 20.0, 1e-6,
        [True, False, True, True, False, True, False, False, True, True],
        (2.5901743179530943, 10.5, 4.860933196040043), (2.5901743654323393, 10.5)),
    "Claude flock of 400 with 'other', Duan et al. Table 7": (
        [[398, 2, 0], [395, 3, 2], [392, 8, 0], [385, 10, 5], [399, 1, 0], [300, 90, 10], [391, 5, 4],
         [400, 0, 0]], 390, 1.0, 50.0, 1e-6,
        [True, True, True, False, True, False, True, True], (9.540841127232468, 3.5, 5.818594614120363),
        (9.540841130400334, 3.5)),
    "Papernot et al. SVHN-like setting": (
        PAPERNOT_VOTES, 200, 150.0, 40.0, 1e-8,
        [False] * 7 + [True, True, True, False, True], (0.46576030949874236, 63.5, 4.899962616496437),
        (0.4010568827741853, 62.0)),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_epsilon_matches_the_published_analysis_code(name):
    votes, t, sigma1, sigma2, delta, mask, expected, realized = SEQUENCES[name]
    report = dd.data_dependent_epsilon(votes, t, sigma1, sigma2, delta, orders=REFERENCE_ORDERS)
    assert report.expected and report.queries == len(votes)
    assert report.epsilon == pytest.approx(expected[0], rel=1e-9)
    assert report.order == expected[1]
    assert report.answered == pytest.approx(expected[2], rel=1e-9, abs=1e-12)
    real = dd.data_dependent_epsilon(votes, t, sigma1, sigma2, delta, orders=REFERENCE_ORDERS,
                                     answered=np.array(mask))
    assert not real.expected and real.answered == sum(mask)
    assert real.epsilon == pytest.approx(realized[0], rel=1e-9)
    assert real.order == realized[1]
    np.testing.assert_allclose(real.rdp, real.rdp_threshold + real.rdp_gnmax)


# (counts, sigma2, log q, RDP at orders 2, 10, 50): core.compute_logq_gaussian and core.rdp_gaussian
GNMAX_REFERENCE = [
    ([198, 2], 20.0, -26.8845852087295, [2.866841544999523e-12, 2.6679066186442803e-11, 0.004681554628158296]),
    ([120, 40, 20, 20], 20.0, -5.897675702868498, [0.001508977787382623, 0.0031739821294730543, 0.125]),
    ([181, 9, 5, 5], 20.0, -20.640850324520468, [1.2490319978495825e-09, 7.863479555323e-09, 0.038869972535326605]),
    ([300, 90, 10], 50.0, -6.495458713693627, [0.0003241477608434337, 0.00041451191719389034, 0.004290051202891108]),
    ([100, 100, 0, 0], 20.0, -0.6923336075653331, [0.005, 0.025, 0.125]),
]
# (T, sigma1, max count, log P[answered], RDP at orders 2, 10, 50): core.compute_logpr_answered, compute_rdp_threshold
THRESHOLD_REFERENCE = [
    (180, 1.0, 185, -2.8665161296376294e-07, [0.00015588462339803498, 4.999999999999999, 24.999999999999993]),
    (180, 1.0, 179, -1.8410216450092634, [0.9999999999999998, 4.999999999999999, 24.999999999999993]),
    (180, 5.0, 178, -1.0654340491895766, [0.039999999999999994, 0.19999999999999998, 0.9999999999999999]),
    (200, 150.0, 160, -0.929216636437402, [4.4444444444444447e-05, 0.00022222222222222223, 0.0011111111111111111]),
    (180, 1.0, 180, -0.6931471805599453, [0.9999999999999998, 4.999999999999999, 24.999999999999993]),
]


@pytest.mark.parametrize("counts, sigma2, log_q, rdp", GNMAX_REFERENCE)
def test_gnmax_bound_matches_reference(counts, sigma2, log_q, rdp):
    assert dd.log_q_gnmax(counts, sigma2) == pytest.approx(log_q, rel=1e-12)
    np.testing.assert_allclose(dd.rdp_from_log_q(log_q, sigma2, [2.0, 10.0, 50.0]), rdp, rtol=1e-9)


@pytest.mark.parametrize("t, sigma1, top, log_p, rdp", THRESHOLD_REFERENCE)
def test_threshold_bound_matches_reference(t, sigma1, top, log_p, rdp):
    assert dd.log_pr_answered([top, 0], t, sigma1) == pytest.approx(log_p, rel=1e-12)
    np.testing.assert_allclose(dd.rdp_threshold(log_p, sigma1, [2.0, 10.0, 50.0]), rdp, rtol=1e-9)


def test_data_dependent_never_exceeds_data_independent():
    rng = np.random.default_rng(0)
    orders = dd.DEFAULT_ORDERS
    for _ in range(50):
        counts = rng.multinomial(200, rng.dirichlet(np.full(4, 0.3)))
        for sigma in (5.0, 20.0, 50.0):
            curve = dd.rdp_from_log_q(dd.log_q_gnmax(counts, sigma), sigma, orders)
            assert np.all(curve >= 0) and np.all(curve <= dd.rdp_gaussian_data_independent(sigma, orders) + 1e-15)
    # a unanimous flock with little noise costs (almost) nothing, a tie costs the data-independent bound
    assert dd.rdp_from_log_q(dd.log_q_gnmax([200, 0, 0], 5.0), 5.0, [10.0])[0] < 1e-12
    assert dd.rdp_from_log_q(dd.log_q_gnmax([100, 100], 20.0), 20.0, [10.0])[0] == pytest.approx(10 / 400)


def test_q_bound_holds_for_noisy_argmax_by_simulation():
    """Proposition 7 bounds the probability that GNMax's noisy argmax is not the true argmax."""
    rng = np.random.default_rng(1)
    for counts, sigma in (([120, 40, 20, 20], 20.0), ([100, 90, 10], 10.0), ([60, 50, 45, 45], 5.0)):
        counts = np.array(counts, dtype=float)
        noisy = counts + rng.normal(0.0, sigma, size=(200_000, counts.size))
        flipped = np.mean(np.argmax(noisy, axis=1) != np.argmax(counts))
        assert flipped <= math.exp(dd.log_q_gnmax(counts, sigma)) + 4 * math.sqrt(flipped / 200_000) + 1e-4
        p = math.exp(dd.log_pr_answered(counts, 110, sigma))  # the threshold's answer probability is exact
        answered = np.mean(counts.max() + rng.normal(0.0, sigma, size=200_000) >= 110)
        assert answered == pytest.approx(p, abs=5 * math.sqrt(p * (1 - p) / 200_000) + 1e-4)


def test_report_is_read_only():
    report = dd.data_dependent_epsilon([[190, 10]], 180, 1.0, 20.0, 1e-6)
    with pytest.raises(ValueError):
        report.rdp[0] = 0.0
    assert report.epsilon > 0 and report.order in report.orders


@pytest.mark.parametrize("kwargs, match", [
    (dict(vote_histograms=[[200]]), "vote_histograms"),
    (dict(vote_histograms=[[200, -1]]), "vote_histograms"),
    (dict(sigma1=0.0), "sigma1"),
    (dict(sigma2=-2.0), "sigma2"),
    (dict(delta=0.0), "delta"),
    (dict(orders=[1.0, 2.0]), "orders"),
    (dict(answered=[True]), "answered"),
    (dict(threshold=math.inf), "threshold"),
])
def test_bad_input_is_refused(kwargs, match):
    values = dict(vote_histograms=[[190, 10], [100, 100]], threshold=180, sigma1=1.0, sigma2=20.0, delta=1e-6) | kwargs
    with pytest.raises(ConfigError, match=match):
        dd.data_dependent_epsilon(**values)
