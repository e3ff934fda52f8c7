"""PromptPATE's data-independent accounting: the sensitivities of Confident-GNMax, its plan's
epsilon against dp-accounting's accountants and the exact Gaussian composition, and the ledger."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting.dp_event import (
    ComposedDpEvent,
    GaussianDpEvent,
    PoissonSampledDpEvent,
    SelfComposedDpEvent,
)
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from scipy.optimize import brentq
from scipy.special import log_ndtr
from scipy.stats import norm

from dpcore.errors import ConfigError
from dpcore.pate.privacy import (
    THRESHOLD_SENSITIVITY,
    VOTE_SENSITIVITY,
    data_independent_epsilon,
    labelling_checkpoints,
    max_queries_within,
    pate_plan,
    pate_spends,
)
from dpcore.privacy import composition
from dpcore.privacy.ledger import Ledger
from tasks.charge import charge_plans


def _histogram(votes, classes: int) -> np.ndarray:
    return np.bincount(np.asarray(votes, dtype=int), minlength=classes)


def _neighbours(votes, classes: int):
    """Vote vectors of neighbouring datasets: one record is in one teacher only, so removing or
    adding it changes that teacher's vote to any class, or removes the teacher altogether."""
    for i in range(len(votes)):
        yield votes[:i] + votes[i + 1:]
        for c in range(classes):
            if c != votes[i]:
                yield votes[:i] + (c,) + votes[i + 1:]


@pytest.mark.parametrize("teachers, classes", [(4, 3), (5, 2), (3, 4)])
def test_sensitivities_by_brute_force(teachers, classes):
    worst_max, worst_l2 = 0.0, 0.0
    for votes in itertools.product(range(classes), repeat=teachers):
        n = _histogram(votes, classes)
        for other in _neighbours(votes, classes):
            m = _histogram(other, classes)
            worst_max = max(worst_max, abs(float(n.max() - m.max())))
            worst_l2 = max(worst_l2, float(np.linalg.norm(n - m)))
    assert worst_max == THRESHOLD_SENSITIVITY  # attained, never exceeded
    assert worst_l2 == pytest.approx(VOTE_SENSITIVITY, abs=1e-12)


def test_spends_are_gaussian_on_all_data_with_the_sensitivities():
    threshold, votes = pate_spends(2.0, 20.0, 300)
    assert (threshold.mechanism, threshold.sampling_rate, threshold.steps, threshold.purpose) == \
        ("gaussian", 1.0, 300, "pate")
    assert threshold.noise_multiplier == 2.0
    assert (votes.mechanism, votes.sampling_rate, votes.steps) == ("gaussian", 1.0, 300)
    assert votes.noise_multiplier == pytest.approx(20.0 / math.sqrt(2))
    assert threshold.event == SelfComposedDpEvent(PoissonSampledDpEvent(1.0, GaussianDpEvent(2.0)), 300)


def _exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """Epsilon at delta of a Gaussian mechanism with mu = sensitivity / std (Balle and Wang 2018,
    Theorem 8): delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    def gap(eps):
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps + log_ndtr(-mu / 2 - eps / mu)) - delta
    return brentq(gap, 0.0, 10 * mu * mu + 100)


@pytest.mark.parametrize("sigma1, sigma2, queries", [(40.0, 56.0, 50), (5.0, 20.0, 100), (30.0, 100.0, 300)])
def test_plan_epsilon_agrees_with_dp_accounting_and_exact_gaussian(sigma1, sigma2, queries):
    delta = 1e-6
    plan = pate_plan(epsilon_target=None, delta=delta, queries=queries, threshold_sigma=sigma1, vote_sigma=sigma2,
                     teachers=200, threshold=180)
    ours = plan.composed().epsilon
    assert ours == data_independent_epsilon(sigma1, sigma2, queries, delta) == plan.epsilon
    m1, m2 = sigma1 / THRESHOLD_SENSITIVITY, sigma2 / VOTE_SENSITIVITY
    plain = ComposedDpEvent([SelfComposedDpEvent(GaussianDpEvent(m1), queries),
                             SelfComposedDpEvent(GaussianDpEvent(m2), queries)])
    # sampling at q = 1 is the plain Gaussian: the same composition
    assert composition.compose([plain], delta).epsilon == pytest.approx(ours, rel=1e-9)
    pld, rdp = PLDAccountant(), RdpAccountant()
    pld.compose(plain)
    rdp.compose(plain)
    assert ours == pytest.approx(pld.get_epsilon(delta), rel=0.02)
    assert ours <= rdp.get_epsilon(delta) <= 1.15 * ours  # RDP's conversion is looser, never tighter
    # Gaussians compose exactly into one Gaussian with mu^2 = Q (1/m1^2 + 1/m2^2): ours is an upper bound, tight
    exact = _exact_gaussian_epsilon(math.sqrt(queries * (m1 ** -2 + m2 ** -2)), delta)
    assert exact * (1 - 1e-3) <= ours <= exact * 1.03


def test_plan_charge_equals_its_composition(tmp_path, monkeypatch):
    monkeypatch.setenv("DPICL_HOME", str(tmp_path))
    plan = pate_plan(epsilon_target=None, delta=1e-6, queries=200, threshold_sigma=30.0, vote_sigma=60.0,
                     teachers=200, threshold=150)
    summary = charge_plans("ds", "hash", "run-1", [plan])
    assert summary["charged"] == 2
    assert Ledger().spend("ds", delta=1e-6).epsilon == pytest.approx(plan.composed().epsilon, rel=1e-9)
    assert plan.parameters["epsilon_data_independent"] == pytest.approx(plan.composed().epsilon, rel=1e-9)
    assert {k: plan.parameters[k] for k in ("teachers", "threshold", "sigma1", "sigma2", "queries")} == \
        {"teachers": 200, "threshold": 150.0, "sigma1": 30.0, "sigma2": 60.0, "queries": 200}


def test_target_epsilon_stops_labelling_at_the_budget():
    delta, sigma1, sigma2, target = 1e-6, 5.0, 20.0, 3.0
    most = max_queries_within(target, delta, sigma1, sigma2)
    assert most >= 1
    assert data_independent_epsilon(sigma1, sigma2, most, delta) <= target
    assert data_independent_epsilon(sigma1, sigma2, most + 1, delta) > target
    plan = pate_plan(epsilon_target=target, delta=delta, queries=500, threshold_sigma=sigma1, vote_sigma=sigma2,
                     teachers=200, threshold=180)
    assert plan.parameters["queries"] == most < 500 == plan.parameters["queries_requested"]
    assert plan.epsilon == target and plan.composed().epsilon <= target
    small = pate_plan(epsilon_target=target, delta=delta, queries=3, threshold_sigma=sigma1, vote_sigma=sigma2,
                      teachers=200, threshold=180)
    assert small.parameters["queries"] == 3  # within the budget: all the queries asked
    assert max_queries_within(target, delta, sigma1, sigma2, limit=3) == 3
    with pytest.raises(ConfigError, match="--pate-target-epsilon"):
        pate_plan(epsilon_target=0.01, delta=delta, queries=10, threshold_sigma=1.0, vote_sigma=20.0, teachers=200,
                  threshold=180)


@pytest.mark.parametrize("kwargs, match", [
    (dict(threshold_sigma=0.0), "--pate-sigma1"),
    (dict(threshold_sigma=-1.0), "--pate-sigma1"),
    (dict(vote_sigma=0.0), "--pate-sigma2"),
    (dict(vote_sigma=math.nan), "--pate-sigma2"),
    (dict(threshold=201), "threshold"),
    (dict(threshold=-1), "threshold"),
    (dict(queries=0), "queries"),
    (dict(queries=2.5), "queries"),
    (dict(teachers=0), "teachers"),
    (dict(epsilon_target=0.0), "--pate-target-epsilon"),
    (dict(delta=0.0), "delta"),
])
def test_plan_rejects_bad_parameters(kwargs, match):
    values = dict(epsilon_target=None, delta=1e-6, queries=10, threshold_sigma=40.0, vote_sigma=40.0, teachers=200,
                  threshold=180) | kwargs
    with pytest.raises(ConfigError, match=match):
        pate_plan(**values)


@pytest.mark.parametrize("sigma", [0.8, 5.0, 40.0])
def test_composition_of_unsampled_gaussian_agrees_with_dp_accounting(sigma):
    """q = 1 (PoissonSampledDpEvent(1, ...)) is the plain Gaussian, and the one composition agrees with
    dp-accounting's RDP and PLD accountants on SelfComposedDpEvent(GaussianDpEvent(sigma), T)."""
    steps, delta = 100, 1e-6
    plain = SelfComposedDpEvent(GaussianDpEvent(sigma), steps)
    ours = composition.compose([SelfComposedDpEvent(PoissonSampledDpEvent(1.0, GaussianDpEvent(sigma)), steps)], delta)
    assert ours.epsilon == composition.compose([plain], delta).epsilon
    pld, rdp = PLDAccountant(), RdpAccountant()
    pld.compose(plain)
    rdp.compose(plain)
    assert ours.epsilon == pytest.approx(pld.get_epsilon(delta), rel=0.02)
    assert ours.epsilon <= rdp.get_epsilon(delta) <= 1.2 * ours.epsilon
    exact = _exact_gaussian_epsilon(math.sqrt(steps) / sigma, delta)
    assert exact * (1 - 1e-3) <= ours.epsilon <= exact * 1.03


# (sigma1, sigma2, queries, delta, epsilon): the data-independent Confident-GNMax figure of the PATE 2018
# analysis code (github.com/tensorflow/privacy at 03035d5, research/pate_2018/core.py:
# compute_rdp_data_independent_threshold + rdp_data_independent_gaussian per query, compute_eps_from_delta
# over the orders of ICLR2018/smooth_sensitivity_table.py), an RDP bound with the classical conversion.
PATE_2018_DATA_INDEPENDENT = [
    (1.0, 20.0, 8, 1e-6, 18.967755278982136),
    (5.0, 20.0, 10, 1e-6, 3.7519388197455337),
    (1.0, 50.0, 8, 1e-6, 18.917355278982136),
    (150.0, 40.0, 12, 1e-8, 0.7642578503907704),
]


@pytest.mark.parametrize("sigma1, sigma2, queries, delta, reference", PATE_2018_DATA_INDEPENDENT)
def test_data_independent_epsilon_is_within_the_pate_2018_rdp_figure(sigma1, sigma2, queries, delta, reference):
    # Same mechanisms and sensitivities; the PLD/PRV composition is tighter than RDP's conversion, not far off.
    ours = data_independent_epsilon(sigma1, sigma2, queries, delta)
    assert 0.75 * reference <= ours <= reference


def test_labelling_checkpoints_are_the_largest_prefixes_each_epsilon_affords():
    """A smaller epsilon's prefix: Q_i queries per repeat whose R x Q_i composition fits it and R x (Q_i + 1)
    does not; none where no query per repeat fits or where the whole labelling already does."""
    delta, repeats, queries = 1e-5, 3, 40
    full = data_independent_epsilon(4.0, 6.0, repeats * queries, delta)
    wanted = [0.05, 1.0, 2.5, full / 2, full, 2 * full, math.inf, 0.0]
    checkpoints = labelling_checkpoints(wanted, delta, 4.0, 6.0, repeats=repeats, queries=queries)
    assert [eps for eps, _, _ in checkpoints] == sorted(e for e in set(wanted) if 0 < e < full
                                                        and max_queries_within(e, delta, 4.0, 6.0) >= repeats)
    assert checkpoints and checkpoints[-1][0] == full / 2
    for eps, prefix, bound in checkpoints:
        assert 1 <= prefix < queries
        assert bound == data_independent_epsilon(4.0, 6.0, repeats * prefix, delta) <= eps
        assert data_independent_epsilon(4.0, 6.0, repeats * (prefix + 1), delta) > eps
